//! Target fingerprints: what machine a tuning record was measured on.
//!
//! A [`TargetFingerprint`] names the architecture, the best ISA class the kernels may assume
//! (the tuning cache keeps one file per class), the detected CPU features, the CPU model and the
//! core count. Records measured on an identical fingerprint are preferred; records from another
//! machine of the same ISA class are still usable (see [`TargetFingerprint::is_compatible`]).

use super::Variant;
use serde::{Deserialize, Serialize};

/// The ISA class of CUDA devices of compute capability `cc`: `"cuda-sm_90"` for `(9, 0)`.
pub fn cuda_class(cc: (u32, u32)) -> String {
    format!("cuda-sm_{}{}", cc.0, cc.1)
}

/// The compute capability of a CUDA ISA class (`"cuda-sm_90"` gives `(9, 0)`).
pub fn cuda_capability(class: &str) -> Option<(u32, u32)> {
    let digits = class.strip_prefix("cuda-sm_")?;
    let (major, minor) = digits.split_at(digits.len().checked_sub(1)?);
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Identifies the machine (or the class of machines) a schedule was tuned for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TargetFingerprint {
    /// The architecture, spelled as [`std::env::consts::ARCH`] spells it (`"x86_64"`,
    /// `"aarch64"`, ...).
    pub arch: String,
    /// The best ISA class the machine supports: `"x86_64-avx512"`, `"x86_64-avx2"`,
    /// `"x86_64-baseline"`, `"aarch64-neon"`, or `"<arch>-baseline"`.
    pub isa_class: String,
    /// The detected CPU features, in a fixed order (empty when not probed).
    pub features: Vec<String>,
    /// The CPU model name, or `"unknown"`.
    pub cpu_model: String,
    /// The number of cores available to the process (at least 1).
    pub cores: usize,
}

impl TargetFingerprint {
    /// Probes the running machine: architecture, CPU features, CPU model (from `/proc/cpuinfo`
    /// where readable) and available parallelism.
    ///
    /// In a build script this describes the *build* machine; when cross-compiling use
    /// [`TargetFingerprint::for_target_triple`] instead.
    pub fn host() -> Self {
        let arch = std::env::consts::ARCH.to_string();
        let features = host_features();
        let isa_class = isa_class_for(&arch, &features);
        let cpu_model = host_cpu_model().unwrap_or_else(|| "unknown".to_string());
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        TargetFingerprint {
            arch,
            isa_class,
            features,
            cpu_model,
            cores,
        }
    }

    /// This machine as a lower ISA class presents it: `isa` is what `HARL_ISA` says
    /// (`"avx2"`, `"baseline"`), under which the runtime dispatches to that class's variant, so
    /// a build tunes and records that variant (AVX2 records made on an AVX-512 machine). The
    /// features the class lacks are dropped. A class at or above this one, or any other value,
    /// leaves the fingerprint as it is.
    pub fn capped_at(mut self, isa: &str) -> Self {
        let (cap, keeps): (Variant, fn(&str) -> bool) = match isa {
            "avx2" => (Variant::Avx2, |f| !f.starts_with("avx512")),
            "baseline" => (Variant::Base, |f| {
                !(f.starts_with("avx") || f == "fma" || f == "f16c")
            }),
            _ => return self,
        };
        // `Variant::ALL` runs from the highest class down.
        let rank = |v: Variant| Variant::ALL.iter().position(|&x| x == v);
        let lower =
            Variant::for_isa_class(&self.isa_class).is_some_and(|own| rank(cap) > rank(own));
        if self.arch == "x86_64" && lower {
            self.isa_class = cap.isa_class(&self.arch);
            self.features.retain(|f| keeps(f));
        }
        self
    }

    /// A fingerprint for a cross-compilation target, without probing the host: the architecture
    /// comes from the triple's first component (normalized to [`std::env::consts::ARCH`]'s
    /// spelling, e.g. `i686` → `x86`, `armv7` → `arm`), the ISA class is `"<arch>-baseline"`, no
    /// features, CPU model `"unknown"` and 1 core.
    pub fn for_target_triple(triple: &str) -> Self {
        let arch = normalize_arch(triple.split('-').next().unwrap_or(""));
        TargetFingerprint {
            isa_class: format!("{arch}-baseline"),
            arch,
            features: Vec::new(),
            cpu_model: "unknown".to_string(),
            cores: 1,
        }
    }

    /// The fingerprint of a CUDA device: arch `"cuda"`, ISA class `"cuda-sm_<major><minor>"`
    /// (records are shared by devices of one compute capability, in `cuda-sm_90.jsonl` and so
    /// on), features `["cuda-driver-<version>"]`, the device name as the model, its
    /// multiprocessor count as the cores. An exact match is the same device, capability and
    /// driver version.
    pub fn cuda(device: &str, cc: (u32, u32), driver_version: i32, multiprocessors: usize) -> Self {
        TargetFingerprint {
            arch: "cuda".into(),
            isa_class: cuda_class(cc),
            features: vec![format!("cuda-driver-{driver_version}")],
            cpu_model: device.to_string(),
            cores: multiprocessors.max(1),
        }
    }

    /// Whether a schedule tuned for `other` may be used on `self`: both have the same ISA class.
    pub fn is_compatible(&self, other: &TargetFingerprint) -> bool {
        self.isa_class == other.isa_class
    }

    /// Whether the feature `name` (e.g. `"avx2"`) was detected.
    pub fn has_feature(&self, name: &str) -> bool {
        self.features.iter().any(|f| f == name)
    }
}

/// Maps a triple's architecture component to [`std::env::consts::ARCH`]'s spelling.
fn normalize_arch(raw: &str) -> String {
    let arch = match raw {
        "" => "unknown",
        "i386" | "i486" | "i586" | "i686" | "x86" => "x86",
        "amd64" => "x86_64",
        a if a.starts_with("arm64") => "aarch64",
        a if a.starts_with("aarch64") => "aarch64",
        a if a.starts_with("armeb") => "arm",
        a if a.starts_with("arm") || a.starts_with("thumb") => "arm",
        a if a.starts_with("riscv64") => "riscv64",
        a if a.starts_with("riscv32") => "riscv32",
        a => a,
    };
    arch.to_string()
}

/// The best ISA class for `arch` given the detected `features`.
fn isa_class_for(arch: &str, features: &[String]) -> String {
    let has = |name: &str| features.iter().any(|f| f == name);
    match arch {
        "x86_64" if has("avx512f") && has("avx512vl") && has("avx2") && has("fma") => {
            "x86_64-avx512".to_string()
        }
        "x86_64" if has("avx2") && has("fma") => "x86_64-avx2".to_string(),
        "aarch64" if has("neon") => "aarch64-neon".to_string(),
        other => format!("{other}-baseline"),
    }
}

/// Detects the CPU features harl cares about, in a fixed order.
fn host_features() -> Vec<String> {
    #[allow(unused_mut)]
    let mut features: Vec<&'static str> = Vec::new();
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        macro_rules! probe {
            ($($name:tt),* $(,)?) => {
                $(
                    if std::arch::is_x86_feature_detected!($name) {
                        features.push($name);
                    }
                )*
            };
        }
        probe!(
            "sse2",
            "sse3",
            "ssse3",
            "sse4.1",
            "sse4.2",
            "popcnt",
            "avx",
            "f16c",
            "fma",
            "bmi1",
            "bmi2",
            "avx2",
            "avx512f",
            "avx512cd",
            "avx512bw",
            "avx512dq",
            "avx512vl",
            "avx512vnni",
            "avx512bf16",
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($name:tt),* $(,)?) => {
                $(
                    if std::arch::is_aarch64_feature_detected!($name) {
                        features.push($name);
                    }
                )*
            };
        }
        probe!("neon", "fp16", "dotprod", "i8mm", "bf16", "sve", "sve2");
    }
    features.into_iter().map(str::to_string).collect()
}

/// The `model name` line of `/proc/cpuinfo`, where readable.
fn host_cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpu_model_from_cpuinfo(&text)
}

/// Extracts the first non-empty `model name` value from `/proc/cpuinfo` text.
fn cpu_model_from_cpuinfo(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        let value = value.trim();
        (key.trim() == "model name" && !value.is_empty()).then(|| value.to_string())
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn cuda_classes_round_trip() {
        assert_eq!(cuda_class((9, 0)), "cuda-sm_90");
        assert_eq!(cuda_capability("cuda-sm_90"), Some((9, 0)));
        assert_eq!(cuda_capability("cuda-sm_120"), Some((12, 0)));
        assert_eq!(cuda_capability("x86_64-avx512"), None);
        assert_eq!(cuda_capability("cuda-sm_"), None);
        let fp = TargetFingerprint::cuda("NVIDIA H200", (9, 0), 12090, 132);
        assert_eq!(fp.isa_class, "cuda-sm_90");
        assert_eq!(fp.features, ["cuda-driver-12090"]);
    }
    use super::*;

    #[test]
    fn host_is_consistent() {
        let host = TargetFingerprint::host();
        assert_eq!(host.arch, std::env::consts::ARCH);
        assert!(host.cores >= 1);
        assert!(!host.cpu_model.is_empty());
        assert!(host.isa_class.starts_with(&format!("{}-", host.arch)));
        assert_eq!(host.isa_class, isa_class_for(&host.arch, &host.features));
        // Probing twice gives the same fingerprint.
        assert_eq!(host, TargetFingerprint::host());
        #[cfg(target_arch = "x86_64")]
        {
            assert!(host.has_feature("sse2"));
            let expected = if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                "x86_64-avx512"
            } else if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                "x86_64-avx2"
            } else {
                "x86_64-baseline"
            };
            assert_eq!(host.isa_class, expected);
        }
    }

    #[test]
    fn a_fingerprint_caps_only_downwards() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let avx512 = TargetFingerprint {
            arch: "x86_64".into(),
            isa_class: "x86_64-avx512".into(),
            features: f(&["sse4.2", "avx", "fma", "avx2", "avx512f", "avx512vl"]),
            cpu_model: "m".into(),
            cores: 2,
        };
        let avx2 = avx512.clone().capped_at("avx2");
        assert_eq!(avx2.isa_class, "x86_64-avx2");
        assert_eq!(avx2.features, f(&["sse4.2", "avx", "fma", "avx2"]));
        assert_eq!(avx2.isa_class, isa_class_for("x86_64", &avx2.features));
        let base = avx512.clone().capped_at("baseline");
        assert_eq!(base.isa_class, "x86_64-baseline");
        assert_eq!(base.features, f(&["sse4.2"]));
        // Never raised, and unknown values change nothing.
        assert_eq!(avx2.clone().capped_at("avx512"), avx2);
        assert_eq!(base.clone().capped_at("avx2"), base);
        assert_eq!(avx512.clone().capped_at("AVX2"), avx512);
        let arm = TargetFingerprint {
            arch: "aarch64".into(),
            isa_class: "aarch64-neon".into(),
            ..avx512.clone()
        };
        assert_eq!(arm.clone().capped_at("baseline"), arm);
    }

    #[test]
    fn isa_classes() {
        let f = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            isa_class_for("x86_64", &f(&["avx2", "fma", "avx512f", "avx512vl"])),
            "x86_64-avx512"
        );
        // The runtime's AVX-512 variant needs VL too: without it the class is AVX2.
        assert_eq!(
            isa_class_for("x86_64", &f(&["avx2", "fma", "avx512f"])),
            "x86_64-avx2"
        );
        assert_eq!(isa_class_for("x86_64", &f(&["avx2", "fma"])), "x86_64-avx2");
        assert_eq!(isa_class_for("x86_64", &f(&["avx2"])), "x86_64-baseline");
        assert_eq!(isa_class_for("x86_64", &[]), "x86_64-baseline");
        assert_eq!(isa_class_for("aarch64", &f(&["neon"])), "aarch64-neon");
        assert_eq!(isa_class_for("aarch64", &[]), "aarch64-baseline");
        assert_eq!(isa_class_for("riscv64", &[]), "riscv64-baseline");
    }

    #[test]
    fn target_triples() {
        let t = TargetFingerprint::for_target_triple("x86_64-unknown-linux-gnu");
        assert_eq!(t.arch, "x86_64");
        assert_eq!(t.isa_class, "x86_64-baseline");
        assert!(t.features.is_empty());
        assert_eq!(t.cpu_model, "unknown");
        assert_eq!(t.cores, 1);
        let arch = |triple: &str| TargetFingerprint::for_target_triple(triple).arch;
        assert_eq!(arch("aarch64-apple-darwin"), "aarch64");
        assert_eq!(arch("i686-pc-windows-msvc"), "x86");
        assert_eq!(arch("armv7-unknown-linux-gnueabihf"), "arm");
        assert_eq!(arch("thumbv7em-none-eabihf"), "arm");
        assert_eq!(arch("riscv64gc-unknown-linux-gnu"), "riscv64");
        assert_eq!(arch("wasm32-unknown-unknown"), "wasm32");
        assert_eq!(arch(""), "unknown");
        assert_eq!(
            TargetFingerprint::for_target_triple("aarch64-linux-android").isa_class,
            "aarch64-baseline"
        );
    }

    #[test]
    fn compatibility_is_same_isa_class() {
        let a = TargetFingerprint {
            arch: "x86_64".into(),
            isa_class: "x86_64-avx2".into(),
            features: vec!["avx2".into(), "fma".into()],
            cpu_model: "A".into(),
            cores: 8,
        };
        let b = TargetFingerprint {
            cpu_model: "B".into(),
            cores: 2,
            ..a.clone()
        };
        assert!(a.is_compatible(&b));
        assert_ne!(a, b);
        let c = TargetFingerprint::for_target_triple("x86_64-unknown-linux-gnu");
        assert!(!a.is_compatible(&c));
    }

    #[test]
    fn cpuinfo_parsing() {
        let text = "processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU @ 3.0GHz\n";
        assert_eq!(
            cpu_model_from_cpuinfo(text).as_deref(),
            Some("Some CPU @ 3.0GHz")
        );
        assert_eq!(cpu_model_from_cpuinfo("processor : 0\n"), None);
        assert_eq!(cpu_model_from_cpuinfo("model name :   \n"), None);
    }

    #[test]
    fn serde_round_trip() {
        let host = TargetFingerprint::host();
        let json = serde_json::to_string(&host).unwrap();
        let back: TargetFingerprint = serde_json::from_str(&json).unwrap();
        assert_eq!(host, back);
    }
}

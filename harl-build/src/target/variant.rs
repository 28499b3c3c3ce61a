//! The ISA variants a kernel is emitted in, what each assumes of the CPU, and which tuning
//! records apply to it.

use super::CpuTarget;

const X86: &str = "#[cfg(any(target_arch = \"x86\", target_arch = \"x86_64\"))]";

/// One ISA variant of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// x86-64 with AVX-512F/VL, AVX2 and FMA.
    Avx512,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// Everything else (FMA on aarch64, where NEON always has it).
    Base,
}

impl Variant {
    /// All variants, best first.
    pub const ALL: [Variant; 3] = [Variant::Avx512, Variant::Avx2, Variant::Base];

    /// The submodule name, also the label in `SCHEDULE_SOURCES`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Avx512 => "avx512",
            Variant::Avx2 => "avx2",
            Variant::Base => "base",
        }
    }

    /// The tuning-cache ISA class whose records apply to this variant on `arch`.
    pub fn isa_class(self, arch: &str) -> String {
        match (self, arch) {
            (Variant::Avx512, _) => "x86_64-avx512".into(),
            (Variant::Avx2, _) => "x86_64-avx2".into(),
            (Variant::Base, "aarch64") => "aarch64-neon".into(),
            (Variant::Base, a) => format!("{a}-baseline"),
        }
    }

    /// What the default schedule plans for in this variant.
    pub fn cpu_target(self, arch: &str, threads: usize) -> CpuTarget {
        let (vector_bytes, acc_registers, vector_registers) = match (self, arch) {
            (Variant::Avx512, _) => (64, 16, 32),
            (Variant::Avx2, _) => (32, 12, 16),
            (Variant::Base, "aarch64") => (16, 24, 32),
            (Variant::Base, _) => (16, 12, 16),
        };
        CpuTarget {
            vector_bytes,
            acc_registers,
            vector_registers,
            threads,
        }
    }

    pub(crate) fn cfg(self) -> &'static str {
        match self {
            Variant::Base => "",
            _ => X86,
        }
    }

    pub(crate) fn target_feature(self) -> &'static str {
        match self {
            Variant::Avx512 => "#[target_feature(enable = \"avx512f,avx512vl,avx2,fma\")]\n",
            Variant::Avx2 => "#[target_feature(enable = \"avx2,fma\")]\n",
            Variant::Base => "",
        }
    }

    /// Whether `harl::runtime::math` vectorises here (a Rust expression, like [`Self::fma`]):
    /// with AVX2 or AVX-512, and on aarch64 (NEON); not on x86 without AVX2, where libm wins.
    pub(crate) fn vector_math(self) -> &'static str {
        match self {
            Variant::Base => "cfg!(target_arch = \"aarch64\")",
            _ => "true",
        }
    }

    pub(crate) fn fma(self) -> &'static str {
        match self {
            Variant::Base => "cfg!(target_arch = \"aarch64\")",
            _ => "true",
        }
    }

    pub(crate) fn isa(self) -> &'static str {
        match self {
            Variant::Avx512 => "::harl::runtime::Isa::Avx512",
            Variant::Avx2 => "::harl::runtime::Isa::Avx2",
            Variant::Base => "_",
        }
    }
}

impl Variant {
    /// The variant whose records the tuning-cache ISA class `class` holds.
    pub fn for_isa_class(class: &str) -> Option<Variant> {
        match class {
            "x86_64-avx512" => Some(Variant::Avx512),
            "x86_64-avx2" => Some(Variant::Avx2),
            c if c.ends_with("-baseline") || c == "aarch64-neon" => Some(Variant::Base),
            _ => None,
        }
    }

    /// The best variant this machine runs (its fingerprint's ISA class).
    pub fn host() -> Variant {
        Variant::for_isa_class(&super::TargetFingerprint::host().isa_class).unwrap_or(Variant::Base)
    }
}

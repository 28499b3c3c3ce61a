//! Weights files of imported models (`harl_build::Builder::onnx_with(.., ModelWeights::File)`).
//!
//! The build writes each model's weights (f32, little-endian, one tensor after another) behind
//! a 24-byte header: the magic `HARLWTS1`, the payload's [`fingerprint`] and its length in
//! bytes. The generated `Model` knows the fingerprint and length it was built with, so a file
//! from another model, another version of the model, or a truncated or damaged copy is a
//! [`KernelError::Weights`], never wrong numbers or a panic.

use crate::KernelError;
use std::path::Path;

/// The first 8 bytes of a weights file.
pub const MAGIC: &[u8; 8] = b"HARLWTS1";
/// Bytes before the payload: magic, fingerprint (u64 LE), payload length (u64 LE).
pub const HEADER_LEN: usize = 24;

/// A 64-bit hash of `payload`, eight bytes a step (fast enough to check a 340 MB file at load).
/// `harl-build` computes the same function when it writes the file; both crates test the same
/// known answers.
pub fn fingerprint(payload: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let step = |h: u64, w: u64| (h ^ w).wrapping_mul(PRIME).rotate_left(29);
    let mut words = payload.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ payload.len() as u64;
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = step(h, u64::from_le_bytes(b));
    }
    words
        .remainder()
        .iter()
        .fold(h, |h, &b| step(h, u64::from(b)))
}

/// The payload of a weights file's `bytes`, checked: the magic, the header's fingerprint and
/// length against what `model` was built with (`fingerprint`, `len`), and the payload's own
/// fingerprint.
pub fn payload<'a>(
    model: &'static str,
    bytes: &'a [u8],
    fingerprint: u64,
    len: usize,
) -> Result<&'a [u8], KernelError> {
    let bad = |why: String| KernelError::Weights { model, why };
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return Err(bad("not a harl weights file (no HARLWTS1 header)".into()));
    }
    let field = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let (stated, stated_len) = (field(8), field(16));
    if stated != fingerprint || stated_len != len as u64 {
        return Err(bad(format!(
            "the file holds weights {stated:016x} ({stated_len} bytes); this model was built with {fingerprint:016x} ({len} bytes): a file of another model or build"
        )));
    }
    let data = &bytes[HEADER_LEN..];
    if data.len() != len {
        return Err(bad(format!(
            "the file has {} bytes of weights, its header says {len}: truncated or padded",
            data.len()
        )));
    }
    if self::fingerprint(data) != fingerprint {
        return Err(bad(
            "the weights do not match their fingerprint: the file is damaged".into(),
        ));
    }
    Ok(data)
}

/// Reads the weights file at `path` whole (header included); check it with [`payload`].
pub fn read(model: &'static str, path: &Path) -> Result<Vec<u8>, KernelError> {
    std::fs::read(path).map_err(|e| KernelError::Weights {
        model,
        why: format!("cannot read {}: {e}", path.display()),
    })
}

/// The `len` f32 values at byte `offset` of a checked payload.
pub fn floats(
    model: &'static str,
    payload: &[u8],
    offset: usize,
    len: usize,
) -> Result<Vec<f32>, KernelError> {
    let bytes = len
        .checked_mul(4)
        .and_then(|n| offset.checked_add(n))
        .and_then(|end| payload.get(offset..end))
        .ok_or_else(|| KernelError::Weights {
            model,
            why: format!("a weight of {len} values at byte {offset} is past the file's end"),
        })?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(payload: &[u8]) -> Vec<u8> {
        let mut f = MAGIC.to_vec();
        f.extend_from_slice(&fingerprint(payload).to_le_bytes());
        f.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// The same answers (also computed by an independent Python version) are asserted in
    /// harl-build's writer: the two must agree bit for bit.
    #[test]
    fn fingerprint_known_answers() {
        assert_eq!(fingerprint(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fingerprint(b"harl"), 0x1d3b_cc8b_14c0_a5e4);
        assert_eq!(fingerprint(b"harl weights 1.0"), 0x499d_46a9_fd54_9617);
    }

    #[test]
    fn a_good_file_gives_its_floats() {
        let data: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f = file(&data);
        let p = payload("m", &f, fingerprint(&data), data.len()).expect("good file");
        assert_eq!(floats("m", p, 4, 2).expect("in range"), vec![-2.0, 3.25]);
        assert!(floats("m", p, 4, 3).is_err(), "past the end");
        assert!(floats("m", p, usize::MAX, 1).is_err(), "offset overflow");
        assert!(floats("m", p, 0, usize::MAX).is_err(), "length overflow");
    }

    #[test]
    fn every_damage_is_a_typed_error() {
        let data: Vec<u8> = (0..64u8).collect();
        let (fp, len) = (fingerprint(&data), data.len());
        let good = file(&data);
        let why = |bytes: &[u8]| match payload("m", bytes, fp, len) {
            Err(KernelError::Weights { model: "m", why }) => why,
            other => panic!("{other:?}"),
        };
        assert!(why(&good[..10]).contains("not a harl weights file"));
        assert!(why(b"").contains("not a harl weights file"));
        assert!(why(&good[..good.len() - 1]).contains("truncated"));
        let mut padded = good.clone();
        padded.push(0);
        assert!(why(&padded).contains("truncated or padded"));
        let mut flipped = good.clone();
        flipped[HEADER_LEN + 5] ^= 1;
        assert!(why(&flipped).contains("damaged"));
        let other: Vec<u8> = (1..65u8).collect();
        assert!(why(&file(&other)).contains("another model"));
        assert!(matches!(
            read("m", Path::new("/nonexistent/harl/m.weights")),
            Err(KernelError::Weights { .. })
        ));
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the reader, and are accepted only when they are the file.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let data = [7u8; 16];
            let ok = payload("m", &bytes, fingerprint(&data), data.len()).is_ok();
            proptest::prop_assert_eq!(ok, bytes == file(&data));
        }
    }
}

//! The model's opset, for error messages: a minimal protobuf walk over the file's bytes
//! (onnx-ir does not expose it).

/// The model's default-domain opset, read from its `opset_import` (0 if the bytes do not say):
/// only for error messages, so a minimal protobuf walk rather than a second parser.
pub(super) fn default_opset(bytes: &[u8]) -> usize {
    let mut opset = 0;
    // ModelProto.opset_import = 8: OperatorSetIdProto { domain = 1, version = 2 }.
    for (field, body, _) in walk(bytes) {
        let Some(body) = body.filter(|_| field == 8) else {
            continue;
        };
        let (mut domain, mut version) = (&b""[..], 0u64);
        for (f, b, v) in walk(body) {
            match (f, b) {
                (1, Some(d)) => domain = d,
                (2, None) => version = v,
                _ => {}
            }
        }
        if domain.is_empty() || domain == b"ai.onnx" {
            opset = usize::try_from(version).unwrap_or(0);
        }
    }
    opset
}

fn varint(b: &[u8], mut i: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(i)?;
        i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some((v, i));
        }
    }
    None
}

/// The fields of a protobuf message: (field, Some(bytes), 0) for length-delimited ones,
/// (field, None, value) for varints; fixed-width ones are skipped. Stops at the first
/// malformed byte.
fn walk(b: &[u8]) -> Vec<(u64, Option<&[u8]>, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let Some((tag, j)) = varint(b, i) else { break };
        let (field, wire) = (tag >> 3, tag & 7);
        i = j;
        match wire {
            0 => {
                let Some((v, j)) = varint(b, i) else { break };
                out.push((field, None, v));
                i = j;
            }
            1 => i = i.saturating_add(8),
            5 => i = i.saturating_add(4),
            2 => {
                let Some((len, j)) = varint(b, i) else { break };
                let Some(end) = usize::try_from(len).ok().and_then(|l| j.checked_add(l)) else {
                    break;
                };
                let Some(body) = b.get(j..end) else { break };
                out.push((field, Some(body), 0));
                i = end;
            }
            _ => break,
        }
    }
    out
}

//! Gzipped text files of the cost models (the datasets, MetaTune's weights): written at the
//! best compression, read back with a cap on their uncompressed size, every failure a
//! [`CostModelError::Records`] naming the file.

use super::CostModelError;
use std::io::{Read, Write};
use std::path::Path;

/// An error about the file at `path`.
pub(crate) fn records_error(path: &Path, why: impl ToString) -> CostModelError {
    CostModelError::Records {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// Writes `text` gzipped to `path`.
pub(crate) fn write(path: &Path, text: &str) -> Result<(), CostModelError> {
    let err = |e: std::io::Error| records_error(path, e);
    let file = std::fs::File::create(path).map_err(err)?;
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    gz.write_all(text.as_bytes()).map_err(err)?;
    gz.finish().map_err(err)?;
    Ok(())
}

/// Reads the file at `path` (to hand to [`text`]).
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, CostModelError> {
    std::fs::read(path).map_err(|e| records_error(path, e))
}

/// The text of gzipped `bytes` (`path` names them in errors), refused when it is not gzipped
/// text or is over `cap` bytes uncompressed.
pub(crate) fn text(bytes: &[u8], cap: u64, path: &Path) -> Result<String, CostModelError> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(bytes)
        .take(cap + 1)
        .read_to_string(&mut text)
        .map_err(|e| records_error(path, format!("not a gzipped text file: {e}")))?;
    if text.len() as u64 > cap {
        return Err(records_error(
            path,
            format!("over {cap} bytes uncompressed"),
        ));
    }
    Ok(text)
}

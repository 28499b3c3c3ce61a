//! The op library: common tensor operators built on te.

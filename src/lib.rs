//! harl: tensor kernels tuned ahead of time.

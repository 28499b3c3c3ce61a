//! The #[harl::kernel] attribute.

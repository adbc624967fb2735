//! TODO
pub mod idle;

//! The C ABI from its clients: C (`tests/ffi/client.c`) and Python
//! (`examples/regions.py`), each in a process of its own
//! (`cargo test --test ffi`). The header check (`ffi_header`) and the
//! handles, which track this process (`ffi_handles`), are binaries of their
//! own.

#[path = "../support/mod.rs"]
mod support;

mod ffi_c;
mod ffi_python;

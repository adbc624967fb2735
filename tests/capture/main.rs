//! The capture pipeline from probes to outputs: attaching to the images a
//! program maps, allocation stacks and their unwinding, USDT regions, ring
//! loss, the events rings and their consumer, the binary event stream,
//! Python functions in stacks, and the preload shim
//! (`cargo test --test capture`).
//!
//! Not here, in binaries of their own: `attach_images` (its fuzz test
//! installs a panic hook and measures the process's peak memory) and
//! `probes_scope` (it counts breakpoints in a process outside any capture,
//! which any other system-wide capture running beside it would put there).

#[path = "../support/mod.rs"]
mod support;

mod attach;
mod capture_loss;
mod event_rings;
mod events_binary;
mod preload;
mod python_frames;
mod ring_consumer;
mod shim_records;
mod stacks;
mod stacks_unwind;
mod static_images;
mod usdt_regions;

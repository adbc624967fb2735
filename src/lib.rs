//! memtrail: a Linux memory-allocation tracker built on eBPF.
//!
//! Modules, from the kernel up:
//! - [`skel`]: the libbpf skeletons generated from `bpf/`.
//! - [`sys`]: every raw system call.
//! - [`ring`]: reading BPF ring buffers straight from their mapping.
//! - [`engine`]: pinned poller threads, idle strategy, epoch barriers.
//! - [`record`]: decoding ring records into events.
//! - [`attach`]: finding allocator entry points and attaching probes.
//! - [`capture`]: one capture from start to profile, the library entry point.
//! - [`pressure`]: pausing the tree when a ring fills up, instead of losing events.
//! - [`proctree`]: starting the command and following its process tree.
//! - [`symbolize`]: stacks to functions and lines, after the capture.
//! - [`unwind`]: unwind tables compiled from each image's CFI, for the BPF stack walker.
//! - [`report`]: aggregating events into the profile, summary and stream.
//! - [`render`]: reports on allocation sites: text, JSON, folded, flamegraph, pprof.
//! - [`cli`]: the `memtrail` command line.

pub mod attach;
pub mod capture;
pub mod cli;
pub mod engine;
pub mod pressure;
pub mod proctree;
pub mod record;
pub mod render;
pub mod report;
pub mod ring;
pub mod skel;
pub mod symbolize;
pub mod sys;
pub mod unwind;

//! memtrail: a Linux memory-allocation tracker built on eBPF.
//!
//! Modules, from the kernel up:
//! - [`skel`]: the libbpf skeletons generated from `bpf/`.
//! - [`sys`]: every raw system call.
//! - [`ring`]: reading BPF ring buffers straight from their mapping.
//! - [`engine`]: pinned poller threads, idle strategy, epoch barriers.
//! - [`record`]: decoding ring records into events.
//! - [`attach`]: finding allocator entry points and attaching probes.
//! - [`session`]: one capture, owned start to finish: the library entry point.
//! - [`capture`]: `memtrail run`'s and `memtrail attach`'s captures (a session on a command or a
//!   running process, and its outputs).
//! - [`pressure`]: pausing the tree when a ring fills up, instead of losing events.
//! - [`proctree`]: starting the command and following its process tree.
//! - [`symbolize`]: stacks to functions and lines, after the capture.
//! - [`unwind`]: unwind tables compiled from each image's CFI, for the BPF stack walker.
//! - [`events`]: the compact binary event stream and its reader.
//! - [`report`]: aggregating events into the profile, summary and stream.
//! - [`render`]: reports on allocation sites: text, JSON, folded, flamegraph, pprof.
//! - [`bench`]: `memtrail bench`, memory metrics of benchmarks.
//! - [`compare`]: `memtrail compare`, regressions between two bench results.
//! - [`cli`]: the `memtrail` command line.
//! - [`ffi`]: the C ABI (`include/memtrail.h`).
//!
//! The public API is small: a [`Session`] ([`SessionOptions`], [`Target`]),
//! its [`Snapshot`]s and [`RegionCounts`], and one error type with a
//! [`ErrorKind`]. The modules are public for the CLI, `tests/` and `perf/`
//! only (hidden from the docs): they are internals, not a stable API.

#[doc(hidden)]
pub mod aggregate;
#[doc(hidden)]
pub mod attach;
#[doc(hidden)]
pub mod bench;
#[doc(hidden)]
pub mod bpf;
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod compare;
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod events;
#[doc(hidden)]
pub mod ffi;
#[doc(hidden)]
pub mod output;
#[doc(hidden)]
pub mod pressure;
#[doc(hidden)]
pub mod proctree;
#[doc(hidden)]
pub mod profile;
#[doc(hidden)]
pub mod report;
#[doc(hidden)]
pub mod ring;
pub mod session;
#[doc(hidden)]
pub mod symbolize;
#[doc(hidden)]
pub mod sys;
#[doc(hidden)]
pub mod unwind;

pub use pressure::PressureTimeout;
pub use profile::regions::RegionCounts;
pub use session::{CaptureError as Error, ErrorKind, Faults};
pub use session::{
    Finish, ProcessTotals, Region, Session, SessionOptions, Snapshot, Target, Totals, TreeExit,
};

// USDT region markers for Rust programs (`memtrail_region_begin!`,
// `memtrail_region_end!`): the probes `include/memtrail_usdt.h` makes, which
// `memtrail run` and `memtrail attach` count (docs/profile.md, "Regions").
include!("../include/memtrail_usdt.rs");

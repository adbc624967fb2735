//! memtrail: a Linux memory-allocation tracker built on eBPF.
//!
//! Modules by floor, from the kernel up (ARCHITECTURE.md; a module imports
//! only its own floor and those below, `tests/layers.rs` checks it):
//! - [`sys`]: every raw system call.
//! - [`profile`]: the profile document; [`output`]: whole-or-nothing
//!   output files.
//! - [`bpf`]: the loaded BPF object's Rust side: skeletons, records,
//!   counters.
//! - [`ring`]: BPF ring buffers read from their mapping; [`engine`]: pinned
//!   pollers, idle strategy, epoch barriers; [`symbolize`]: stacks to
//!   functions and lines; [`report`]: the reports (text, JSON, folded, flame
//!   graph, pprof, timeline).
//! - [`proctree`]: the command and its process tree; [`events`]: the event
//!   stream; [`unwind`]: unwind tables for the BPF stack walker.
//! - [`attach`]: allocator entry points and probes; [`pressure`]: pausing
//!   the tree when a ring fills up; [`aggregate`]: events into the profile.
//! - [`session`]: one capture, owned start to finish: the library entry
//!   point.
//! - [`bench`]: memory metrics of benchmarks; [`compare`]: regressions
//!   between two bench results.
//! - [`cli`]: the `memtrail` command line; [`ffi`]: the C ABI
//!   (`include/memtrail.h`).
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

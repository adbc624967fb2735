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
//! [`ErrorKind`]. The modules are private; the binary, `tests/` and `perf/`
//! reach them through the hidden [`internals`] module, not a stable API.

mod bpf;
mod output;
mod profile;
mod sys;

mod engine;
mod python;
mod report;
mod ring;
mod symbolize;

mod events;
mod proctree;
mod unwind;

mod aggregate;
mod attach;
mod pressure;

pub mod session;

mod bench;
mod compare;

mod cli;
mod ffi;

/// memtrail's internals for its binary (`src/main.rs`), tests, benches and
/// scripts: every module's public items, by floor. Not a stable API.
#[doc(hidden)]
pub mod internals {
    pub mod sys {
        pub use crate::sys::*;
    }
    pub mod profile {
        pub use crate::profile::*;
    }
    pub mod output {
        pub use crate::output::*;
    }
    pub mod bpf {
        pub use crate::bpf::*;
    }
    pub mod ring {
        pub use crate::ring::*;
    }
    pub mod engine {
        pub use crate::engine::*;
    }
    pub mod python {
        pub use crate::python::*;
    }
    pub mod symbolize {
        pub use crate::symbolize::*;
    }
    pub mod report {
        pub use crate::report::*;
    }
    pub mod proctree {
        pub use crate::proctree::*;
    }
    pub mod events {
        pub use crate::events::*;
    }
    pub mod unwind {
        pub use crate::unwind::*;
    }
    pub mod attach {
        pub use crate::attach::*;
    }
    pub mod pressure {
        pub use crate::pressure::*;
    }
    pub mod aggregate {
        pub use crate::aggregate::*;
    }
    pub mod session {
        pub use crate::session::*;
    }
    pub mod bench {
        pub use crate::bench::*;
    }
    pub mod compare {
        pub use crate::compare::*;
    }
    pub mod cli {
        pub use crate::cli::*;
    }
    pub mod ffi {
        pub use crate::ffi::*;
    }
}

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

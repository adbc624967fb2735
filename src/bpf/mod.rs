//! The loaded BPF object's Rust side: the skeletons generated from `bpf/`
//! ([`skel`]), the records its programs write into the rings ([`record`]),
//! and the readers of its counters ([`counters`]).

pub mod counters;
pub mod record;
pub mod skel;

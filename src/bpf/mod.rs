//! The loaded BPF object's Rust side: the skeletons generated from `bpf/`
//! ([`skel`]), loading memtrail's object with its `.rodata` settings
//! ([`object`]), the `.bss` words shared with the programs ([`bss`]), the
//! records its programs write into the rings ([`record`]), and the readers
//! of its counters ([`counters`]).

pub mod bss;
pub mod counters;
pub(crate) mod object;
pub mod record;
pub mod skel;

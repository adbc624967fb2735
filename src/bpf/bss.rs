//! The `.bss` words that threads share with the BPF programs, owned in one
//! place.
//!
//! A loaded object's `.bss` is a one-entry array map created mmap-able
//! (`BPF_F_MMAPABLE`); libbpf maps it for the skeleton's `bss_data`. The
//! pollers, the pressure coordinator and the session read and write some of
//! its words while the programs update them (a ring's `sleeping` flag, the
//! pressure latch, counters). Rather than raw pointers into libbpf's mapping
//! (valid only as long as the skeleton, an order of drops written in prose),
//! [`Bss`] maps the same map a second time, shared: the pages are the
//! kernel's, the same the programs and libbpf's mapping see, and this
//! mapping is unmapped only when the last [`BssWord`] of it is gone. The
//! kernel keeps the map alive while it is mapped, so a word outlives the
//! object that made it without ever pointing at freed memory: its validity
//! no longer depends on the order things are dropped in.
//!
//! Access is atomic only ([`BssWord::get`] hands out `&AtomicU64`); the
//! orderings are chosen by each user, next to the BPF code they pair with.

use std::mem::{offset_of, size_of};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::skel::memtrail::{MemtrailSkel, types};

/// A shared mapping of a BPF object's `.bss` (see the module docs).
#[derive(Clone, Debug)]
pub struct Bss(Arc<memmap2::MmapRaw>);

impl Bss {
    /// Maps the `.bss` of memtrail's loaded object.
    pub fn of(skel: &MemtrailSkel<'_>) -> std::io::Result<Self> {
        Self::map(skel.maps.bss.as_fd(), size_of::<types::bss>())
    }

    /// Maps the first `len` bytes of `map`, an mmap-able array map (a
    /// loaded object's `.bss`: any object's, the ring tests' too).
    pub fn map(map: BorrowedFd<'_>, len: usize) -> std::io::Result<Self> {
        let mapping = memmap2::MmapOptions::new()
            .len(len)
            .map_raw(map.as_raw_fd())?;
        Ok(Self(Arc::new(mapping)))
    }

    /// The `u64` at byte `offset` (from `offset_of!` on the skeleton's
    /// generated `bss` type).
    ///
    /// # Panics
    /// If `offset` is past the mapping or not 8-byte aligned.
    pub fn word(&self, offset: usize) -> BssWord {
        assert!(
            offset % align_of::<AtomicU64>() == 0 && offset + size_of::<u64>() <= self.0.len(),
            "a .bss word at {offset} in {} bytes",
            self.0.len()
        );
        BssWord {
            bss: self.clone(),
            offset,
        }
    }

    /// The ring's `sleeping` flag: raised by its poller before it sleeps
    /// deeply (see `engine::idle`), read by the producers.
    pub fn sleeping(&self, ring: usize) -> BssWord {
        assert!(ring < 4, "no ring {ring}");
        self.word(offset_of!(types::bss, sleeping) + ring * size_of::<u64>())
    }

    /// `pressure_latch`: when the latched pressure episode began, or 0.
    pub fn pressure_latch(&self) -> BssWord {
        self.word(offset_of!(types::bss, pressure_latch))
    }

    /// `hard_stops_unrecorded`: self-stops `hard_stops` had no room for.
    pub fn hard_stops_unrecorded(&self) -> BssWord {
        self.word(offset_of!(types::bss, hard_stops_unrecorded))
    }

    /// `tree_threads`: the tree's live threads, as BPF counts them.
    pub fn tree_threads(&self) -> BssWord {
        self.word(offset_of!(types::bss, tree_threads))
    }
}

/// One `u64` of a [`Bss`] mapping, which it keeps mapped.
#[derive(Clone, Debug)]
pub struct BssWord {
    bss: Bss,
    offset: usize,
}

impl BssWord {
    /// The word, to be accessed atomically (the programs update it with
    /// atomic instructions or plain aligned stores).
    pub fn get(&self) -> &AtomicU64 {
        // SAFETY: `Bss::word` checked that `offset` is 8-byte aligned and
        // within the mapping (itself page-aligned), which `self.bss` keeps
        // mapped as long as `self`, and so the returned borrow, lives. The
        // memory is shared with the kernel and other mappings, so it is
        // only ever accessed through atomics, never through `&mut`.
        unsafe { &*self.bss.0.as_ptr().add(self.offset).cast::<AtomicU64>() }
    }
}

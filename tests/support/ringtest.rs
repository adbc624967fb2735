//! Drives `bpf/ringtest.bpf.c`, the deterministic ring producer, for the
//! ring consumer's tests (`tests/capture/ring_consumer.rs`, through the
//! support module) and benchmarks (`perf/ring_bench.rs` and
//! `perf/ring_contention.rs`, which include this file).
//!
//! [`RingTest`] owns one loaded ringtest object: its ring, sized before load,
//! and its `produce` program, run with `BPF_PROG_TEST_RUN` on the calling
//! thread. Record layouts come from the skeleton's generated types.

use std::mem::{self, MaybeUninit};
use std::os::fd::{AsFd, BorrowedFd};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, ProgramInput};
use memtrail::internals::bpf::bss::{Bss, BssWord};
use memtrail::internals::bpf::skel::ringtest::types::{bss, rt_args, rt_record};
use memtrail::internals::bpf::skel::ringtest::{RingtestSkel, RingtestSkelBuilder};
use memtrail::internals::ring::{HEADER_LEN, RingConsumer};

/// Size of the `struct rt_record` at the start of every record body: the
/// smallest record `produce` makes.
pub const RECORD_HEADER: u32 = mem::size_of::<rt_record>() as u32;

/// `BPF_RB_NO_WAKEUP`: submit without waking epoll waiters.
pub const NO_WAKEUP: u32 = 1;

/// Wake the consumer only while its `sleeping` flag is set, as memtrail's
/// probes do (`RT_AUTO_WAKEUP`).
pub const AUTO_WAKEUP: u32 = 4;

/// Bytes one record of `size` body bytes takes in the ring: the kernel's
/// 8-byte header plus the body, rounded up to 8.
pub fn slot_len(size: u32) -> u64 {
    (u64::from(size) + HEADER_LEN as u64).next_multiple_of(8)
}

/// Records of `size` body bytes that fit in an empty ring of `ring_size`
/// bytes: the kernel keeps the producer less than a full ring ahead of the
/// consumer (`new_prod_pos - cons_pos > mask` fails in
/// `__bpf_ringbuf_reserve`), so the last byte is never used.
pub fn capacity(ring_size: u32, size: u32) -> u64 {
    (u64::from(ring_size) - 1) / slot_len(size)
}

/// One run of `produce`: what to make.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Sequence number of the first record.
    pub seq: u64,
    /// Records to make.
    pub count: u32,
    /// Body bytes of each record, at least [`RECORD_HEADER`].
    pub size: u32,
    /// Discard the records whose `seq % n == n - 1`; 0 discards none.
    pub discard_every: u32,
    /// Submit flags (`NO_WAKEUP` or 0).
    pub flags: u32,
}

impl Run {
    /// `count` records of `size` bytes from `seq`, none discarded, no
    /// wakeups.
    pub fn new(seq: u64, count: u32, size: u32) -> Self {
        Self {
            seq,
            count,
            size,
            discard_every: 0,
            flags: NO_WAKEUP,
        }
    }
}

/// What one run of `produce` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub submitted: u32,
    pub discarded: u32,
    pub dropped: u32,
}

/// One loaded ringtest object.
pub struct RingTest<'obj> {
    skel: RingtestSkel<'obj>,
    ring_size: u32,
    /// The object's .bss, mapped: its `sleeping` word for deep sleep.
    bss: Bss,
}

impl<'obj> RingTest<'obj> {
    /// Opens and loads the object with a ring of `ring_size` bytes (a
    /// power-of-two multiple of the page size).
    pub fn load(storage: &'obj mut MaybeUninit<OpenObject>, ring_size: u32) -> Self {
        let mut open = RingtestSkelBuilder::default()
            .open(storage)
            .expect("open the ringtest object");
        open.maps
            .rt_ring
            .set_max_entries(ring_size)
            .expect("size the ring");
        let skel = open.load().expect("load the ringtest object");
        let bss = Bss::map(skel.maps.bss.as_fd(), mem::size_of::<bss>()).expect("mmapable .bss");
        Self {
            skel,
            ring_size,
            bss,
        }
    }

    /// Size of the ring's data area in bytes.
    pub fn ring_size(&self) -> u32 {
        self.ring_size
    }

    /// The ring map, for consumers other than ours.
    pub fn ring_map(&self) -> &libbpf_rs::MapMut<'obj> {
        &self.skel.maps.rt_ring
    }

    /// The ring map's fd.
    pub fn ring_fd(&self) -> BorrowedFd<'_> {
        self.skel.maps.rt_ring.as_fd()
    }

    /// The `sleeping` word of the object's .bss, for a consumer's deep
    /// sleep.
    pub fn sleeping_flag(&self) -> BssWord {
        self.bss.word(mem::offset_of!(bss, sleeping))
    }

    /// memtrail's consumer on this ring, starting at the published
    /// consumer position.
    pub fn consumer(&self) -> RingConsumer {
        RingConsumer::new(self.ring_fd(), self.ring_size as usize).expect("map the ring")
    }

    /// Runs `produce` once on this thread; every record it submits is in
    /// the ring when this returns.
    pub fn produce(&self, run: Run) -> Outcome {
        let mut args = rt_args {
            seq: run.seq,
            count: run.count,
            size: run.size,
            discard_every: run.discard_every,
            flags: run.flags,
            ..rt_args::default()
        };
        // SAFETY: `rt_args` is `repr(C)` with only integer fields and no
        // padding (one u64 then eight u32), so all its bytes are initialized
        // and any bytes the kernel writes back form a valid value; the slice
        // borrows `args` exclusively until `test_run` returns.
        let ctx = unsafe {
            std::slice::from_raw_parts_mut((&raw mut args).cast::<u8>(), mem::size_of::<rt_args>())
        };
        let input = ProgramInput {
            context_in: Some(ctx),
            ..ProgramInput::default()
        };
        let out = self
            .skel
            .progs
            .produce
            .test_run(input)
            .expect("run the produce program");
        assert_eq!(out.return_value, 0, "produce rejected {run:?}");
        Outcome {
            submitted: args.submitted,
            discarded: args.discarded,
            dropped: args.dropped,
        }
    }

    /// The object's drop counter: failed reserves since load.
    pub fn drops(&self) -> u64 {
        let value = self
            .skel
            .maps
            .bss
            .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
            .expect("read .bss")
            .expect(".bss has its one entry");
        let at = mem::offset_of!(bss, drops);
        u64::from_ne_bytes(value[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// The `struct rt_record` at the start of a record body.
pub fn header(body: &[u8]) -> rt_record {
    assert!(
        body.len() >= RECORD_HEADER as usize,
        "record of {} bytes is shorter than its header",
        body.len()
    );
    // SAFETY: the body holds at least `size_of::<rt_record>()` bytes (checked
    // above), `read_unaligned` needs no alignment, and `rt_record` is plain
    // integers, valid for any bytes.
    unsafe { body.as_ptr().cast::<rt_record>().read_unaligned() }
}

/// The exact bytes `produce` writes for record `seq` of `size` bytes made
/// at `ts_ns`: the header, then body byte i = (u8)seq ^ (u8)i.
pub fn expected_body(seq: u64, size: u32, ts_ns: u64) -> Vec<u8> {
    let mut body: Vec<u8> = (0..size).map(|i| (seq as u8) ^ (i as u8)).collect();
    let hdr = rt_record {
        seq,
        ts_ns,
        size,
        _pad: 0,
    };
    // SAFETY: `rt_record` is `repr(C)` plain integers with no padding
    // (u64, u64, u32, u32), so all of its bytes are initialized; the slice
    // lives only within this statement, while `hdr` does.
    let hdr_bytes = unsafe {
        std::slice::from_raw_parts((&raw const hdr).cast::<u8>(), mem::size_of::<rt_record>())
    };
    body[..hdr_bytes.len()].copy_from_slice(hdr_bytes);
    body
}

/// Checks that `body` is exactly record `seq` of `size` bytes; returns its
/// timestamp.
pub fn check_record(body: &[u8], seq: u64, size: u32) -> u64 {
    let hdr = header(body);
    assert_eq!(hdr.seq, seq, "sequence number");
    assert_eq!(body.len(), size as usize, "length of record {seq}");
    assert_ne!(hdr.ts_ns, 0, "timestamp of record {seq}");
    assert!(
        body == expected_body(seq, size, hdr.ts_ns).as_slice(),
        "bytes of record {seq} differ from the pattern"
    );
    hdr.ts_ns
}

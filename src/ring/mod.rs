//! A consumer for BPF ring buffers that reads records straight from the
//! kernel's mapping.
//!
//! The kernel exposes a `BPF_MAP_TYPE_RINGBUF` map as two mappings of its fd:
//! - offset 0, one page, read-write: `consumer_pos`, the only word userspace
//!   writes;
//! - offset one page, read-only: one page holding `producer_pos`, then the data
//!   area mapped twice in a row, so a record that wraps past the end is still
//!   contiguous in our address space.
//!
//! Every record starts with an 8-byte header: a `u32` length whose top bits
//! are BUSY (reserved, not yet committed) and DISCARD (committed, to be
//! skipped), and a `u32` page offset the kernel uses. Records are padded to 8
//! bytes. The kernel publishes `producer_pos` with `smp_store_release` in
//! `__bpf_ringbuf_reserve` and commits a record by clearing BUSY with an
//! `xchg` in `bpf_ringbuf_commit`; it reads `consumer_pos` with
//! `smp_load_acquire` to know what space is free again.
//!
//! Ownership: [`RingConsumer`] owns both mappings; it hands out record bodies
//! as slices borrowed for the callback only, and publishes `consumer_pos`
//! after the records before it were handed out: at the end of each batch, and
//! every eighth of the ring within a long one so producers get space back.
//! One consumer per ring: two would race on `consumer_pos`.
//!
//! Each record's header load depends on the previous record's length, so
//! a naive loop serializes the cache misses of successive records. With
//! every record, the consumer prefetches the line [`PREFETCH_AHEAD`] bytes
//! ahead of its position when that whole line is below the producer
//! position (so it never pulls a line a producer may still be writing out
//! of that producer's cache); on a backlog the header loads then hit L1
//! (`perf/ring_bench.rs` measured about +25% records/s on drains, from
//! memory and from the shared cache). With the lines in L1, what is left is
//! the chain of header loads and the loop's own checks: `poll` takes runs
//! of records of one length [`GROUP`] at a time, at addresses known before
//! their headers are read, checking each header only for being the same
//! word as the one before, and doing the producer, publishing and prefetch
//! checks once a group (about +25% again).

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{Mmap, MmapMut, MmapOptions};

pub mod merge;
pub mod shim;

/// What a poller reads: one ring ([`RingConsumer`]) or several merged
/// ([`merge::Merged`]).
pub trait Consume: Send + 'static {
    /// Hands on the records committed so far, without waiting for records
    /// still being written. Returns how many were read.
    fn poll(&mut self, f: impl FnMut(&[u8])) -> usize;
    /// Hands on every record reserved before the call, waiting for those
    /// still being written (a barrier). Returns how many were read.
    fn drain(&mut self, f: impl FnMut(&[u8])) -> usize;
    /// Bytes consumed so far (pacing compares two readings).
    fn position(&self) -> u64;
    /// Bytes of ring in all.
    fn size(&self) -> usize;
    /// Whether anything waits: bytes reserved and not yet read, plus
    /// records read and not yet handed on.
    fn pending(&self) -> u64;
    /// The highest fill seen of one ring, in bytes.
    fn high_water(&self) -> u64;
    /// How long a poller may sleep at most, when some producers write
    /// without waking it (the preload shim's rings); None: they all wake
    /// it (BPF's rings).
    fn unwoken_latency(&self) -> Option<std::time::Duration> {
        None
    }
}

impl Consume for RingConsumer {
    fn poll(&mut self, f: impl FnMut(&[u8])) -> usize {
        RingConsumer::poll(self, f)
    }

    fn drain(&mut self, f: impl FnMut(&[u8])) -> usize {
        let target = self.producer_pos();
        self.drain_to(target, f)
    }

    fn position(&self) -> u64 {
        self.pos
    }

    fn size(&self) -> usize {
        RingConsumer::size(self)
    }

    fn pending(&self) -> u64 {
        RingConsumer::pending(self)
    }

    fn high_water(&self) -> u64 {
        self.high_water
    }
}

/// Set in a record header while the producer still fills it.
pub const BUSY_BIT: u32 = libbpf_sys::BPF_RINGBUF_BUSY_BIT;
/// Set in a record header the producer discarded.
pub const DISCARD_BIT: u32 = libbpf_sys::BPF_RINGBUF_DISCARD_BIT;
/// Size of the header before each record body.
pub const HEADER_LEN: usize = libbpf_sys::BPF_RINGBUF_HDR_SZ as usize;

/// A record's header word, decoded (the one decoder of the ring's paths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Header {
    /// The producer is still writing it.
    Busy,
    /// Committed: its body's length, the bytes it takes in the ring, and
    /// whether the producer discarded it.
    Ready {
        body: usize,
        stride: u64,
        discarded: bool,
    },
    /// A length the kernel never writes (longer than the ring can hold):
    /// reading on would leave the mapping.
    Invalid,
}

impl Header {
    /// Decodes `word`, the header of a record in a ring of `size` bytes.
    #[inline]
    fn decode(word: u32, size: usize) -> Self {
        if word & BUSY_BIT != 0 {
            return Self::Busy;
        }
        let body = (word & !(BUSY_BIT | DISCARD_BIT)) as usize;
        if body > size - HEADER_LEN {
            return Self::Invalid;
        }
        Self::Ready {
            body,
            stride: ((HEADER_LEN + body + 7) & !7) as u64,
            discarded: word & DISCARD_BIT != 0,
        }
    }
}
/// How far ahead of the read position `poll` and `drain_to` prefetch:
/// 2-8 KiB measured alike (`perf/ring_bench.rs`), and it stays well within
/// the L1 cache.
pub const PREFETCH_AHEAD: u64 = 16384;
/// Prefetch granularity.
const CACHE_LINE: u64 = 64;
/// Records `poll` takes at a time in a run of records of one length.
pub const GROUP: u64 = 8;

/// Errors setting up a ring consumer.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("ring size {0} is not a power-of-two multiple of the page size")]
    BadSize(usize),
    #[error("mmap of the ring's {what} failed")]
    Map {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The producer page and the data area mapped twice after it: the kernel's
/// mapping of a BPF ring, or a file's (the preload shim's rings, [`shim`]).
enum Pages {
    Kernel(Mmap),
    File(crate::sys::DoubleMap),
}

impl Pages {
    #[inline]
    fn as_ptr(&self) -> *const u8 {
        match self {
            Self::Kernel(map) => map.as_ptr(),
            Self::File(map) => map.as_ptr(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Self::Kernel(map) => map,
            Self::File(map) => map.as_slice(),
        }
    }
}

/// Reads one BPF ring buffer from its mmap'd pages.
pub struct RingConsumer {
    /// `consumer_pos` page: read-write, written only by `publish`.
    consumer: MmapMut,
    /// `producer_pos` page followed by the data area mapped twice.
    producer: Pages,
    page: usize,
    mask: u64,
    /// Our position: every record before it has been handed out. Ahead of
    /// the published `consumer_pos` within a batch.
    pos: u64,
    /// The last position stored to `consumer_pos`.
    published: u64,
    /// The highest fill seen: see [`RingConsumer::high_water`].
    high_water: u64,
    /// A header with a length the kernel never writes was met: consuming
    /// stopped there (see [`Header::Invalid`]).
    invalid: bool,
}

impl RingConsumer {
    /// Maps the ring behind `fd`, whose data area is `size` bytes (the map's
    /// `max_entries`).
    pub fn new(fd: BorrowedFd<'_>, size: usize) -> Result<Self, RingError> {
        let page = rustix::param::page_size();
        if !size.is_power_of_two() || size < page {
            return Err(RingError::BadSize(size));
        }
        // SAFETY: the kernel backs offset 0 of a ringbuf map with the
        // consumer page, which it allows to be mapped writable; it lives
        // until the mapping is dropped with `self`.
        let consumer = unsafe { MmapOptions::new().len(page).map_mut(&fd) }.map_err(|source| {
            RingError::Map {
                what: "consumer page",
                source,
            }
        })?;
        // SAFETY: offset one page maps the producer page and the data area
        // twice; the kernel only allows it read-only, and we only read it.
        let producer = unsafe {
            MmapOptions::new()
                .offset(page as u64)
                .len(page + 2 * size)
                .map(&fd)
        }
        .map_err(|source| RingError::Map {
            what: "producer pages",
            source,
        })?;
        // Not copied into memtrail's children (the command before its exec,
        // the guardian): a fork copied the page table of both mappings of
        // every data page (8,192 for a 16 MiB ring), and the exec dropped
        // it again.
        let advised = consumer
            .advise(memmap2::Advice::DontFork)
            .and_then(|()| producer.advise(memmap2::Advice::DontFork));
        if let Err(err) = advised {
            tracing::debug!(%err, "ring: MADV_DONTFORK not set");
        }
        Ok(Self::with_pages(
            consumer,
            Pages::Kernel(producer),
            page,
            size,
        ))
    }

    /// Maps a ring laid out as a BPF ring's mapping in file `fd` at
    /// `offset`: the consumer page, the producer page, then `size` bytes of
    /// data (the preload shim's rings, [`shim`]).
    pub fn from_file(fd: BorrowedFd<'_>, offset: u64, size: usize) -> Result<Self, RingError> {
        let page = rustix::param::page_size();
        if !size.is_power_of_two() || size < page {
            return Err(RingError::BadSize(size));
        }
        // SAFETY: a shared mapping of memtrail's own file; the consumer
        // page is written only through `consumer_pos`, atomically.
        let consumer = unsafe { MmapOptions::new().offset(offset).len(page).map_mut(&fd) }
            .map_err(|source| RingError::Map {
                what: "consumer page",
                source,
            })?;
        if let Err(err) = consumer.advise(memmap2::Advice::DontFork) {
            tracing::debug!(%err, "ring: MADV_DONTFORK not set");
        }
        let producer =
            crate::sys::DoubleMap::new(fd, offset + page as u64, page, size).map_err(|err| {
                RingError::Map {
                    what: "producer pages",
                    source: err.source,
                }
            })?;
        Ok(Self::with_pages(
            consumer,
            Pages::File(producer),
            page,
            size,
        ))
    }

    fn with_pages(consumer: MmapMut, producer: Pages, page: usize, size: usize) -> Self {
        let mut ring = Self {
            consumer,
            producer,
            page,
            mask: size as u64 - 1,
            pos: 0,
            published: 0,
            invalid: false,
            high_water: 0,
        };
        ring.pos = ring.consumer_pos().load(Ordering::Acquire);
        ring.published = ring.pos;
        ring
    }

    fn consumer_pos(&self) -> &AtomicU64 {
        // SAFETY: the consumer page is page-aligned, at least 8 bytes long
        // and lives as long as `self`; the kernel treats it as an
        // `unsigned long` updated atomically, as AtomicU64 does.
        unsafe { &*self.consumer.as_ptr().cast::<AtomicU64>() }
    }

    /// The kernel's producer position: every byte before it is reserved.
    /// Acquire pairs with the `smp_store_release` in `__bpf_ringbuf_reserve`,
    /// so the headers of the reserved records are visible.
    pub fn producer_pos(&self) -> u64 {
        // SAFETY: as in `consumer_pos`, for the page-aligned producer page.
        let prod = unsafe { &*self.producer.as_ptr().cast::<AtomicU64>() };
        prod.load(Ordering::Acquire)
    }

    /// Our read position: records before it were handed out.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Size of the data area in bytes.
    pub fn size(&self) -> usize {
        (self.mask + 1) as usize
    }

    /// The highest fill of the ring (bytes reserved by producers and not
    /// yet given back) seen whenever this consumer read the producer
    /// position. The fill peaks just before a look, so this is the ring's
    /// high-water mark at the moments the consumer catches up.
    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    /// Notes the fill a producer position `prod` gives.
    #[inline]
    fn note_fill(&mut self, prod: u64) {
        self.high_water = self.high_water.max(prod.wrapping_sub(self.published));
    }

    /// Reads the producer position and notes the fill it gives.
    #[inline]
    fn producer_pos_noted(&mut self) -> u64 {
        let prod = self.producer_pos();
        self.note_fill(prod);
        prod
    }

    /// Bytes reserved by producers and not yet consumed.
    pub fn pending(&self) -> u64 {
        self.producer_pos().wrapping_sub(self.pos)
    }

    /// Whether the record at the read position has a header no producer
    /// writes (a length longer than the ring): reading stopped there.
    pub fn stopped_at_invalid(&self) -> bool {
        self.invalid
            || (self.pos < self.producer_pos()
                && Header::decode(self.header(self.pos).load(Ordering::Acquire), self.size())
                    == Header::Invalid)
    }

    /// The bytes the record at the read position takes, if it is still
    /// being written (busy) and its length one a producer writes.
    pub fn busy_head(&self) -> Option<u64> {
        if self.pos >= self.producer_pos() {
            return None;
        }
        let word = self.header(self.pos).load(Ordering::Acquire);
        let body = (word & !(BUSY_BIT | DISCARD_BIT)) as usize;
        (word & BUSY_BIT != 0 && body <= self.size() - HEADER_LEN)
            .then(|| ((HEADER_LEN + body + 7) & !7) as u64)
    }

    fn header(&self, pos: u64) -> &AtomicU32 {
        let off = self.page + (pos & self.mask) as usize;
        // SAFETY: `off` is 8-aligned (records are 8-byte padded and the data
        // area is page-aligned) and inside the first copy of the data area,
        // which lives as long as `self`.
        unsafe { &*self.producer.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// Hands every committed record up to the producer position to `f`,
    /// skipping discarded ones, and stops at the first record still being
    /// written. Returns the number of records handed to `f`.
    pub fn poll(&mut self, f: impl FnMut(&[u8])) -> usize {
        self.poll_within(None, f)
    }

    /// As [`Self::poll`], but only the records below `limit`, a producer
    /// position read before: a merge's look at one ring of several ends
    /// there, however fast its producers write on.
    pub fn poll_to(&mut self, limit: u64, f: impl FnMut(&[u8])) -> usize {
        self.poll_within(Some(limit), f)
    }

    fn poll_within(&mut self, limit: Option<u64>, mut f: impl FnMut(&[u8])) -> usize {
        // The hot loop: locals instead of fields, one header load per
        // record, no bounds check on the body (validated against the
        // mapping below instead).
        let data = self.producer.as_ptr().wrapping_add(self.page);
        let (mask, size) = (self.mask, self.size());
        let publish_every = mask / 8;
        let mut handed = 0;
        let mut pos = self.pos;
        let mut prod = match limit {
            Some(limit) => {
                self.note_fill(limit);
                limit
            }
            None => self.producer_pos_noted(),
        };
        // The previous record's header word and padded length: see below.
        // `last_len` only ever holds the header of a committed record
        // handed to `f` (neither BUSY nor DISCARD, a valid length).
        let (mut last_len, mut last_stride) = (u32::MAX, 0u64);
        while pos < prod {
            // Runs of records of one length (the common case): `GROUP`
            // records at a time, each checked only for being the same
            // header word as the record before, with the loop's other
            // checks (producer position, publishing, prefetch bounds) done
            // once a group. `GROUP * last_stride <= size` keeps the whole
            // group inside the double mapping without masking each record.
            if last_stride != 0
                && pos + GROUP * last_stride <= prod
                && GROUP * last_stride <= size as u64
            {
                // SAFETY: the group lies below `prod` and fits in the double
                // mapping (checked just above); `last_len` is the header of
                // a record handed to `f` before.
                let same =
                    unsafe { hand_group(data, (mask, prod), pos, (last_len, last_stride), &mut f) };
                pos += same * last_stride;
                handed += same as usize;
                if pos - self.published >= publish_every {
                    self.pos = pos;
                    self.publish();
                }
                if same == GROUP {
                    if pos >= prod && limit.is_none() {
                        prod = self.producer_pos_noted();
                    }
                    continue;
                }
                // A different header: the general path takes it.
            }
            let ahead = pos + PREFETCH_AHEAD;
            if ahead | (CACHE_LINE - 1) < prod {
                prefetch(data.wrapping_add((ahead & mask) as usize));
            }
            let rec = data.wrapping_add((pos & mask) as usize);
            // SAFETY: `rec` is 8-aligned (records are 8-byte padded, the
            // data area page-aligned) and inside the first copy of the data
            // area, which lives as long as `self`. Acquire pairs with the
            // xchg in bpf_ringbuf_commit(): the body written before the
            // commit is visible once BUSY is clear.
            let len = unsafe { &*rec.cast::<AtomicU32>() }.load(Ordering::Acquire);
            let Header::Ready {
                body,
                stride,
                discarded,
            } = Header::decode(len, size)
            else {
                // Busy: the rest is not written yet. Invalid: stop rather
                // than read outside the mapping.
                break;
            };
            if !discarded {
                // SAFETY: the body starts inside the first copy of the data
                // area and is at most `size - 8` bytes long, so it ends
                // inside the second copy: the double mapping keeps a record
                // that wraps contiguous. The kernel does not touch a
                // committed record until consumer_pos passes it.
                f(unsafe { std::slice::from_raw_parts(rec.add(HEADER_LEN), body) });
                handed += 1;
                // The next records most likely repeat this one's length.
                last_len = len;
                last_stride = stride;
            }
            pos += stride;
            if pos - self.published >= publish_every {
                // A long batch under load: give space back as we go.
                self.pos = pos;
                self.publish();
            }
            if pos >= prod && limit.is_none() {
                prod = self.producer_pos_noted();
            }
        }
        self.pos = pos;
        self.publish();
        handed
    }

    /// Consumes records until the read position reaches `target` (a
    /// producer position seen earlier), waiting for records still being
    /// written. Returns the number of records handed to `f`.
    ///
    /// Used by barriers: once a producer has stopped, everything it reserved
    /// lies below the producer position read after the stop.
    pub fn drain_to(&mut self, target: u64, mut f: impl FnMut(&[u8])) -> usize {
        let backoff = crossbeam_utils::Backoff::new();
        let mut handed = 0;
        self.note_fill(target);
        while self.pos < target {
            self.prefetch_ahead(target);
            match self.take_one(&mut f) {
                Some(true) => handed += 1,
                Some(false) => {}
                None if self.invalid => break,
                None => {
                    // A producer on another CPU between reserve and
                    // commit: it finishes in bounded time.
                    self.publish();
                    backoff.snooze();
                }
            }
        }
        self.publish();
        handed
    }

    /// Prefetches the line `PREFETCH_AHEAD` bytes past the read position
    /// if all of it lies below `limit`, a producer position.
    #[inline]
    fn prefetch_ahead(&self, limit: u64) {
        let ahead = self.pos + PREFETCH_AHEAD;
        if ahead | (CACHE_LINE - 1) < limit {
            let off = self.page + (ahead & self.mask) as usize;
            prefetch(self.producer.as_ptr().wrapping_add(off));
        }
    }

    /// Takes the record at the read position: `Some(true)` if handed to
    /// `f`, `Some(false)` if discarded, `None` if still busy.
    fn take_one(&mut self, f: &mut impl FnMut(&[u8])) -> Option<bool> {
        // Acquire pairs with the xchg in bpf_ringbuf_commit(): the record
        // body written before the commit is visible once BUSY is clear.
        let len = self.header(self.pos).load(Ordering::Acquire);
        let (body, stride, discarded) = match Header::decode(len, self.size()) {
            Header::Busy => return None,
            Header::Ready {
                body,
                stride,
                discarded,
            } => (body, stride, discarded),
            // A length the kernel never writes: stop here, as `poll` does,
            // rather than read outside the mapping.
            Header::Invalid => {
                if !self.invalid {
                    tracing::error!(len, pos = self.pos, "ring record with an impossible length");
                }
                self.invalid = true;
                return None;
            }
        };
        let start = self.page + (self.pos & self.mask) as usize + HEADER_LEN;
        if !discarded {
            // The body may run past the end of the first copy of the data
            // area into the second: the double mapping keeps it contiguous.
            f(&self.producer.bytes()[start..start + body]);
        }
        self.pos += stride;
        Some(!discarded)
    }

    /// Returns consumed space to the producers.
    fn publish(&mut self) {
        // Release: our reads of the records before `pos` happen before the
        // kernel, reading consumer_pos with smp_load_acquire in
        // __bpf_ringbuf_reserve, hands that space out again.
        if self.published != self.pos {
            self.consumer_pos().store(self.pos, Ordering::Release);
            self.published = self.pos;
        }
    }
}

/// The fast path of [`RingConsumer::poll_within`]: up to [`GROUP`] records
/// from `pos` whose header word is `last_len`, the word of the record
/// before (a body of `last_len` bytes, `last_stride` apart), each handed to
/// `f` after one load of its header; stops at the first other word.
/// `data` is the data area's first copy, `mask` its size less one, `prod`
/// the producer position. Returns how many records were handed.
///
/// # Safety
///
/// The group, `GROUP * last_stride` bytes from `pos`, lies below `prod` and
/// fits in the double mapping; `last_len` is the header of a committed
/// record already handed to `f` (neither BUSY nor DISCARD, a valid length).
#[inline(always)]
unsafe fn hand_group(
    data: *const u8,
    (mask, prod): (u64, u64),
    pos: u64,
    (last_len, last_stride): (u32, u64),
    f: &mut impl FnMut(&[u8]),
) -> u64 {
    let rec0 = data.wrapping_add((pos & mask) as usize);
    let ahead = pos + PREFETCH_AHEAD + GROUP * last_stride;
    let fetch = ahead | (CACHE_LINE - 1) < prod;
    let ahead0 = data.wrapping_add(((pos + PREFETCH_AHEAD) & mask) as usize);
    // `last_len` decoded as Ready when it was first seen.
    let body_len = last_len as usize;
    let mut same = 0;
    while same < GROUP {
        let step = (same * last_stride) as usize;
        if fetch {
            // A hint: an address past the mapping (the last record before
            // the wrap) costs nothing.
            prefetch(ahead0.wrapping_add(step));
        }
        let rec = rec0.wrapping_add(step);
        // SAFETY: `rec` is 8-aligned and lies within the group, which fits
        // in the double mapping (the caller's contract). Acquire pairs with
        // the xchg in bpf_ringbuf_commit(), as in `poll_within`.
        let len = unsafe { &*rec.cast::<AtomicU32>() }.load(Ordering::Acquire);
        if len != last_len {
            break;
        }
        // SAFETY: a header equal to one already validated: the body is
        // committed and ends inside the double mapping, as in `poll_within`.
        f(unsafe { std::slice::from_raw_parts(rec.add(HEADER_LEN), body_len) });
        same += 1;
    }
    same
}

/// Asks the CPU to bring the line at `at` into L1; a hint that never faults.
#[inline]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86_64 baseline, so the instruction exists;
    // a prefetch reads nothing architecturally and cannot fault, whatever
    // the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check the one header decoder: busy, committed and discarded words,
    /// the 8-byte padded stride, and a length no ring of this size can hold
    /// (which `take_one` used to slice with, and panic).
    #[test]
    fn ring_header_decode() {
        let size = 4096;
        assert_eq!(Header::decode(BUSY_BIT | 24, size), Header::Busy);
        assert_eq!(
            Header::decode(13, size),
            Header::Ready {
                body: 13,
                stride: 24,
                discarded: false
            }
        );
        assert_eq!(
            Header::decode(DISCARD_BIT | 16, size),
            Header::Ready {
                body: 16,
                stride: 24,
                discarded: true
            }
        );
        assert_eq!(
            Header::decode((size - HEADER_LEN) as u32, size),
            Header::Ready {
                body: size - HEADER_LEN,
                stride: size as u64,
                discarded: false
            }
        );
        assert_eq!(
            Header::decode((size - HEADER_LEN + 1) as u32, size),
            Header::Invalid
        );
        assert_eq!(Header::decode(DISCARD_BIT - 1, size), Header::Invalid);
    }
}

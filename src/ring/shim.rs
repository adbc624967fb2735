//! The preload shim's rings (`memtrail run --preload`, issue 22): where the
//! shim's threads write their records themselves, without a kernel entry.
//!
//! Each process has a ring file of its own (issue 40): a memfd the shim
//! makes in that process and names through its hook (`MT_SHIM_RINGS`),
//! whose record BPF stamps with the kernel's ids of the process that
//! called it. memtrail takes the file from that process alone
//! ([`Offer::adopt`]: `pidfd_getfd`), sizes and seals it, fills its
//! control page, and reads every record of it as that process's: a record
//! that names another process, a producer more than a ring ahead, a
//! length no producer writes or a stamp not yet reached is the ring's
//! corruption ([`RingFault`]), and the file is read no further. No other
//! process maps the file (the shim's mapping is `MADV_DONTFORK`, its
//! descriptor closed once memtrail took it), so a process can make
//! memtrail believe things only of itself, and memtrail reads memory only
//! of the process whose file it is, for that file's own stacks.
//!
//! A file's layout:
//! - page 0, the control page: [`MAGIC`] (written last), the layout, the
//!   walk's settings, memtrail's PID namespace, the handshake word (the
//!   shim's `RING_ADOPTED`/`RING_ABANDONED`), then one claim word per ring
//!   at byte 64 (`tgid << 32 | tid` of the thread that writes it, 0 while
//!   it is free), and at byte 2048 the CPython layouts the shim walks
//!   Python frames with: one per version ([`PythonLayouts`]), then those of
//!   interpreter images memtrail found ([`ImageLayouts`]);
//! - then each ring in `ring_pages` pages: a consumer page (memtrail's
//!   `consumer_pos`), a producer page (the shim's `producer_pos`), the data
//!   area, and the table of stack ids the ring has carried (the shim's).
//!
//! The records and their headers are a BPF ring buffer's, written by the
//! shim the way the kernel writes them (the producer position published
//! before the record is stamped, its header busy until it is complete), so
//! [`RingConsumer`] reads them and [`super::merge::Merged`] orders them
//! with BPF's by stamp. Unlike BPF's, a writer can die in the middle of a
//! record (a thread killed by another's `exit_group`) or stop there (the
//! tree paused): its ring is read without waiting for a busy record, and
//! [`ShimRings::reap`] gives back the rings of threads that are gone,
//! their unfinished record discarded. The shim's side is in
//! `preload/ring.h` (the ring path) and `preload/ring.c` (its writer).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapMut, MmapOptions};

use super::{BUSY_BIT, DISCARD_BIT, HEADER_LEN, RingConsumer, RingError};

/// "MTRLSHM1", the control page's first word.
pub const MAGIC: u64 = 0x314d_4853_4c54_524d;
/// The layout's version, checked by the shim.
const VERSION: u32 = 3;
/// The handshake word: the shim's `RING_ADOPTED` (memtrail took the file)
/// or `RING_ABANDONED` (the process stopped waiting first).
const STATE_AT: usize = 48;
const ADOPTED: u32 = 1;
/// ... then memtrail stopped reading the file (the shim's `RING_CLOSED`):
/// a writer waiting for room there takes the hook path instead.
const CLOSED: u32 = 3;
/// The name the shim gives its memfd (`/memfd:NAME` in /proc).
const MEMFD_NAME: &str = "memtrail_rings";
/// The most frames a stack record of the shim may hold.
pub(super) const MAX_FRAMES: usize = crate::bpf::record::MAX_FRAMES;
/// The record kinds whose bodies name their process again.
pub(super) const KIND_STACK: u32 = crate::bpf::skel::memtrail::types::mt_kind::MT_SHIM_STACK.0;
pub(super) const KIND_PY_CODE: u32 = crate::bpf::skel::memtrail::types::mt_kind::MT_SHIM_PY_CODE.0;
pub(super) const KIND_FREE_BATCH: u32 = crate::bpf::skel::memtrail::types::mt_kind::MT_FREE_BATCH.0;

/// The shortest record of each kind the shim writes: a stack's header,
/// id and packed word; a code record; a batch of one free; an event.
pub(super) fn shortest(kind: u32) -> usize {
    use crate::bpf::skel::memtrail::types as t;
    let header = std::mem::size_of::<t::mt_header>();
    match kind {
        KIND_STACK => header + 16,
        KIND_PY_CODE => header + std::mem::size_of::<t::mt_py_code_record>(),
        KIND_FREE_BATCH => header + 8,
        _ => std::mem::size_of::<t::mt_alloc_event>(),
    }
}
/// memtrail walks Python frames: a Python process walks them itself with
/// its version's layout, or keeps the hook path without one.
const FLAG_PYTHON: u32 = 1;
/// The shim walks every stack (`RING_F_NO_STACK_CACHE`).
const FLAG_NO_STACK_CACHE: u32 = 2;
const PAGE: usize = 4096;
/// Where the claim words start in the control page.
const CLAIMS_AT: usize = 64;
/// Where they must end: the Python layouts follow.
const LAYOUTS_AT: usize = 2048;
/// Bytes of one Python layout; as many as the shim reads.
const LAYOUT: usize = 64;
const LAYOUTS: usize = 4;
/// Where the layouts of interpreter images start: each the image's device
/// (kernel encoding) and inode, then a layout (`struct ring_py_image`).
const IMAGE_LAYOUTS_AT: usize = LAYOUTS_AT + LAYOUT * LAYOUTS;
const IMAGE_LAYOUT: usize = 16 + LAYOUT;
const IMAGE_LAYOUTS: usize = 16;
const _: () = assert!(IMAGE_LAYOUTS_AT + IMAGE_LAYOUT * IMAGE_LAYOUTS <= PAGE);

/// How the rings are made.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Rings of each process: its threads that write at the same time on
    /// the ring path (one more takes the hook path until a ring is free).
    pub rings: u32,
    /// Each ring's data bytes (a power of two, at least a page).
    pub data_size: u32,
    /// Stack ids each ring remembers (a power of two).
    pub dedup_slots: u32,
    /// Frames a stack keeps (`--stack-depth`); 0: no stacks.
    pub stack_depth: u32,
    /// Whether memtrail walks Python frames.
    pub python: bool,
    /// Whether the shim gives a walk it kept again while the stack words
    /// the walk read are unchanged (its stack cache; off only for a
    /// test's reference).
    pub stack_cache: bool,
}

/// The CPython layouts the shim walks Python frames with: each 3.minor (a
/// `u32`, 0: none), 4 bytes, then `struct mt_py_offsets` (the session gives
/// `python::shim_layouts`).
pub type PythonLayouts = [[u8; LAYOUT]; LAYOUTS];

impl Default for Settings {
    fn default() -> Self {
        Self {
            rings: 16,
            data_size: 1 << 20,
            dedup_slots: 8192,
            stack_depth: 0,
            python: false,
            stack_cache: true,
        }
    }
}

impl Settings {
    /// The control page's flags word.
    fn flags(&self) -> u32 {
        let mut flags = 0;
        if self.python {
            flags |= FLAG_PYTHON;
        }
        if !self.stack_cache {
            flags |= FLAG_NO_STACK_CACHE;
        }
        flags
    }

    fn ring_pages(&self) -> usize {
        2 + self.data_size as usize / PAGE + (8 * self.dedup_slots as usize).div_ceil(PAGE)
    }

    fn ring_offset(&self, i: usize) -> u64 {
        (PAGE * (1 + i * self.ring_pages())) as u64
    }

    fn file_len(&self) -> u64 {
        self.ring_offset(self.rings as usize)
    }
}

/// One process's ring file and memtrail's read-write mapping of it
/// (claims, and the headers of records their writers left unfinished).
pub struct ShimRings {
    /// The process whose file it is (the kernel's word: see the module's
    /// docs).
    owner: u32,
    file: OwnedFd,
    map: MmapMut,
    settings: Settings,
    /// Clock reading of the last reap.
    reaped_at: u64,
}

/// The rings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ShimRingsError {
    #[error("taking the ring file of process {pid}")]
    Take {
        pid: u32,
        #[source]
        source: crate::sys::SysError,
    },
    #[error("process {0} stopped waiting for memtrail to take its ring file")]
    Abandoned(u32),
    #[error("mapping the preload shim's rings")]
    Map(#[source] std::io::Error),
    #[error(transparent)]
    Ring(#[from] RingError),
}

/// What was wrong with a process's ring file: it was read no further, and
/// that process's counts are incomplete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingFault {
    /// The process whose file it is.
    pub pid: u32,
    /// The ring, and the position in it where reading stopped.
    pub ring: u32,
    pub offset: u64,
    pub what: &'static str,
}

/// The longest the poller of these rings sleeps: the shim's writers do not
/// wake it (a ring of [`Settings::data_size`] holds ~16,000 records: a
/// thread allocating flat out fills it in a few milliseconds, then waits).
pub const UNWOKEN_LATENCY: std::time::Duration = std::time::Duration::from_millis(1);

/// How often the rings of threads that are gone are looked for.
const REAP_EVERY_NS: u64 = 100_000_000;

/// The ring files of a capture's processes: what each gets when memtrail
/// takes it, and where they go (the events poller's [`super::merge::Merged`]).
pub struct Offer {
    settings: Settings,
    python: PythonLayouts,
    images: std::sync::Arc<ImageLayouts>,
    to_merge: std::sync::mpsc::Sender<ShimRings>,
    faults: std::sync::Arc<Faults>,
}

/// The ring faults of a capture, as the merge finds them, and the
/// allocations of each process's file that named stacks it never carried.
#[derive(Default)]
pub struct Faults(
    std::sync::Mutex<Vec<RingFault>>,
    std::sync::Mutex<Vec<(u32, crate::profile::UnrecordedStacks)>>,
);

impl Faults {
    /// Notes `fault` (the aggregation names the process at the end).
    pub fn add(&self, fault: RingFault) {
        tracing::debug!(
            pid = fault.pid,
            ring = fault.ring,
            offset = fault.offset,
            what = fault.what,
            "a preload ring file read no further"
        );
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(fault);
    }

    /// The faults so far.
    pub fn list(&self) -> Vec<RingFault> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds `more` to what process `pid`'s files named and never carried.
    pub fn add_unrecorded(&self, pid: u32, more: crate::profile::UnrecordedStacks) {
        let mut all = self.1.lock().unwrap_or_else(|e| e.into_inner());
        match all.iter_mut().find(|(p, _)| *p == pid) {
            Some((_, u)) => u.add(&more),
            None => all.push((pid, more)),
        }
    }

    /// Per process (in order of its first), the allocations its ring file
    /// named stacks with that it never carried, so far.
    pub fn unrecorded(&self) -> Vec<(u32, crate::profile::UnrecordedStacks)> {
        self.1.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The other end of an [`Offer`]: the ring files taken, for the merge.
pub struct Taken {
    pub(super) files: std::sync::mpsc::Receiver<ShimRings>,
    pub(super) faults: std::sync::Arc<Faults>,
}

impl Offer {
    /// The files of `settings`; with `settings.python`, the shim walks the
    /// Python frames of the versions `python` has the layout of.
    pub fn new(settings: Settings, python: &PythonLayouts) -> (Self, Taken) {
        assert!(settings.data_size.is_power_of_two() && settings.data_size as usize >= PAGE);
        assert!(settings.dedup_slots.is_power_of_two());
        assert!(CLAIMS_AT + 8 * settings.rings as usize <= LAYOUTS_AT);
        let (to_merge, files) = std::sync::mpsc::channel();
        let faults = std::sync::Arc::default();
        let offer = Self {
            settings,
            python: *python,
            images: std::sync::Arc::default(),
            to_merge,
            faults: std::sync::Arc::clone(&faults),
        };
        (offer, Taken { files, faults })
    }

    /// Where memtrail gives the shim the layouts of the interpreter images
    /// it finds (their version has no layout of its own here).
    pub fn image_layouts(&self) -> std::sync::Arc<ImageLayouts> {
        std::sync::Arc::clone(&self.images)
    }

    /// The ring faults found so far.
    pub fn faults(&self) -> Vec<RingFault> {
        self.faults.list()
    }

    /// Per process, the allocations its ring file named stacks with that
    /// it never carried ([`super::merge`]: counted, handed on in no stack).
    pub fn unrecorded(&self) -> Vec<(u32, crate::profile::UnrecordedStacks)> {
        self.faults.unrecorded()
    }

    /// Takes the ring file process `pid` named (its descriptor `fd` in that
    /// process: an `MT_SHIM_RINGS` record, whose ids are the kernel's) and
    /// hands it to the merge; the process then writes to it.
    pub fn adopt(&self, pid: u32, fd: u64) -> Result<(), ShimRingsError> {
        let take = |source| ShimRingsError::Take { pid, source };
        let file =
            crate::sys::take_memfd(pid, fd, MEMFD_NAME, self.settings.file_len()).map_err(take)?;
        let rings = ShimRings::fill(pid, file, self.settings, &self.python, &self.images)?;
        // The merge takes it in at its next look, before the process can
        // write (it waits for the magic, written last).
        rings.publish();
        // A closed receiver: the capture is ending.
        let _ = self.to_merge.send(rings);
        Ok(())
    }
}

impl ShimRings {
    /// Fills process `owner`'s file (sized and sealed) and maps it; the
    /// handshake word taken, the magic not yet written.
    fn fill(
        owner: u32,
        file: OwnedFd,
        settings: Settings,
        python: &PythonLayouts,
        images: &ImageLayouts,
    ) -> Result<Self, ShimRingsError> {
        // SAFETY: a memfd sealed against shrinking (take_memfd), shared
        // with its process, whose writes memtrail reads only through
        // atomics or after their commit.
        let mut map = unsafe { MmapOptions::new().map_mut(&file) }.map_err(ShimRingsError::Map)?;
        if let Err(err) = map.advise(memmap2::Advice::DontFork) {
            tracing::debug!(%err, "shim rings: MADV_DONTFORK not set");
        }
        let words: [(usize, u32); 8] = [
            (8, VERSION),
            (12, settings.rings),
            (16, settings.data_size),
            (20, settings.dedup_slots),
            (24, settings.stack_depth),
            (28, settings.flags()),
            (32, std::process::id()),
            (36, settings.ring_pages() as u32),
        ];
        for (at, v) in words {
            map[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        }
        // memtrail's PID namespace: a process in another one (a sandbox's)
        // names itself with ids memtrail does not see, and keeps the hook
        // path (BPF translates its ids).
        let pidns = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| {
            use std::os::unix::fs::MetadataExt;
            m.ino()
        });
        map[40..48].copy_from_slice(&pidns.to_ne_bytes());
        map[CLAIMS_AT..LAYOUTS_AT].fill(0);
        if settings.python {
            map[LAYOUTS_AT..LAYOUTS_AT + LAYOUT * LAYOUTS].copy_from_slice(python.as_flattened());
        }
        images.write(&mut map[IMAGE_LAYOUTS_AT..PAGE]);
        let rings = Self {
            owner,
            file,
            map,
            settings,
            reaped_at: 0,
        };
        // The process may have stopped waiting: it keeps the hook path.
        rings
            .word(STATE_AT)
            .compare_exchange(0, ADOPTED, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| ShimRingsError::Abandoned(owner))?;
        Ok(rings)
    }

    /// Lets the process write: the magic, last (the shim waits for it).
    fn publish(&self) {
        // SAFETY: 8-aligned, inside the control page, which lives as long
        // as `self`. Release: the control page's words before it are seen
        // by the shim's acquiring load of the magic.
        unsafe { &*self.map.as_ptr().cast::<AtomicU64>() }.store(MAGIC, Ordering::Release);
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        assert!(at % 4 == 0 && at + 4 <= PAGE);
        // SAFETY: 4-aligned, inside the control page, which lives as long
        // as `self`; the shim updates it atomically.
        unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU32>() }
    }

    /// Tells the process its file is read no more.
    pub fn close(&self) {
        self.word(STATE_AT).store(CLOSED, Ordering::Release);
    }

    /// The process whose file it is.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Whether that process is gone (a zombie, or reaped): nothing writes
    /// to the file any more.
    pub fn owner_gone(&self) -> bool {
        !thread_alive(self.owner, self.owner)
    }

    /// The data bytes of each ring.
    pub fn data_size(&self) -> u64 {
        u64::from(self.settings.data_size)
    }

    /// A consumer for each ring.
    pub fn consumers(&self) -> Result<Vec<RingConsumer>, RingError> {
        (0..self.settings.rings as usize)
            .map(|i| {
                RingConsumer::from_file(
                    self.file.as_fd(),
                    self.settings.ring_offset(i),
                    self.settings.data_size as usize,
                )
            })
            .collect()
    }

    fn claim(&self, i: usize) -> &AtomicU64 {
        let at = CLAIMS_AT + 8 * i;
        assert!(at + 8 <= PAGE);
        // SAFETY: 8-aligned, inside the control page, which lives as long
        // as `self`; the shim updates claims atomically.
        unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// Gives back the rings of threads that are gone, at most every
    /// [`REAP_EVERY_NS`] of `clock` (a monotonic reading) unless `now` is
    /// asked: a record such a thread left unfinished is discarded (the
    /// ring's reader stops at it otherwise). `rings` are the consumers of
    /// [`Self::consumers`], in order. Returns whether it looked.
    pub fn reap(&mut self, rings: &[RingConsumer], clock: u64, now: bool) -> bool {
        if !now && clock.saturating_sub(self.reaped_at) < REAP_EVERY_NS {
            return false;
        }
        self.reaped_at = clock;
        let mut given = 0;
        for (i, ring) in rings.iter().enumerate() {
            let owner = self.claim(i).load(Ordering::Acquire);
            if owner == 0 || thread_alive((owner >> 32) as u32, owner as u32) {
                continue;
            }
            self.discard_unfinished(i, ring);
            if self
                .claim(i)
                .compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                given += 1;
            }
        }
        if given > 0 {
            tracing::debug!(
                rings = given,
                "shim rings of threads that are gone given back"
            );
        }
        true
    }

    /// Marks discarded the busy records of every ring: the process is gone
    /// (see [`Self::owner_gone`]), and nothing will complete them.
    pub fn discard_all_unfinished(&self, rings: &[RingConsumer]) {
        for (i, ring) in rings.iter().enumerate() {
            self.discard_unfinished(i, ring);
        }
    }

    /// Marks discarded a busy record of ring `i`, whose writer is gone: the
    /// last one it reserved (a ring has one writer at a time).
    fn discard_unfinished(&self, i: usize, ring: &RingConsumer) {
        let size = self.settings.data_size as u64;
        let data = self.settings.ring_offset(i) as usize + 2 * PAGE;
        let (mut pos, prod) = (ring.position(), ring.producer_pos());
        while pos < prod {
            let at = data + (pos & (size - 1)) as usize;
            // SAFETY: 8-aligned (records are 8-byte padded), inside ring
            // i's data area of the mapping, which lives as long as `self`.
            let header = unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU32>() };
            let word = header.load(Ordering::Acquire);
            if word & BUSY_BIT != 0 {
                header.store((word & !BUSY_BIT) | DISCARD_BIT, Ordering::Release);
            }
            let body = u64::from(word & !(BUSY_BIT | DISCARD_BIT));
            if body > size {
                break;
            }
            pos += (HEADER_LEN as u64 + body + 7) & !7;
        }
    }
}

/// The layouts of interpreter images, for the control pages of the files
/// taken after they were found: a process whose interpreter is one of
/// them walks its Python frames itself (3.13+, whose layout memtrail reads
/// from the image).
#[derive(Default)]
pub struct ImageLayouts {
    /// Each image's key (`crate::sys::image_key`) and layout, in the order
    /// found, at most [`IMAGE_LAYOUTS`].
    found: std::sync::Mutex<Vec<([u8; 16], [u8; LAYOUT])>>,
}

impl ImageLayouts {
    /// Gives the shim image `(dev, ino)`'s layout (as [`PythonLayouts`]'
    /// are), unless it has it or no slot is free.
    pub fn publish(&self, id: crate::sys::FileId, layout: &[u8; LAYOUT]) {
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        let key = crate::sys::image_key(id);
        if found.iter().any(|(k, _)| *k == key) {
            return;
        }
        if found.len() == IMAGE_LAYOUTS {
            tracing::debug!(
                dev = id.dev,
                ino = id.ino,
                "preload shim: no slot left for an interpreter's layout"
            );
            return;
        }
        found.push((key, *layout));
    }

    /// Writes the layouts into a control page's image slots (`struct
    /// ring_py_image`: the key, then the layout; its version word set).
    fn write(&self, slots: &mut [u8]) {
        let found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        for (i, (key, layout)) in found.iter().enumerate() {
            let at = IMAGE_LAYOUT * i;
            slots[at..at + 16].copy_from_slice(key);
            slots[at + 16..at + 16 + LAYOUT].copy_from_slice(layout);
        }
    }
}

/// Whether thread `tid` of process `tgid` still runs (not a zombie).
fn thread_alive(tgid: u32, tid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/stat")) else {
        return false;
    };
    // pid (comm) state ...: comm may hold spaces and parentheses.
    let state = stat
        .rfind(')')
        .and_then(|at| stat[at + 1..].split_ascii_whitespace().next());
    !matches!(state, Some("Z" | "X" | "x") | None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring file as the shim makes it (a page, unsealed), in this
    /// process, taken through an offer of `settings`.
    fn taken(settings: Settings, images: &[(crate::sys::FileId, [u8; LAYOUT])]) -> ShimRings {
        use std::os::fd::AsRawFd;
        let fd = rustix::fs::memfd_create(
            MEMFD_NAME,
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .expect("memfd");
        rustix::fs::ftruncate(&fd, PAGE as u64).expect("ftruncate");
        let (offer, taken) = Offer::new(settings, &[[7; LAYOUT]; LAYOUTS]);
        for (image, layout) in images {
            offer.image_layouts().publish(*image, layout);
        }
        offer
            .adopt(std::process::id(), fd.as_raw_fd() as u64)
            .expect("taken");
        taken.files.try_recv().expect("handed to the merge")
    }

    /// Check the control page the shim reads (preload/ring.h, struct
    /// ring_control) and that each ring reads as a BPF ring.
    #[test]
    fn control_page_and_rings() {
        let settings = Settings {
            rings: 3,
            data_size: 8192,
            dedup_slots: 1024,
            stack_depth: 64,
            python: true,
            stack_cache: true,
        };
        let rings = taken(settings, &[]);
        let word = |at: usize| u32::from_ne_bytes(rings.map[at..at + 4].try_into().unwrap());
        assert_eq!(rings.map[..8], MAGIC.to_ne_bytes());
        assert_eq!(
            (word(8), word(12), word(16), word(20), word(24), word(28)),
            (VERSION, 3, 8192, 1024, 64, FLAG_PYTHON)
        );
        assert_eq!(word(36), 2 + 2 + 2);
        assert_eq!(word(STATE_AT), ADOPTED);
        let uncached = Settings {
            stack_cache: false,
            ..settings
        };
        let other = taken(uncached, &[]);
        let flags = u32::from_ne_bytes(other.map[28..32].try_into().unwrap());
        assert_eq!(flags, FLAG_PYTHON | FLAG_NO_STACK_CACHE);
        // The claims end before the Python layouts the shim reads.
        assert!(rings.map[CLAIMS_AT..LAYOUTS_AT].iter().all(|&b| b == 0));
        let layouts = &rings.map[LAYOUTS_AT..LAYOUTS_AT + LAYOUT * LAYOUTS];
        assert!(layouts.iter().all(|&b| b == 7));
        assert_eq!(rings.map.len() as u64, settings.file_len());
        assert_eq!(rings.owner(), std::process::id());
        assert!(!rings.owner_gone());
        let consumers = rings.consumers().expect("consumers");
        assert_eq!(consumers.len(), 3);
        assert!(consumers.iter().all(|c| c.producer_pos() == 0));
    }

    /// Check that a file that is not an unsealed memfd of the shim's name,
    /// or one its process gave up on, is not taken (issue 40).
    #[test]
    fn only_fresh_ring_memfds_are_taken() {
        use std::os::fd::AsRawFd;
        let (offer, taken) = Offer::new(Settings::default(), &[[0; LAYOUT]; LAYOUTS]);
        let me = std::process::id();
        let file = std::fs::File::open("/proc/self/exe").expect("exe");
        assert!(offer.adopt(me, file.as_raw_fd() as u64).is_err());
        let other = crate::sys::sized_memfd(MEMFD_NAME, PAGE as u64).expect("memfd");
        assert!(offer.adopt(me, other.as_raw_fd() as u64).is_err(), "sealed");
        let named = rustix::fs::memfd_create("other", rustix::fs::MemfdFlags::ALLOW_SEALING)
            .expect("memfd");
        assert!(
            offer.adopt(me, named.as_raw_fd() as u64).is_err(),
            "another name"
        );
        let gave_up = rustix::fs::memfd_create(MEMFD_NAME, rustix::fs::MemfdFlags::ALLOW_SEALING)
            .expect("memfd");
        rustix::fs::ftruncate(&gave_up, PAGE as u64).expect("ftruncate");
        let state = 2u32.to_ne_bytes();
        rustix::io::pwrite(&gave_up, &state, STATE_AT as u64).expect("pwrite");
        assert!(matches!(
            offer.adopt(me, gave_up.as_raw_fd() as u64),
            Err(ShimRingsError::Abandoned(_))
        ));
        assert!(offer.adopt(me, 1 << 40).is_err());
        assert!(taken.files.try_recv().is_err());
    }

    /// Check that an interpreter image's layout lands where the shim reads
    /// it (struct ring_py_image: device, inode, then the layout, its
    /// version word set), once per image.
    #[test]
    fn image_layouts_published_once() {
        let id = |dev, ino| crate::sys::FileId { dev, ino };
        let mut layout = [9u8; LAYOUT];
        layout[..4].copy_from_slice(&13u32.to_ne_bytes());
        let rings = taken(
            Settings::default(),
            &[
                (id(5, 77), layout),
                (id(5, 77), layout),
                (id(5, 78), layout),
            ],
        );
        let at = |i: usize| IMAGE_LAYOUTS_AT + IMAGE_LAYOUT * i;
        let word = |at: usize| u64::from_ne_bytes(rings.map[at..at + 8].try_into().unwrap());
        assert_eq!((word(at(0)), word(at(0) + 8)), (5, 77));
        assert_eq!(rings.map[at(0) + 16..at(0) + 20], 13u32.to_ne_bytes());
        assert_eq!(rings.map[at(0) + 20..at(1)], layout[4..]);
        assert_eq!((word(at(1)), word(at(1) + 8)), (5, 78));
        assert!(rings.map[at(2)..at(3)].iter().all(|&b| b == 0));
    }

    #[test]
    fn gone_threads_are_not_alive() {
        assert!(thread_alive(std::process::id(), std::process::id()));
        assert!(!thread_alive(std::process::id(), u32::MAX - 1));
    }
}

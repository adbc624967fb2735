//! The preload shim's rings (`memtrail run --preload`, issue 22): where the
//! shim's threads write their records themselves, without a kernel entry.
//!
//! One memfd of memtrail's, named to the command in `MEMTRAIL_SHM` as
//! `/proc/<memtrail>/fd/<n>` (as the shim itself is in `LD_PRELOAD`):
//! - page 0, the control page: [`MAGIC`], the layout, the walk's settings,
//!   memtrail's PID namespace, then one claim word per ring at byte 64 (`tgid << 32 | tid` of the
//!   thread that writes it, 0 while it is free), and at byte 2048 the
//!   CPython layouts the shim walks Python frames with: one per version
//!   ([`PythonLayouts`]), then those of interpreter images memtrail found
//!   ([`ImageLayouts`]);
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
//! `preload/memtrail_preload.c` ("The ring path").

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapMut, MmapOptions};

use super::{BUSY_BIT, DISCARD_BIT, HEADER_LEN, RingConsumer, RingError};

/// "MTRLSHM1", the control page's first word.
pub const MAGIC: u64 = 0x314d_4853_4c54_524d;
/// The layout's version, checked by the shim.
const VERSION: u32 = 2;
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
    /// Rings: threads that write at the same time on the ring path (one
    /// more takes the hook path until a ring is free).
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
            rings: 64,
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

/// The file and memtrail's read-write mapping of it (claims, and the
/// headers of records their writers left unfinished).
pub struct ShimRings {
    file: OwnedFd,
    map: MmapMut,
    settings: Settings,
    /// Clock reading of the last reap.
    reaped_at: u64,
}

/// The rings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ShimRingsError {
    #[error("making the preload shim's rings")]
    Make(#[source] crate::sys::SysError),
    #[error("mapping the preload shim's rings")]
    Map(#[source] std::io::Error),
    #[error(transparent)]
    Ring(#[from] RingError),
}

/// The longest the poller of these rings sleeps: the shim's writers do not
/// wake it (a ring of [`Settings::data_size`] holds ~16,000 records: a
/// thread allocating flat out fills it in a few milliseconds, then waits).
pub const UNWOKEN_LATENCY: std::time::Duration = std::time::Duration::from_millis(1);

/// How often the rings of threads that are gone are looked for.
const REAP_EVERY_NS: u64 = 100_000_000;

impl ShimRings {
    /// The rings of `settings`; with `settings.python`, the shim walks the
    /// Python frames of the versions `python` has the layout of.
    pub fn new(settings: Settings, python: &PythonLayouts) -> Result<Self, ShimRingsError> {
        assert!(settings.data_size.is_power_of_two() && settings.data_size as usize >= PAGE);
        assert!(settings.dedup_slots.is_power_of_two());
        assert!(CLAIMS_AT + 8 * settings.rings as usize <= LAYOUTS_AT);
        let file = crate::sys::sized_memfd("memtrail_rings", settings.file_len())
            .map_err(ShimRingsError::Make)?;
        // SAFETY: memtrail's own memfd, shared with the shim, whose writes
        // memtrail reads only through atomics or after their commit.
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
        if settings.python {
            map[LAYOUTS_AT..LAYOUTS_AT + LAYOUT * LAYOUTS].copy_from_slice(python.as_flattened());
        }
        // Last: the shim checks the magic first.
        map[..8].copy_from_slice(&MAGIC.to_ne_bytes());
        Ok(Self {
            file,
            map,
            settings,
            reaped_at: 0,
        })
    }

    /// `MEMTRAIL_SHM` for the command: the file, through memtrail's
    /// descriptor table.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.file.as_raw_fd()
        ))
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

    /// Where memtrail gives the shim the layouts of the interpreter images
    /// it finds (their version has no layout of its own here).
    pub fn image_layouts(&self) -> Result<std::sync::Arc<ImageLayouts>, ShimRingsError> {
        // SAFETY: the control page of memtrail's own memfd; the shim reads
        // a layout only once its version word is set, written last.
        let map = unsafe { MmapOptions::new().len(PAGE).map_mut(&self.file) }
            .map_err(ShimRingsError::Map)?;
        Ok(std::sync::Arc::new(ImageLayouts {
            map: std::sync::Mutex::new(map),
        }))
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
    /// [`Self::consumers`], in order. Returns the rings given back.
    pub fn reap(&mut self, rings: &[RingConsumer], clock: u64, now: bool) -> usize {
        if !now && clock.saturating_sub(self.reaped_at) < REAP_EVERY_NS {
            return 0;
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
        given
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

/// The layouts of interpreter images in the control page: a process whose
/// interpreter is one of them walks its Python frames itself (3.13+, whose
/// layout memtrail reads from the image).
pub struct ImageLayouts {
    /// The control page, mapped again: written once per image.
    map: std::sync::Mutex<MmapMut>,
}

impl ImageLayouts {
    /// Gives the shim image `(dev, ino)`'s layout (as
    /// [`PythonLayouts`]' are), unless it has it or no slot is free.
    pub fn publish(&self, (dev, ino): (u64, u64), layout: &[u8; LAYOUT]) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let key = crate::sys::image_key((dev, ino));
        for i in 0..IMAGE_LAYOUTS {
            let at = IMAGE_LAYOUTS_AT + IMAGE_LAYOUT * i;
            let version = at + 16;
            // SAFETY: 4-aligned, inside the mapped control page.
            let set = unsafe { AtomicU32::from_ptr(map[version..].as_mut_ptr().cast()) };
            if set.load(Ordering::Acquire) != 0 {
                if map[at..at + 16] == key {
                    return;
                }
                continue;
            }
            map[at..at + 16].copy_from_slice(&key);
            map[version + 4..version + LAYOUT].copy_from_slice(&layout[4..]);
            // Last: the shim reads a slot whose version is set.
            let minor = u32::from_ne_bytes(layout[..4].try_into().expect("4 bytes"));
            // SAFETY: as above.
            let set = unsafe { AtomicU32::from_ptr(map[version..].as_mut_ptr().cast()) };
            set.store(minor, Ordering::Release);
            return;
        }
        tracing::debug!(
            dev,
            ino,
            "preload shim: no slot left for an interpreter's layout"
        );
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

    /// Check the control page the shim reads (preload/memtrail_preload.c,
    /// struct ring_control) and that each ring reads as a BPF ring.
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
        let rings = ShimRings::new(settings, &[[7; LAYOUT]; LAYOUTS]).expect("rings");
        let word = |at: usize| u32::from_ne_bytes(rings.map[at..at + 4].try_into().unwrap());
        assert_eq!(rings.map[..8], MAGIC.to_ne_bytes());
        assert_eq!(
            (word(8), word(12), word(16), word(20), word(24), word(28)),
            (VERSION, 3, 8192, 1024, 64, FLAG_PYTHON)
        );
        assert_eq!(word(36), 2 + 2 + 2);
        let uncached = Settings {
            stack_cache: false,
            ..settings
        };
        let other = ShimRings::new(uncached, &[[7; LAYOUT]; LAYOUTS]).expect("rings");
        let flags = u32::from_ne_bytes(other.map[28..32].try_into().unwrap());
        assert_eq!(flags, FLAG_PYTHON | FLAG_NO_STACK_CACHE);
        // The claims end before the Python layouts the shim reads.
        assert!(rings.map[CLAIMS_AT..LAYOUTS_AT].iter().all(|&b| b == 0));
        let layouts = &rings.map[LAYOUTS_AT..LAYOUTS_AT + LAYOUT * LAYOUTS];
        assert!(layouts.iter().all(|&b| b == 7));
        assert_eq!(rings.map.len() as u64, settings.file_len());
        let consumers = rings.consumers().expect("consumers");
        assert_eq!(consumers.len(), 3);
        assert!(consumers.iter().all(|c| c.producer_pos() == 0));
    }

    /// Check that an interpreter image's layout lands where the shim reads
    /// it (struct ring_py_image: device, inode, then the layout, its
    /// version word set), once per image.
    #[test]
    fn image_layouts_published_once() {
        let rings = ShimRings::new(Settings::default(), &[[0; LAYOUT]; LAYOUTS]).expect("rings");
        let layouts = rings.image_layouts().expect("layouts");
        let mut layout = [9u8; LAYOUT];
        layout[..4].copy_from_slice(&13u32.to_ne_bytes());
        layouts.publish((5, 77), &layout);
        layouts.publish((5, 77), &layout);
        layouts.publish((5, 78), &layout);
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

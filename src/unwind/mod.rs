//! Unwind tables for the BPF stack walker (issue 12).
//!
//! Most programs are built without frame pointers, so the BPF program
//! unwinds from tables: for every executable image the attach pipeline
//! examines, [`table::compile`] reduces its `.eh_frame` (or `.debug_frame`)
//! to rows the walker evaluates, and [`Tables`] loads them into the BPF
//! maps: an array of slots shared by all images, which grows in shards of
//! [`SHARD_SLOTS`] (`unwind_rows` the first, the others made here and put
//! in `unwind_shards` as tables need them; each written through its
//! mapping), and `unwind_images` (file identity -> its slots, bias). An
//! image's slots are its page index then its rows. An image gets its table
//! before its code runs: up front for the libraries every command loads
//! and the image cache's newest (within [`CACHED_ROWS`]), else while the
//! attach hold keeps the process that mapped it stopped.
//!
//! Invariants:
//! - Slots are written before the image's `unwind_images` entry (a
//!   syscall, which orders them for BPF), and a shard is in `unwind_shards`
//!   before any entry leads to it; a table's slots never change while a
//!   walk can reach them, so the walker never sees a half-written table.
//! - One table per image (device and inode), shared by every process that
//!   maps it; compiled tables are cached on disk by build id, so the next
//!   run of the same image only reads its rows.
//! - A table lives while some process maps its image (issue 23): before
//!   the slots grow by a shard, the tables of images no process maps any
//!   more are released ([`release`]: the kernel's mappings decide, so
//!   forks, exec, exit, munmap and dlclose all count as the kernel counts
//!   them) and their slots ([`slots::Free`]) taken first. The tables of
//!   the runtimes loaded up front (libc, the dynamic loader, the C++
//!   runtimes, which a process may map without asking) and of images
//!   probed per process stay.
//! - No image's room depends on another's (issue 23): the slots grow by
//!   whole shards as long as the kernel gives memory for them; the image
//!   cache's tables loaded up front only save preparation time (they are
//!   the first released when room is needed).
//! - Nothing here fails a capture: an image without CFI, a table the
//!   kernel gave no memory for, or an unreadable one gets a warning naming
//!   the image, and its frames take frame-pointer steps (or end the stack,
//!   with `--unwind dwarf`).

pub mod cache;
mod release;
pub mod slots;
pub mod table;

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use memmap2::MmapMut;

pub use release::ReleaseMaps;
pub use table::{Compiled, Row, Table};

/// Slots of one shard of the tables' array (`MT_UNWIND_SHARD`; a test
/// checks it against the BPF object): 8 MiB.
pub const SHARD_SLOTS: u32 = 1 << 20;

/// Shards past the first (`MT_UNWIND_SHARDS`).
pub const MORE_SHARDS: u32 = 1023;

/// The most rows the image cache's tables take up front, counting the
/// runtimes': a bound on start-up's memory and time, not on any image's
/// room. An image past it gets its table (from the cache) when mapped.
pub const CACHED_ROWS: u32 = SHARD_SLOTS / 2;

use crate::bpf::skel::memtrail::types::mt_unwind_image;
use crate::profile::unwind::{ImageTable, Mode, Outcome, StackEnd, TableMemory};
use crate::sys::{FileId, error_chain};

/// Errors preparing unwind tables.
#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse the call frame information: {0}")]
    Parse(String),
    #[error("cannot map the BPF unwind rows")]
    Map(#[source] std::io::Error),
    #[error("cannot add a shard of unwind rows")]
    Shard(#[source] std::io::Error),
}

/// The unwind maps of the loaded BPF object, and what went into them.
pub struct Tables {
    /// The shards' mappings, writable: `unwind_rows`, then those made here.
    shards: Vec<MmapMut>,
    /// `unwind_shards`.
    more: OwnedFd,
    /// Slots allocated: those below are in a table or free.
    next: u64,
    images: OwnedFd,
    /// `py_images`: the Python interpreters among the images (issue 25),
    /// none with `--native-only`.
    python: Option<OwnedFd>,
    /// With `--preload`: where the shim finds the layouts of interpreters
    /// whose version has none of its own there (3.13+).
    shim_layouts: Option<std::sync::Arc<crate::ring::shim::ImageLayouts>>,
    cache: Option<cache::Cache>,
    /// Every image seen, in order.
    pub images_seen: Vec<ImageTable>,
    /// Slots of released tables, taken before the array grows.
    free: slots::Free,
    /// The loaded tables, by image.
    loaded: HashMap<FileId, Loaded>,
    /// Images whose table was released and that were not loaded since.
    released: HashSet<FileId>,
    /// Slots in tables now, the most at once, tables released.
    in_use: u64,
    peak: u64,
    released_count: u64,
    /// What a release needs: see [`release`].
    release: release::Maps,
    /// Test fault (`MEMTRAIL_FAULT=sweep-unwind-tables`): look for tables
    /// to release at every load, not only before the slots grow.
    pub sweep_every_load: bool,
}

/// A loaded table's slots.
#[derive(Debug, Clone, Copy)]
struct Loaded {
    start: u64,
    len: u64,
    /// Its entry in `images_seen`.
    entry: usize,
    /// Never released (see the module's invariants).
    pinned: bool,
}

// The kernel lays array map elements out 8 bytes apart: a shard's mapping
// is an array of slots only if a slot (a row) takes 8 bytes.
const _: () = assert!(Row::SIZE == 8);

/// Maps the shard of slots `map`, writable, not copied into memtrail's
/// children (the command before its exec, the guardian: a fork copied the
/// page table of every mapped page, and the exec dropped it again).
fn map_shard(map: BorrowedFd<'_>) -> std::io::Result<MmapMut> {
    // SAFETY: the map is a BPF_F_MMAPABLE array of exactly SHARD_SLOTS
    // 8-byte slots (the BPF object's unwind_rows, or a shard made by
    // `Tables::grow` like it); the mapping keeps the map alive by itself,
    // and the BPF side only reads it.
    let shard = unsafe {
        memmap2::MmapOptions::new()
            .len(SHARD_SLOTS as usize * Row::SIZE)
            .map_mut(map.as_raw_fd())
    }?;
    if let Err(err) = shard.advise(memmap2::Advice::DontFork) {
        tracing::debug!(%err, "unwind tables: MADV_DONTFORK not set");
    }
    Ok(shard)
}

impl Tables {
    /// Maps `rows_map` (`unwind_rows`, the first shard), and keeps
    /// `shards_map` (`unwind_shards`) and `images_map` (`unwind_images`);
    /// `release` are the maps a table's release touches.
    pub fn new(
        rows_map: BorrowedFd<'_>,
        shards_map: BorrowedFd<'_>,
        images_map: BorrowedFd<'_>,
        python_map: Option<BorrowedFd<'_>>,
        release: ReleaseMaps<'_>,
    ) -> Result<Self, UnwindError> {
        let first = map_shard(rows_map).map_err(UnwindError::Map)?;
        Ok(Self {
            shards: vec![first],
            more: shards_map.try_clone_to_owned().map_err(UnwindError::Map)?,
            next: 0,
            images: images_map.try_clone_to_owned().map_err(UnwindError::Map)?,
            python: python_map
                .map(|m| m.try_clone_to_owned().map_err(UnwindError::Map))
                .transpose()?,
            shim_layouts: None,
            cache: cache::Cache::open(),
            images_seen: Vec::new(),
            free: slots::Free::default(),
            loaded: HashMap::new(),
            released: HashSet::new(),
            in_use: 0,
            peak: 0,
            released_count: 0,
            release: release::Maps::new(release),
            sweep_every_load: false,
        })
    }

    /// Gives the preload shim the layouts of the interpreters found from now
    /// on whose version it has no layout of (see `ring::shim::ImageLayouts`).
    pub fn with_shim_layouts(
        mut self,
        layouts: Option<std::sync::Arc<crate::ring::shim::ImageLayouts>>,
    ) -> Self {
        self.shim_layouts = layouts;
        self
    }

    /// Keeps image `id`'s table (loaded) for the whole capture.
    pub fn pin(&mut self, id: FileId) {
        if let Some(loaded) = self.loaded.get_mut(&id) {
            loaded.pinned = true;
        }
    }

    /// Whether image `id`'s table was released and not loaded since: a
    /// process maps the image again.
    pub fn was_released(&self, id: FileId) -> bool {
        self.released.contains(&id)
    }

    /// The tables' memory so far.
    pub fn memory_report(&self) -> TableMemory {
        TableMemory {
            peak_slots: self.peak,
            extent_slots: self.next,
            locked_bytes: self.memory(),
            released: self.released_count,
        }
    }

    /// Slots allocated so far (rows and page index entries, in tables or
    /// released).
    pub fn rows_used(&self) -> u64 {
        self.next
    }

    /// Bytes of locked memory the shards take.
    pub fn memory(&self) -> u64 {
        self.shards.len() as u64 * u64::from(SHARD_SLOTS) * Row::SIZE as u64
    }

    /// Adds shards until the slots reach `end`; false when the BPF map of
    /// shards is full.
    fn grow(&mut self, end: u64) -> Result<bool, UnwindError> {
        while (self.shards.len() as u64) * u64::from(SHARD_SLOTS) < end {
            let index = self.shards.len() as u32 - 1;
            if index >= MORE_SHARDS {
                return Ok(false);
            }
            let opts = libbpf_sys::bpf_map_create_opts {
                sz: size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
                map_flags: libbpf_sys::BPF_F_MMAPABLE,
                ..Default::default()
            };
            let shard = libbpf_rs::MapHandle::create(
                libbpf_rs::MapType::Array,
                Some("mt_unwind_shard"),
                4,
                Row::SIZE as u32,
                SHARD_SLOTS,
                &opts,
            )
            .map_err(|err| UnwindError::Shard(std::io::Error::other(err)))?;
            let mapped = map_shard(shard.as_fd()).map_err(UnwindError::Shard)?;
            let fd = shard.as_fd().as_raw_fd() as u32;
            crate::sys::bpf_map_update(self.more.as_fd(), &index.to_ne_bytes(), &fd.to_ne_bytes())
                .map_err(|err| UnwindError::Shard(err.source))?;
            self.shards.push(mapped);
        }
        Ok(true)
    }

    /// Slot `at`, writable (within the shards made).
    fn slot(&mut self, at: u64) -> &mut [u8] {
        let shard = (at / u64::from(SHARD_SLOTS)) as usize;
        let i = (at % u64::from(SHARD_SLOTS)) as usize * Row::SIZE;
        &mut self.shards[shard][i..i + Row::SIZE]
    }

    /// Prepares and loads the table of the image at `path` (a file whose
    /// device and inode are `id`, named `name` in warnings); warns, naming
    /// the image, when it has none or it does not fit.
    pub fn load(&mut self, path: &Path, name: &Path, id: FileId) -> &ImageTable {
        let started = Instant::now();
        let table = self.table_of(path);
        self.install_prepared(name, id, PreparedTable { table, micros: 0 }, started)
    }

    /// [`load`](Self::load) for a table [`prepare`]d already (on another
    /// thread); its time counts from `started` plus the preparation's.
    pub fn load_prepared(
        &mut self,
        name: &Path,
        id: FileId,
        prepared: PreparedTable,
    ) -> &ImageTable {
        self.install_prepared(name, id, prepared, Instant::now())
    }

    fn install_prepared(
        &mut self,
        name: &Path,
        id: FileId,
        prepared: PreparedTable,
        started: Instant,
    ) -> &ImageTable {
        if self.python.is_some() {
            self.note_python(name, id);
        }
        let (outcome, slot) = match prepared.table {
            Ok((Compiled::Table(table), cached)) => self.install(id, &table, cached),
            Ok((Compiled::NoCfi, _)) => (Outcome::NoCfi, None),
            Ok((Compiled::NoCode, _)) => (Outcome::NoCode, None),
            Err(err) => (
                Outcome::Failed {
                    reason: error_chain(&err),
                },
                None,
            ),
        };
        match &outcome {
            Outcome::Loaded { .. } => {}
            Outcome::NoCode => tracing::debug!(
                image = %name.display(),
                "no unwind information, and no code to walk through (a data-only library)"
            ),
            Outcome::NoCfi => tracing::warn!(
                target: crate::profile::NOTE,
                image = %name.display(),
                "no unwind information (stripped?): stacks through it take frame-pointer steps \
                 and may be shorter"
            ),
            Outcome::TooBig { rows, room } => tracing::warn!(
                target: crate::profile::NOTE,
                image = %name.display(),
                rows,
                room,
                "unwind table does not fit the BPF maps: stacks through it take frame-pointer \
                 steps and may be shorter"
            ),
            Outcome::Failed { reason } => tracing::warn!(
                target: crate::profile::NOTE,
                image = %name.display(),
                %reason,
                "cannot prepare an unwind table: stacks through it may be shorter"
            ),
        }
        self.images_seen.push(ImageTable {
            image: name.to_owned(),
            outcome,
            micros: prepared.micros + started.elapsed().as_micros() as u64,
            slot,
            released: false,
        });
        self.images_seen.last().expect("just pushed")
    }

    /// Records the image in `py_images` if it is a Python interpreter,
    /// before its table: walks through its code then find its frames.
    fn note_python(&self, path: &Path, id: FileId) {
        let Some(map) = &self.python else {
            return;
        };
        if let Some(interp) = crate::python::note_image(map.as_fd(), path, id)
            && let Some(shim) = &self.shim_layouts
            && !crate::python::shim_knows(interp.minor)
        {
            shim.publish(id, &crate::python::shim_layout(&interp));
        }
    }

    fn table_of(&self, path: &Path) -> Result<(Compiled, bool), UnwindError> {
        prepare(path, self.cache.as_ref())
    }

    /// Writes `table`'s page index and rows into free slots (released
    /// tables', else new ones) and makes them the image's; the outcome and
    /// the table's first slot.
    fn install(&mut self, id: FileId, table: &Table, cached: bool) -> (Outcome, Option<u64>) {
        let count = u32::try_from(table.rows.len()).unwrap_or(u32::MAX);
        // The page index, then the rows it indexes.
        let npages = match (table.rows.first(), table.rows.last()) {
            (Some(lo), Some(hi)) => u64::from((hi.pc >> 12) - (lo.pc >> 12) + 1),
            _ => 0,
        };
        let len = npages + 1 + table.rows.len() as u64;
        let start = match self.place(len, count) {
            Ok(start) => start,
            Err(outcome) => return (outcome, None),
        };
        let first_row = (start + npages + 1) as u32;
        let index = table.page_index(first_row);
        for (i, entry) in index.iter().enumerate() {
            let slot = Row {
                pc: *entry,
                ..Row::default()
            };
            slot.encode(self.slot(start + i as u64));
        }
        for (i, row) in table.rows.iter().enumerate() {
            row.encode(self.slot(u64::from(first_row) + i as u64));
        }
        let base_page = table.rows.first().map_or(0, |r| r.pc >> 12);
        let value = image_value(start as u32, npages as u32, base_page, table.bias);
        let key = crate::sys::image_key(id);
        // The update is a syscall: the slots written above (and the row
        // cache entries a release cleared) are visible to BPF before the
        // entry that leads to them.
        if let Err(err) = crate::sys::bpf_map_update(self.images.as_fd(), &key, &value) {
            self.free.give(start, len);
            return (
                Outcome::Failed {
                    reason: format!("recording the table in BPF: {err}"),
                },
                None,
            );
        }
        // An image loaded twice (not expected) keeps its first slots out
        // of use: a walk may still read them.
        self.loaded.insert(
            id,
            Loaded {
                start,
                len,
                entry: self.images_seen.len(),
                pinned: false,
            },
        );
        self.released.remove(&id);
        self.in_use += len;
        self.peak = self.peak.max(self.in_use);
        let outcome = Outcome::Loaded {
            rows: count,
            source: table.source.to_owned(),
            cached,
        };
        (outcome, Some(start))
    }

    /// `len` slots for a table of `count` rows: released tables' if they
    /// hold it, else new ones, after releasing the tables no process needs
    /// where the slots would otherwise grow by a shard.
    fn place(&mut self, len: u64, count: u32) -> Result<u64, Outcome> {
        if let Some(start) = self.free.take(len) {
            return Ok(start);
        }
        let made = self.shards.len() as u64 * u64::from(SHARD_SLOTS);
        if self.sweep_every_load || self.next + len > made {
            self.release_unmapped();
            if let Some(start) = self.free.take(len) {
                return Ok(start);
            }
        }
        // A released table's slots at the end, and new ones past them.
        let start = self.free.take_ending_at(self.next).unwrap_or(self.next);
        let end = start + len;
        let room = |this: &Self| {
            let shards = u64::from(MORE_SHARDS) + 1;
            (shards * u64::from(SHARD_SLOTS))
                .saturating_sub(this.next)
                .saturating_add(this.free.total())
                .min(u64::from(u32::MAX)) as u32
        };
        let grown = if end > u64::from(u32::MAX) {
            Ok(false)
        } else {
            self.grow(end)
        };
        if let Ok(true) = grown {
            self.next = self.next.max(end);
            return Ok(start);
        }
        self.free.give(start, self.next - start);
        Err(match grown {
            Err(err) => Outcome::Failed {
                reason: error_chain(&err),
            },
            _ => Outcome::TooBig {
                rows: count,
                room: room(self),
            },
        })
    }
}

/// An image's table as [`prepare`] gave it, and the time that took.
pub struct PreparedTable {
    pub table: Result<(Compiled, bool), UnwindError>,
    pub micros: u64,
}

/// The table of the image at `path`, from `cache` or compiled (and then
/// cached), or why it has none. The flag says whether it came from the
/// cache.
pub fn prepare(path: &Path, cache: Option<&cache::Cache>) -> Result<(Compiled, bool), UnwindError> {
    let data = crate::sys::map_file(path).map_err(|source| UnwindError::Read {
        path: path.to_owned(),
        source,
    })?;
    // Parsed from a file any tracked user can craft: a panic only costs
    // the cache (compile catches its own).
    let key = cache.and_then(|c| std::panic::catch_unwind(|| c.key(&data)).ok().flatten());
    let cache = cache.zip(key.as_deref());
    if let Some(table) = cache.and_then(|(c, id)| c.get(id)) {
        return Ok((Compiled::Table(table), true));
    }
    let compiled = table::compile(&data)?;
    if let (Compiled::Table(table), Some((c, id))) = (&compiled, cache) {
        c.put(id, table);
    }
    Ok((compiled, false))
}

/// `struct mt_unwind_image` for an image's rows.
fn image_value(
    pages: u32,
    npages: u32,
    base_page: u32,
    bias: i64,
) -> [u8; size_of::<mt_unwind_image>()] {
    use std::mem::offset_of;
    let mut value = [0u8; size_of::<mt_unwind_image>()];
    let mut put = |at: usize, bytes: &[u8]| value[at..at + bytes.len()].copy_from_slice(bytes);
    put(offset_of!(mt_unwind_image, pages), &pages.to_ne_bytes());
    put(offset_of!(mt_unwind_image, npages), &npages.to_ne_bytes());
    put(
        offset_of!(mt_unwind_image, base_page),
        &base_page.to_ne_bytes(),
    );
    put(offset_of!(mt_unwind_image, bias), &bias.to_ne_bytes());
    value
}

/// The tables of `images` whose file some process of the capture mapped
/// (`mappings`, the executable mappings recorded per process): tables
/// loaded up front for images that earlier captures saw (the image cache,
/// `attach::cache`) and that no process of this one mapped are left out
/// of the profile (issue 41: a busybox capture listed libjvm, ruby and
/// perl). An image is matched by path, or by its file's identity for a
/// mapping recorded by name only.
pub fn mapped_only(
    images: Vec<ImageTable>,
    mappings: &HashMap<u32, Vec<crate::symbolize::Mapping>>,
) -> Vec<ImageTable> {
    let paths: HashSet<&Path> = mappings
        .values()
        .flatten()
        .map(|m| m.path.as_path())
        .collect();
    let ids: HashSet<FileId> = mappings
        .values()
        .flatten()
        .filter_map(|m| m.file_id)
        .collect();
    images
        .into_iter()
        .filter(|t| {
            paths.contains(t.image.as_path())
                || crate::sys::kernel_file_id(&t.image).is_ok_and(|id| ids.contains(&id))
        })
        .collect()
}

/// The profile's account of unwinding: the mode, the images' tables, and
/// how many distinct stacks (and their bytes) ended before their outermost
/// frame, by reason.
pub fn report(
    mode: Mode,
    images: Vec<ImageTable>,
    tables: TableMemory,
    stacks: &[crate::profile::StackEntry],
) -> crate::profile::UnwindReport {
    let mut early: std::collections::BTreeMap<StackEnd, (u64, u64)> = Default::default();
    for stack in stacks.iter().filter(|s| s.end != StackEnd::Complete) {
        let e = early.entry(stack.end).or_default();
        e.0 += 1;
        e.1 += stack.metrics.bytes;
    }
    crate::profile::UnwindReport {
        mode,
        images,
        tables,
        ended_early: early
            .into_iter()
            .map(|(reason, (stacks, bytes))| crate::profile::EndedEarly {
                reason,
                stacks,
                bytes,
            })
            .collect(),
        // The allocating stacks (mapping sites allocate nothing).
        stacks: stacks.iter().filter(|s| s.metrics.allocations > 0).count() as u64,
        bytes: stacks.iter().map(|s| s.metrics.bytes).sum(),
    }
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use libbpf_rs::skel::SkelBuilder;

    use crate::bpf::skel::memtrail::MemtrailSkelBuilder;

    /// The shards userspace makes are the BPF object's: as many slots as
    /// its first, and as many as its map of shards holds.
    #[test]
    fn shard_sizes_are_the_bpf_objects() {
        let mut storage = MaybeUninit::uninit();
        let open = MemtrailSkelBuilder::default()
            .open(&mut storage)
            .expect("open memtrail's BPF object");
        assert_eq!(open.maps.unwind_rows.max_entries(), super::SHARD_SLOTS);
        assert_eq!(open.maps.unwind_shards.max_entries(), super::MORE_SHARDS);
    }
}

//! Unwind tables for the BPF stack walker (issue 12).
//!
//! Most programs are built without frame pointers, so the BPF program
//! unwinds from tables: for every executable image the attach pipeline
//! examines, [`table::compile`] reduces its `.eh_frame` (or `.debug_frame`)
//! to rows the walker evaluates, and [`Tables`] loads them into the BPF maps
//! `unwind_rows` (one array shared by all images, written through its
//! mapping) and `unwind_images` (file identity -> first row, row count,
//! bias). An image gets its table before its code runs: up front for the
//! libraries every command loads, else while the attach hold keeps the
//! process that mapped it stopped.
//!
//! Invariants:
//! - Rows are written before the image's `unwind_images` entry (a syscall,
//!   which orders them for BPF), and never change afterwards; rows are only
//!   appended, so the walker never sees a half-written table.
//! - One table per image (device and inode), shared by every process that
//!   maps it; compiled tables are cached on disk by build id, so the next
//!   run of the same image only reads its rows.
//! - Nothing here fails a capture: an image without CFI, a table too big
//!   for the maps, or an unreadable one gets a warning naming the image, and
//!   its frames take frame-pointer steps (or end the stack, with
//!   `--unwind dwarf`).

pub mod cache;
pub mod table;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use memmap2::MmapMut;

pub use table::{Compiled, Row, Table};

/// Rows the BPF rows map holds (`MT_UNWIND_ROWS`; a test checks it
/// against the BPF object).
pub const MAX_ROWS: u32 = 1 << 20;

/// The share of the rows the image cache's tables may take at start-up:
/// the rest stays for the images the tree maps that no capture examined
/// yet (its own program often among them).
pub const CACHED_ROWS: u32 = MAX_ROWS / 2;

use crate::bpf::skel::memtrail::types::mt_unwind_image;
use crate::profile::unwind::{ImageTable, Mode, Outcome, StackEnd};
use crate::sys::error_chain;

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
}

/// The unwind maps of the loaded BPF object, and what went into them.
pub struct Tables {
    /// `unwind_rows`, mapped writable.
    rows: MmapMut,
    capacity: u32,
    next: u32,
    /// `unwind_pages` (page index entries), mapped writable.
    pages: MmapMut,
    pages_capacity: u32,
    pages_next: u32,
    images: OwnedFd,
    cache: Option<cache::Cache>,
    /// Every image seen, in order.
    pub images_seen: Vec<ImageTable>,
}

// The kernel lays array map elements out 8 bytes apart: the rows map's
// mapping is an array of rows only if a row takes a multiple of 8 bytes.
const _: () = assert!(Row::SIZE % 8 == 0);

impl Tables {
    /// Maps `rows_map` (`unwind_rows`, `capacity` rows) and `pages_map`
    /// (`unwind_pages`, `pages_capacity` entries), and keeps `images_map`
    /// (`unwind_images`).
    pub fn new(
        (rows_map, capacity): (BorrowedFd<'_>, u32),
        (pages_map, pages_capacity): (BorrowedFd<'_>, u32),
        images_map: BorrowedFd<'_>,
    ) -> Result<Self, UnwindError> {
        let len = capacity as usize * Row::SIZE;
        // SAFETY: the unwind_rows map is a BPF_F_MMAPABLE array of exactly
        // `capacity` rows; the mapping keeps the map alive by itself, and
        // the BPF side only reads it.
        let rows = unsafe {
            memmap2::MmapOptions::new()
                .len(len)
                .map_mut(rows_map.as_raw_fd())
        }
        .map_err(UnwindError::Map)?;
        let len = pages_capacity as usize * 8;
        // SAFETY: as above, unwind_pages is a BPF_F_MMAPABLE array of
        // `pages_capacity` u64 entries.
        let pages = unsafe {
            memmap2::MmapOptions::new()
                .len(len)
                .map_mut(pages_map.as_raw_fd())
        }
        .map_err(UnwindError::Map)?;
        // Not copied into memtrail's children (the command before its exec,
        // the guardian): a fork copied the page table of every mapped page
        // of a BPF map, and the exec dropped it again.
        for map in [&rows, &pages] {
            if let Err(err) = map.advise(memmap2::Advice::DontFork) {
                tracing::debug!(%err, "unwind tables: MADV_DONTFORK not set");
            }
        }
        let images = images_map.try_clone_to_owned().map_err(UnwindError::Map)?;
        Ok(Self {
            rows,
            capacity,
            next: 0,
            pages,
            pages_capacity,
            pages_next: 0,
            images,
            cache: cache::Cache::open(),
            images_seen: Vec::new(),
        })
    }

    /// Rows loaded so far.
    pub fn rows_used(&self) -> u32 {
        self.next
    }

    /// Rows the map holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Prepares and loads the table of the image at `path` (a file whose
    /// device and inode are `id`, named `name` in warnings); warns, naming
    /// the image, when it has none or it does not fit.
    pub fn load(&mut self, path: &Path, name: &Path, id: (u64, u64)) -> &ImageTable {
        let started = Instant::now();
        let table = self.table_of(path);
        self.install_prepared(name, id, PreparedTable { table, micros: 0 }, started)
    }

    /// [`load`](Self::load) for a table [`prepare`]d already (on another
    /// thread); its time counts from `started` plus the preparation's.
    pub fn load_prepared(
        &mut self,
        name: &Path,
        id: (u64, u64),
        prepared: PreparedTable,
    ) -> &ImageTable {
        self.install_prepared(name, id, prepared, Instant::now())
    }

    fn install_prepared(
        &mut self,
        name: &Path,
        id: (u64, u64),
        prepared: PreparedTable,
        started: Instant,
    ) -> &ImageTable {
        let outcome = match prepared.table {
            Ok((Some(table), cached)) => self.install(id, &table, cached),
            Ok((None, _)) => Outcome::NoCfi,
            Err(err) => Outcome::Failed {
                reason: error_chain(&err),
            },
        };
        match &outcome {
            Outcome::Loaded { .. } => {}
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
        });
        self.images_seen.last().expect("just pushed")
    }

    fn table_of(&self, path: &Path) -> Result<(Option<Table>, bool), UnwindError> {
        prepare(path, self.cache.as_ref())
    }

    /// Appends `table`'s rows to the rows map and makes them the image's.
    fn install(&mut self, id: (u64, u64), table: &Table, cached: bool) -> Outcome {
        let room = self.capacity - self.next;
        let Ok(count) = u32::try_from(table.rows.len()) else {
            return Outcome::TooBig {
                rows: u32::MAX,
                room,
            };
        };
        if count > room {
            return Outcome::TooBig { rows: count, room };
        }
        let index = table.page_index(self.next);
        let pages_room = self.pages_capacity - self.pages_next;
        if index.len() > pages_room as usize {
            return Outcome::TooBig { rows: count, room };
        }
        let at = self.next as usize * Row::SIZE;
        let dst = &mut self.rows[at..at + table.rows.len() * Row::SIZE];
        for (row, bytes) in table.rows.iter().zip(dst.chunks_exact_mut(Row::SIZE)) {
            row.encode(bytes);
        }
        let at = self.pages_next as usize * 8;
        let dst = &mut self.pages[at..at + index.len() * 8];
        for (entry, bytes) in index.iter().zip(dst.chunks_exact_mut(8)) {
            bytes.copy_from_slice(&u64::from(*entry).to_ne_bytes());
        }
        let base_page = table.rows.first().map_or(0, |r| r.pc >> 12);
        let npages = index.len() as u32 - 1;
        let value = image_value(self.pages_next, npages, base_page, table.bias);
        let key = crate::sys::image_key(id);
        // The update is a syscall: the rows written above are visible to
        // BPF before the entry that leads to them.
        if let Err(err) = crate::sys::bpf_map_update(self.images.as_fd(), &key, &value) {
            return Outcome::Failed {
                reason: format!("recording the table in BPF: {err}"),
            };
        }
        self.next += count;
        self.pages_next += npages + 1;
        Outcome::Loaded {
            rows: count,
            source: table.source.to_owned(),
            cached,
        }
    }
}

/// An image's table as [`prepare`] gave it, and the time that took.
pub struct PreparedTable {
    pub table: Result<(Option<Table>, bool), UnwindError>,
    pub micros: u64,
}

/// The table of the image at `path`, from `cache` or compiled (and then
/// cached); None for an image without CFI. The flag says whether it came
/// from the cache.
pub fn prepare(
    path: &Path,
    cache: Option<&cache::Cache>,
) -> Result<(Option<Table>, bool), UnwindError> {
    let data = crate::sys::map_file(path).map_err(|source| UnwindError::Read {
        path: path.to_owned(),
        source,
    })?;
    // Parsed from a file any tracked user can craft: a panic only costs
    // the cache (compile catches its own).
    let key = cache.and_then(|c| std::panic::catch_unwind(|| c.key(&data)).ok().flatten());
    let cache = cache.zip(key.as_deref());
    if let Some(table) = cache.and_then(|(c, id)| c.get(id)) {
        return Ok((Some(table), true));
    }
    match table::compile(&data)? {
        Compiled::NoCfi => Ok((None, false)),
        Compiled::Table(table) => {
            if let Some((c, id)) = cache {
                c.put(id, &table);
            }
            Ok((Some(table), false))
        }
    }
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

/// The profile's account of unwinding: the mode, the images' tables, and
/// how many distinct stacks (and their bytes) ended before their outermost
/// frame, by reason.
pub fn report(
    mode: Mode,
    images: Vec<ImageTable>,
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

    /// The rows budget the up-front thread reads the image cache by is the
    /// BPF rows map's size.
    #[test]
    fn max_rows_is_the_rows_map_size() {
        let mut storage = MaybeUninit::uninit();
        let open = MemtrailSkelBuilder::default()
            .open(&mut storage)
            .expect("open memtrail's BPF object");
        assert_eq!(open.maps.unwind_rows.max_entries(), super::MAX_ROWS);
    }
}

//! The images a session probes before its command starts, prepared on a
//! thread of their own while the kernel verifies the BPF programs.
//!
//! Probing an image up front takes two things that need no BPF object:
//! its allocator entry points (an ELF symbol search) and its unwind table
//! (read from the table cache, or compiled). For libc, the C++ runtimes,
//! the dynamic loader and the unchanged images of the image cache those
//! took as long as loading the object did, one after the other; the
//! session now hands them to a thread first and, once the object is
//! loaded, only attaches and installs what the thread found.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::attach::cache::ImageCache;
use crate::attach::{self, AttachError, Site};
use crate::unwind::{self, PreparedTable};

/// Why an image is probed up front, which decides what a failure does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Why {
    /// libc or a C++ runtime: every command loads them; a failure to
    /// examine one fails the capture.
    Runtime,
    /// The dynamic loader: the kernel maps it at exec, with no `mmap` to
    /// ask for its table by. Its table only.
    Loader,
    /// An unchanged image of the image cache; a failure skips it (it is
    /// then examined, held, if a process maps it).
    Cached,
}

/// One image, ready to be attached and installed.
pub(super) struct Image {
    pub path: PathBuf,
    pub why: Why,
    /// Its kernel file identity, when it could be read.
    pub id: Option<(u64, u64)>,
    /// Its allocator entry points, when it is to be probed.
    pub sites: Option<Result<Vec<Site>, AttachError>>,
    /// Its unwind table, when the session loads tables.
    pub table: Option<PreparedTable>,
}

/// What the thread prepared.
pub(super) struct Prepared {
    pub images: Vec<Image>,
    /// The image cache as read (the attach worker records in it).
    pub image_cache: ImageCache,
}

/// The preparation running on its thread; joined when dropped.
pub(super) struct Preparing {
    thread: super::Background<Result<Prepared, AttachError>>,
    /// Raised when the session needs what was prepared: the thread then
    /// leaves the rest of the image cache.
    enough: Arc<AtomicBool>,
}

impl Preparing {
    /// Starts preparing; `tables` says whether the session loads unwind
    /// tables.
    pub fn start(tables: bool) -> Self {
        let enough = Arc::new(AtomicBool::new(false));
        let stop = enough.clone();
        let thread = super::Background::spawn("memtrail-upfront", move || {
            // The signals memtrail passes on to the command are the main
            // thread's to take.
            if let Err(err) = crate::sys::signals::block_forwarded() {
                tracing::debug!(%err, "up-front thread: signals not blocked");
            }
            prepare(tables, &stop)
        });
        Self { thread, enough }
    }

    /// What the thread prepared (prepared here if it could not start).
    /// The runtimes are always prepared whole; of the image cache, its
    /// [`ALWAYS_CACHED`] newest entries and whatever more the thread got
    /// to while the BPF object loaded.
    pub fn finish(self, tables: bool) -> Result<Prepared, AttachError> {
        self.enough.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or_else(|| prepare(tables, &AtomicBool::new(true)))
    }
}

fn table_of(path: &std::path::Path, cache: Option<&unwind::cache::Cache>) -> PreparedTable {
    let started = Instant::now();
    let table = unwind::prepare(path, cache);
    PreparedTable {
        table,
        micros: started.elapsed().as_micros() as u64,
    }
}

/// The newest entries of the image cache prepared whatever the time they
/// take (a few milliseconds): a cache that small behaves the same in every
/// capture, however loaded the machine.
const ALWAYS_CACHED: usize = 32;

/// Examines the up-front images, in the order the session installs them:
/// libc and the C++ runtimes, the dynamic loader, then the image cache's
/// unchanged entries until `enough` is raised (past the newest
/// [`ALWAYS_CACHED`]). An entry left out is examined, held, if a process
/// maps it.
fn prepare(tables: bool, enough: &AtomicBool) -> Result<Prepared, AttachError> {
    let started = Instant::now();
    let cache = if tables {
        unwind::cache::Cache::open()
    } else {
        None
    };
    let id_of = |path: &std::path::Path| crate::sys::kernel_file_id(path).ok();
    let mut images = Vec::new();
    let mut runtimes = vec![attach::libc_path()?];
    runtimes.extend(attach::cxx_runtimes());
    for path in runtimes {
        let sites = attach::capture_sites(&path, tables)?;
        let id = id_of(&path);
        images.push(Image {
            table: (tables && id.is_some()).then(|| table_of(&path, cache.as_ref())),
            sites: Some(Ok(sites)),
            why: Why::Runtime,
            id,
            path,
        });
    }
    if let Some(path) = attach::ld_so_path()
        && let Some(id) = id_of(&path)
    {
        images.push(Image {
            table: tables.then(|| table_of(&path, cache.as_ref())),
            sites: None,
            why: Why::Loader,
            id: Some(id),
            path,
        });
    }
    let image_cache = ImageCache::load();
    let mut seen: std::collections::HashSet<(u64, u64)> = images
        .iter()
        .filter(|i| i.why == Why::Runtime)
        .filter_map(|i| i.id)
        .collect();
    // Newest first: the session gives the cache's tables only part of the
    // rows (unwind::CACHED_ROWS, counting the images above), and recently
    // examined images are the likelier to be mapped. Past that share, or
    // once the session has loaded the BPF object and waits, the rest of the
    // cache is not read at all: a cache of a few hundred images took 200 ms
    // to read, more than loading the object, and start-up waited for it.
    let rows_of = |image: &Image| match image.table.as_ref().map(|t| &t.table) {
        Some(Ok((Some(table), _))) => table.rows.len(),
        _ => 0,
    };
    let mut rows: usize = images.iter().map(rows_of).sum();
    let essentials_ms = started.elapsed().as_secs_f64() * 1e3;
    for (nth, entry) in image_cache.valid().into_iter().rev().enumerate() {
        let waited_for = nth >= ALWAYS_CACHED && enough.load(Ordering::Relaxed);
        if tables && rows >= unwind::CACHED_ROWS as usize || waited_for {
            break;
        }
        let id = entry.stamp.id();
        if !seen.insert(id) {
            continue;
        }
        let sites = entry
            .has_sites
            .then(|| attach::capture_sites(&entry.path, tables));
        let failed = matches!(sites, Some(Err(_)));
        let image = Image {
            table: (tables && !failed).then(|| table_of(&entry.path, cache.as_ref())),
            sites,
            why: Why::Cached,
            id: Some(id),
            path: entry.path.clone(),
        };
        rows += rows_of(&image);
        images.push(image);
    }
    tracing::debug!(
        runtimes_ms = format!("{essentials_ms:.1}"),
        ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1e3),
        images = images.len(),
        "up-front thread done"
    );
    Ok(Prepared {
        images,
        image_cache,
    })
}

//! The images a session probes before its command starts, prepared on a
//! thread of their own while the kernel verifies the BPF programs.
//!
//! Probing an image up front takes two things that need no BPF object:
//! its allocator entry points (an ELF symbol search) and its unwind table
//! (read from the table cache, or compiled). For libc, the C++ runtimes,
//! the dynamic loader and the unchanged images of the image cache those
//! took as long as loading the object did, one after the other; the
//! session now hands them to a thread first and, once the object is
//! loaded, only attaches and installs what the thread found ([`Install`]).

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::CaptureError;
use crate::attach::cache::ImageCache;
use crate::attach::per_process::PerProcess;
use crate::attach::place::{self, Deferred, Placed, Placer};
use crate::attach::{self, AllocPrograms, AttachError, HitSlots, Links, Site};
use crate::profile::SkippedImage;
use crate::sys::FileId;
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
    pub id: Option<FileId>,
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
    /// tables, `probe_new` whether it probes operator new in the C++
    /// runtimes (see [`attach::capture_sites`]).
    pub fn start(tables: bool, probe_new: bool) -> Self {
        let enough = Arc::new(AtomicBool::new(false));
        let stop = enough.clone();
        let thread = super::Background::spawn("memtrail-upfront", move || {
            // The signals memtrail passes on to the command are the main
            // thread's to take.
            if let Err(err) = crate::sys::signals::block_forwarded() {
                tracing::debug!(%err, "up-front thread: signals not blocked");
            }
            prepare(tables, probe_new, &stop)
        });
        Self { thread, enough }
    }

    /// What the thread prepared (prepared here if it could not start).
    /// The runtimes are always prepared whole; of the image cache, its
    /// [`ALWAYS_CACHED`] newest entries and whatever more the thread got
    /// to while the BPF object loaded.
    pub fn finish(self, tables: bool, probe_new: bool) -> Result<Prepared, AttachError> {
        self.enough.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or_else(|| prepare(tables, probe_new, &AtomicBool::new(true)))
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

/// The images every capture installs up front: libc and the C++ runtimes
/// (with their allocator entry points), then the dynamic loader; each
/// with its unwind table when the session loads `tables`.
fn essentials(
    tables: bool,
    probe_new: bool,
    cache: Option<&unwind::cache::Cache>,
) -> Result<Vec<Image>, AttachError> {
    let id_of = |path: &std::path::Path| crate::sys::kernel_file_id(path).ok();
    let mut images = Vec::new();
    let mut runtimes = vec![attach::libc_path()?];
    runtimes.extend(attach::cxx_runtimes());
    for path in runtimes {
        let sites = attach::capture_sites(&path, probe_new)?;
        let id = id_of(&path);
        images.push(Image {
            table: (tables && id.is_some()).then(|| table_of(&path, cache)),
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
            table: tables.then(|| table_of(&path, cache)),
            sites: None,
            why: Why::Loader,
            id: Some(id),
            path,
        });
    }
    Ok(images)
}

/// Examines the up-front images, in the order the session installs them:
/// libc and the C++ runtimes, the dynamic loader, then the image cache's
/// unchanged entries until `enough` is raised (past the newest
/// [`ALWAYS_CACHED`]). An entry left out is examined, held, if a process
/// maps it.
fn prepare(tables: bool, probe_new: bool, enough: &AtomicBool) -> Result<Prepared, AttachError> {
    let started = Instant::now();
    let cache = if tables {
        unwind::cache::Cache::open()
    } else {
        None
    };
    let mut images = essentials(tables, probe_new, cache.as_ref())?;
    let image_cache = ImageCache::load();
    let mut seen: std::collections::HashSet<FileId> = images
        .iter()
        .filter(|i| i.why == Why::Runtime)
        .filter_map(|i| i.id)
        .collect();
    // Newest first: the cache's tables loaded up front take at most
    // unwind::CACHED_ROWS rows, counting the images above (a bound on
    // start-up's memory and time; no image's room, the tables grow), and
    // recently examined images are the likelier to be mapped. Past that share, or
    // once the session has loaded the BPF object and waits, the rest of the
    // cache is not read at all: a cache of a few hundred images took 200 ms
    // to read, more than loading the object, and start-up waited for it.
    let rows_of = |image: &Image| match image.table.as_ref().map(|t| &t.table) {
        Some(Ok((unwind::Compiled::Table(table), _))) => table.rows.len(),
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
            .then(|| attach::capture_sites(&entry.path, probe_new));
        let failed = matches!(sites, Some(Err(_)));
        let image = Image {
            table: (tables && !failed).then(|| table_of(&entry.path, cache.as_ref())),
            sites,
            why: Why::Cached,
            id: Some(id),
            path: entry.path.clone(),
        };
        // A table past the share is not loaded up front (however fresh
        // the cache's entry): the image gets it, from the cache, when a
        // process maps it. Nor is an image without a table and without
        // allocator entry points: up front it would only be a warning in
        // every capture, mapped or not (issue 23); examined when mapped,
        // it is one in the captures that map it.
        let no_table = tables
            && !matches!(
                image.table.as_ref().map(|t| &t.table),
                Some(Ok((unwind::Compiled::Table(_), _)))
            );
        let no_sites = !matches!(&image.sites, Some(Ok(sites)) if !sites.is_empty());
        if rows + rows_of(&image) > unwind::CACHED_ROWS as usize || no_table && no_sites {
            continue;
        }
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

/// Places the up-front images' probes (by [`attach::place`]) and loads
/// their unwind tables: libc, the C++ runtimes and the dynamic loader (images
/// known up front are never held, so this is their only chance to get their
/// tables), the images a running target has mapped, then the image cache's.
/// Other images as the attach worker meets them.
pub(super) struct Install<'a> {
    out: Installed,
    /// System-wide, images with allocator sites other than libc (the C++
    /// runtimes, the image cache's) are linked when a tracked process
    /// first maps them (held, by the attach worker, from what was prepared
    /// here), not up front: the kernel detaches links one after another,
    /// each after grace periods of its own (~20 ms), and a C program's
    /// capture waited for libstdc++'s.
    defer: bool,
    links: &'a mut Links,
    known_fd: BorrowedFd<'a>,
}

/// What [`Install::run`] leaves for the attach worker and the session.
pub(super) struct Installed {
    pub progs: AllocPrograms,
    pub tables: Option<unwind::Tables>,
    /// BPF's `py_images`, when stacks are walked without tables and with
    /// Python frames: interpreters are recorded there directly (with
    /// tables, their load does it).
    pub python: Option<OwnedFd>,
    /// Whether operator new in the C++ runtimes is probed: only when
    /// stacks are walked by frame pointers (see [`attach::capture_sites`]).
    pub probe_new: bool,
    pub sites: Vec<Site>,
    pub slots: HitSlots,
    /// Images examined, recorded known in BPF.
    pub known: HashSet<FileId>,
    /// With per-process probes, images are recorded here and probed for
    /// each process that maps them (a running target's up front).
    pub registry: Option<PerProcess>,
    pub deferred: Deferred,
    /// libc's identity, with per-process probes (the command's first).
    pub libc_id: Option<FileId>,
    /// Mapped images of a running target not probed (see
    /// `AttachError::skip_reason`).
    pub skipped: Vec<SkippedImage>,
}

impl<'a> Install<'a> {
    /// `stacks`: whether the capture walks stacks (`--stack-depth` above 0).
    pub fn new(
        progs: AllocPrograms,
        tables: Option<unwind::Tables>,
        stacks: bool,
        per_process: bool,
        defer: bool,
        links: &'a mut Links,
        known_fd: BorrowedFd<'a>,
    ) -> Self {
        Self {
            out: Installed {
                progs,
                probe_new: stacks && tables.is_none(),
                tables,
                python: None,
                sites: Vec::new(),
                slots: HitSlots::default(),
                known: HashSet::new(),
                registry: per_process.then(PerProcess::new),
                deferred: Deferred::new(),
                libc_id: None,
                skipped: Vec::new(),
            },
            defer,
            links,
            known_fd,
        }
    }

    /// Records Python interpreters in `py_images` (`python`: BPF's map,
    /// when stacks are walked without tables and with Python frames).
    pub fn with_python(mut self, python: Option<OwnedFd>) -> Self {
        self.out.python = python;
        self
    }

    /// Installs `images` and, for a running target, its mapped images.
    pub fn run(
        mut self,
        images: Vec<Image>,
        running: Option<u32>,
        phases: &mut super::phases::Phases,
    ) -> Result<Installed, CaptureError> {
        let cached = self.prepared(images)?;
        if let Some(pid) = running {
            self.mapped(pid)?;
        }
        phases.done("known images probed, their unwind tables loaded");
        self.cached(cached)?;
        phases.done("cached images probed, their unwind tables loaded");
        for site in self.out.sites.iter().filter(|s| !s.emulated) {
            tracing::info!(%site, "probe site single-steps its first instruction (~14 µs a hit)");
        }
        Ok(self.out)
    }

    fn placer(&mut self) -> Placer<'_> {
        Placer {
            progs: &self.out.progs,
            slots: &mut self.out.slots,
            per_process: self.out.registry.as_mut(),
            deferred: &mut self.out.deferred,
            defer: self.defer,
            links: self.links,
        }
    }

    /// Records image `id` examined: known to BPF for every process, unless
    /// its probes are made per process (each process's then, as it maps it).
    fn mark_known(&mut self, id: FileId) -> Result<(), CaptureError> {
        if !self.out.registry.as_ref().is_some_and(|r| r.has_image(id)) {
            crate::sys::bpf_map_update(self.known_fd, &attach::known_key(id, 0), &[1])?;
        }
        self.out.known.insert(id);
        Ok(())
    }

    /// libc, the C++ runtimes and the dynamic loader; returns the image
    /// cache's images, installed last.
    fn prepared(&mut self, images: Vec<Image>) -> Result<Vec<Image>, CaptureError> {
        let mut cached = Vec::new();
        for (nth, image) in images.into_iter().enumerate() {
            if image.why == Why::Cached {
                cached.push(image);
                continue;
            }
            let mut placed = None;
            if let Some(found) = image.sites {
                let mut found = found?;
                let how = self.placer().place(
                    &place::Image {
                        id: image.id,
                        path: &image.path,
                        name: None,
                        // images[0] is libc (`prepare`).
                        may_defer: nth > 0,
                    },
                    &mut found,
                )?;
                match (how, image.id) {
                    // libc comes first.
                    (Placed::PerProcess, Some(id)) if image.why == Why::Runtime => {
                        self.out.libc_id.get_or_insert(id);
                    }
                    (Placed::PerProcess, _) => {}
                    _ => self.out.sites.extend(found),
                }
                placed = Some(how);
            }
            let Some(id) = image.id else { continue };
            self.note_python(&image.path, id);
            if let (Some(tables), Some(table)) = (&mut self.out.tables, image.table) {
                tables.load_prepared(&image.path, id, table);
                // Mapped without asking (the loader at exec, the runtimes
                // known to BPF): never released (issue 23).
                tables.pin(id);
            }
            if image.why == Why::Runtime && placed != Some(Placed::Deferred) {
                self.mark_known(id)?;
            }
        }
        Ok(cached)
    }

    /// The images running process `pid` has mapped.
    fn mapped(&mut self, pid: u32) -> Result<(), CaptureError> {
        for image in super::mapped_images(pid) {
            let Ok(id) = crate::sys::kernel_file_id(&image) else {
                continue;
            };
            // An image probed per process already (libc, the runtimes).
            if let Some(registry) = self.out.registry.as_mut().filter(|r| r.has_image(id)) {
                registry.link(&self.out.progs, self.known_fd, pid, id)?;
                continue;
            }
            if self.out.known.contains(&id) {
                continue;
            }
            if let Some(found) = self.placer().link_deferred(id) {
                self.out.sites.extend(found?);
                self.mark_known(id)?;
                continue;
            }
            let probed = attach::capture_sites(&image, self.out.probe_new).and_then(|mut found| {
                let at = place::Image {
                    id: Some(id),
                    path: &image,
                    name: None,
                    may_defer: false,
                };
                if self.placer().place(&at, &mut found)? == Placed::PerProcess {
                    if let Some(registry) = &mut self.out.registry {
                        registry.link(&self.out.progs, self.known_fd, pid, id)?;
                    }
                }
                Ok(found)
            });
            match probed {
                Ok(found) => {
                    self.out.sites.extend(found);
                    self.load_table(&image, id);
                }
                Err(err) => self.not_probed(pid, &image, id, err),
            }
            self.mark_known(id)?;
        }
        Ok(())
    }

    /// A mapped image of process `pid` whose probes could not be made.
    fn not_probed(&mut self, pid: u32, image: &Path, id: FileId, err: AttachError) {
        if matches!(err, AttachError::NotElf { .. }) {
            tracing::info!(image = %image.display(), "not an ELF image: nothing to probe");
        } else {
            tracing::warn!(image = %image.display(), %err, "a mapped image could not be probed");
        }
        let Some(reason) = err.skip_reason() else {
            return self.load_table(image, id);
        };
        // Its probes could not be made: no process gets any (a fork would
        // fail to).
        if let Some(registry) = self.out.registry.as_mut() {
            registry.remove_image(id);
        }
        self.out.skipped.push(SkippedImage {
            image: image.display().to_string(),
            pid,
            reason,
        });
    }

    /// Records a Python interpreter in `py_images` when there are no
    /// tables (a table's load does it).
    fn note_python(&self, image: &Path, id: FileId) {
        if let (None, Some(py)) = (&self.out.tables, &self.out.python) {
            let _ = crate::python::note_image(py.as_fd(), image, id);
        }
    }

    /// Loads an image's unwind table.
    fn load_table(&mut self, image: &Path, id: FileId) {
        self.note_python(image, id);
        let per_image = self.out.registry.as_ref().is_some_and(|r| r.has_image(id));
        if let Some(tables) = &mut self.out.tables {
            tables.load(image, image, id);
            // Known per process: never released (see `unwind`).
            if per_image {
                tables.pin(id);
            }
        }
    }

    /// The image cache's images.
    fn cached(&mut self, cached: Vec<Image>) -> Result<(), CaptureError> {
        for image in cached {
            let Some(id) = image.id else { continue };
            if self.out.known.contains(&id) {
                continue;
            }
            // The image cache's tables (newest first) take at most
            // unwind::CACHED_ROWS rows up front (start-up's memory and
            // time; the tables grow for the images the tree maps, issue
            // 23). An image past that is left to be examined, held, if a
            // process maps it: it gets its table then.
            if let (Some(tables), Some(_)) = (&self.out.tables, &image.table)
                && tables.rows_used() >= u64::from(unwind::CACHED_ROWS)
            {
                tracing::debug!(image = %image.path.display(), "cached image left to be examined when mapped: the cache's up-front share of unwind rows is taken");
                continue;
            }
            let mut placed = None;
            if let Some(found) = image.sites {
                let at = place::Image {
                    id: Some(id),
                    path: &image.path,
                    name: None,
                    // Linked when mapped, as the C++ runtimes.
                    may_defer: true,
                };
                let result = found.and_then(|mut found| {
                    let how = self.placer().place(&at, &mut found)?;
                    Ok((how, found))
                });
                match result {
                    Ok((how, found)) => {
                        self.out.sites.extend(found);
                        placed = Some(how);
                    }
                    Err(err) => {
                        tracing::debug!(image = %image.path.display(), %err, "cached image not probed up front");
                        continue;
                    }
                }
            }
            self.note_python(&image.path, id);
            if let (Some(tables), Some(table)) = (&mut self.out.tables, image.table) {
                tables.load_prepared(&image.path, id, table);
            }
            if placed != Some(Placed::Deferred) {
                self.mark_known(id)?;
            }
        }
        Ok(())
    }
}

//! The attach worker: the sink of the attach-request pipeline.
//!
//! A tracked process that maps an executable image BPF has not seen is
//! stopped by BPF before it returns to user space, and a request arrives
//! here. The worker takes the `Attach` stop ownership of it, resolves the
//! file through `/proc/PID/map_files` (which reaches deleted files and
//! overlay layers alike), looks for allocator entry points, attaches probes
//! once per image, records the image as known in BPF, and releases its
//! hold. An image without allocator symbols is just marked known.
//!
//! With per-process probes ([`PerProcess`]) an image's probes are made for
//! each process that maps it, and the worker also makes a new process's
//! probes at fork (held, as above), drops them at exit, and makes them
//! again after an exec by a thread other than the leader.
//!
//! A failure to resolve or attach for a live process is never silent: it
//! is kept and fails the capture, naming the file; the process is released
//! all the same, so nothing is left stopped. An image that is not one
//! memtrail can probe (not an ELF image: a JIT's code, a PE image under
//! Wine, data mapped executable; or a malformed one) is no failure: it is
//! skipped, logged and named in the profile (`skipped_images`), and the
//! capture goes on; stacks through it end where its missing unwind table
//! ends them. A panic in the work on one request is caught: it fails the
//! capture, the process is released.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use super::cache::Stamp;
use super::per_process::{PerProcess, Shared, lock};
use super::place::{Deferred, Image, Placed, Placer};
use super::{
    AllocPrograms, AttachError, HitSlots, Links, NOT_ELF, Role, Site, capture_sites, known_key,
    strip_deleted,
};
use crate::bpf::record::{self, MappingRecord, Request};
use crate::engine::Sink;
use crate::proctree::stops::{Owner, Stops};
use crate::profile::SkippedImage;
use crate::sys::FileId;

/// An image that could not be examined or probed.
#[derive(Debug)]
pub struct AttachFailure {
    pub pid: u32,
    pub image: String,
    pub error: AttachError,
}

/// Handles attach requests on its poller thread.
pub struct AttachWorker {
    progs: AllocPrograms,
    known_images: OwnedFd,
    known: HashSet<FileId>,
    stops: Arc<Stops>,
    /// Probes attached so far; they live as long as the capture.
    pub links: Links,
    /// Sites attached so far, with their images' real paths.
    pub sites: Vec<Site>,
    /// Hit counters for the sites it attaches, after those attached up
    /// front.
    slots: HitSlots,
    pub failures: Vec<AttachFailure>,
    /// Images not probed (see the module's docs), once each.
    pub skipped: Vec<SkippedImage>,
    skipped_ids: HashSet<FileId>,
    pub malformed: u64,
    /// Whether requesting processes are held stopped (BPF stopped them);
    /// off when memtrail tracks its own process (`attach_hold` in BPF).
    pub hold: bool,
    /// Images examined, as they were then, and whether they had allocator
    /// entry points: for the image cache.
    pub examined: Vec<(PathBuf, Stamp, bool)>,
    /// Unwind tables, loaded for each image before its hold is released
    /// (None with `--unwind fp`).
    pub tables: Option<crate::unwind::Tables>,
    /// BPF's `py_images` when there are no tables (`--unwind fp`) and
    /// Python frames are on: interpreters are recorded there as examined.
    pub python: Option<OwnedFd>,
    /// Whether operator new in the C++ runtimes is probed (see
    /// [`capture_sites`]): by default when there are no tables.
    pub probe_new: bool,
    /// Per-process probes (shared with the session, which makes the
    /// command's first ones); None when they are system-wide.
    pub per_process: Option<Shared>,
    /// BPF's `held_for_probes`: a process held at fork leaves it just
    /// before the worker resumes it.
    pub held_for_probes: Option<OwnedFd>,
    /// Images examined up front (their sites found, their unwind tables
    /// loaded), probed system-wide when a tracked process first maps them.
    pub deferred: Deferred,
    /// The processes that loaded the preload shim (filled at the end).
    pub preloaded: std::collections::BTreeSet<u32>,
}

impl AttachWorker {
    /// `known` lists the images already examined (and seeded into the
    /// `known_images` map).
    pub fn new(
        progs: AllocPrograms,
        known_images: OwnedFd,
        known: HashSet<FileId>,
        stops: Arc<Stops>,
        tables: Option<crate::unwind::Tables>,
        slots: HitSlots,
        per_process: Option<Shared>,
    ) -> Self {
        Self {
            progs,
            known_images,
            known,
            stops,
            links: Links::default(),
            sites: Vec::new(),
            slots,
            failures: Vec::new(),
            skipped: Vec::new(),
            skipped_ids: HashSet::new(),
            malformed: 0,
            hold: true,
            examined: Vec::new(),
            probe_new: tables.is_none(),
            tables,
            python: None,
            per_process,
            held_for_probes: None,
            deferred: Deferred::new(),
            preloaded: std::collections::BTreeSet::new(),
        }
    }

    /// Examines and probes one image (where its probes go: [`super::place`]).
    /// One examined up front (its table loaded then) is only probed.
    fn examine(&mut self, req: &MappingRecord, id: FileId) -> Result<Examined, AttachError> {
        let mut placer = Placer {
            progs: &self.progs,
            slots: &mut self.slots,
            per_process: None,
            deferred: &mut self.deferred,
            defer: false,
            links: &mut self.links,
        };
        if let Some(sites) = placer.link_deferred(id) {
            let sites = sites?;
            tracing::debug!(image = %req.name, sites = sites.len(), "probed (examined up front)");
            self.sites.extend(sites);
            return Ok(Examined::Probed);
        }
        let link = PathBuf::from(format!(
            "/proc/{}/map_files/{:x}-{:x}",
            req.pid, req.start, req.end
        ));
        let real = match std::fs::read_link(&link) {
            Ok(path) => strip_deleted(path),
            // Killed while held (a job-control shell that saw the hold's
            // stop sends SIGHUP to its stopped jobs on exit): its mappings
            // are gone with its memory, and none of the image ran.
            Err(_) if process_gone(req.pid) => return Ok(Examined::Gone),
            Err(source) => return Err(AttachError::Read { path: link, source }),
        };
        // Stamped before reading: a file changed meanwhile gets a stamp
        // that no longer matches it, and is examined again next time.
        let stamp = Stamp::of(&real).filter(|s| {
            s.id()
                == FileId {
                    dev: req.dev,
                    ino: req.ino,
                }
        });
        let mut sites = match capture_sites(&link, self.probe_new) {
            Ok(sites) => sites,
            Err(err) => return skipped_or(real, err),
        };
        let image = Image {
            id: Some(id),
            path: &link,
            name: Some(&real),
            may_defer: false,
        };
        let mut per_process = self.per_process.as_ref().map(lock);
        let mut placer = Placer {
            progs: &self.progs,
            slots: &mut self.slots,
            per_process: per_process.as_deref_mut(),
            deferred: &mut self.deferred,
            defer: false,
            links: &mut self.links,
        };
        match placer.place(&image, &mut sites) {
            Ok(Placed::PerProcess) => {
                tracing::debug!(image = %real.display(), sites = sites.len(), "examined");
            }
            Ok(_) if !sites.is_empty() => {
                tracing::debug!(image = %real.display(), sites = sites.len(), "probed");
            }
            Ok(_) => {}
            Err(err) => return skipped_or(real, err),
        }
        let per_image = per_process.as_ref().is_some_and(|p| p.has_image(id));
        drop(per_process);
        if let Some(tables) = &mut self.tables {
            tables.load(&link, &real, id);
            // Its per-process entries in `known_images` stay with each
            // process: a release could not make them ask again.
            if per_image {
                tables.pin(id);
            }
        } else if let Some(python) = &self.python {
            let _ = crate::python::note_image(python.as_fd(), &real, id);
        }
        // An image whose only sites are region markers (a benchmark's
        // executable) is not cached: the cache would probe it up front in
        // every later capture, whatever that capture runs. It is examined
        // again, held, when a capture maps it.
        let only_markers = !sites.is_empty() && sites.iter().all(|s| s.role == Role::Marker);
        if let Some(stamp) = stamp.filter(|_| !only_markers) {
            self.examined.push((real, stamp, !sites.is_empty()));
        }
        self.sites.extend(sites);
        Ok(Examined::Probed)
    }

    /// Names image `id` skipped, with why, once; logs it (at info for a
    /// file that is no ELF image: a JIT's or Wine's, nothing to probe).
    fn skip(&mut self, pid: u32, id: FileId, image: PathBuf, reason: String) {
        if self.skipped_ids.insert(id) {
            if reason == NOT_ELF {
                tracing::info!(pid, image = %image.display(), "not an ELF image: nothing to probe");
            } else {
                tracing::warn!(pid, image = %image.display(), %reason, "image skipped: not probed");
            }
            self.skipped.push(SkippedImage {
                image: image.display().to_string(),
                pid,
                reason,
            });
        }
    }

    /// Whether image `id` is probed per process.
    fn has_image(&self, id: FileId) -> bool {
        self.per_process
            .as_ref()
            .is_some_and(|p| lock(p).has_image(id))
    }

    /// Records image `id` examined: known to BPF for every process, unless
    /// its probes are made per process (`examine_request` makes each
    /// process's, and records the image known for that process).
    fn mark_known(&mut self, id: FileId) {
        self.known.insert(id);
        if self.has_image(id) {
            return;
        }
        let key = known_key(id, 0);
        if let Err(err) = crate::sys::bpf_map_update(self.known_images.as_fd(), &key, &[1]) {
            // Not fatal: BPF asks again for this image, and we answer again.
            tracing::warn!(%err, "could not record a known image");
        }
    }
}

/// What became of an image examined for a request.
enum Examined {
    Probed,
    /// The process exited before its image could be looked at.
    Gone,
    /// Not an image memtrail can probe (the path, why).
    Skipped(PathBuf, String),
}

/// `err`, unless it says the image is to be skipped.
fn skipped_or(image: PathBuf, err: AttachError) -> Result<Examined, AttachError> {
    match err.skip_reason() {
        Some(reason) => Ok(Examined::Skipped(image, reason)),
        None => Err(err),
    }
}

/// Whether process `pid` has exited or is exiting: it has no memory left to
/// look at (`/proc/PID/maps` is gone or empty once its mm is released).
fn process_gone(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/maps")).map_or(true, |maps| maps.is_empty())
}

impl Sink for AttachWorker {
    fn record(&mut self, bytes: &[u8]) {
        let Ok(req) = record::decode_mapping(bytes) else {
            self.malformed += 1;
            return;
        };
        let pid = req.pid;
        // A new process, or one whose leader changed, is held by BPF
        // whatever `hold` says: it is never memtrail's own.
        let hold = match req.request {
            Request::Image => self.hold,
            Request::Fork { .. } | Request::Relink => true,
            Request::Exit => false,
        };
        if hold && let Err(err) = self.stops.hold_stopped(pid.into(), Owner::Attach) {
            tracing::debug!(pid, %err, "could not hold the requesting process");
        }
        // The last line: whatever happens in the work, the process is
        // released below.
        let work = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(&req)));
        if let Err(panic) = work {
            let message = crate::sys::panic_text(&*panic).to_owned();
            tracing::error!(pid, image = %req.name, %message, "attach worker panicked");
            self.failures.push(AttachFailure {
                pid,
                image: req.name.clone(),
                error: AttachError::Panicked { message },
            });
        }
        if matches!(req.request, Request::Fork { .. } | Request::Relink)
            && let Some(held) = &self.held_for_probes
        {
            let _ = crate::sys::bpf_map_delete(held.as_fd(), &pid.to_ne_bytes());
        }
        if hold && let Err(err) = self.stops.release(pid.into(), Owner::Attach) {
            tracing::warn!(pid, %err, "could not resume a process after attaching");
        }
    }
}

impl AttachWorker {
    /// Does what `req` asks for.
    fn handle(&mut self, req: &MappingRecord) {
        let pid = req.pid;
        match req.request {
            Request::Image => self.examine_request(req),
            Request::Fork { parent } => {
                self.per_process_request(pid, |p, progs, known| p.fork(progs, known, parent, pid))
            }
            Request::Relink => {
                self.per_process_request(pid, |p, progs, known| p.relink(progs, known, pid));
            }
            Request::Exit => {
                if let Some(per_process) = &self.per_process {
                    lock(per_process).exit(self.known_images.as_fd(), pid);
                }
            }
        }
    }

    /// Runs `op` on the per-process probes for process `pid`; a failure
    /// for a live process is kept (as `examine_request` does).
    fn per_process_request(
        &mut self,
        pid: u32,
        op: impl FnOnce(&mut PerProcess, &AllocPrograms, BorrowedFd<'_>) -> Result<bool, AttachError>,
    ) {
        let Some(per_process) = &self.per_process else {
            return;
        };
        let started = std::time::Instant::now();
        let done = op(
            &mut lock(per_process),
            &self.progs,
            self.known_images.as_fd(),
        );
        tracing::trace!(
            pid,
            us = started.elapsed().as_micros() as u64,
            "per-process probes made"
        );
        self.settle(pid, done);
    }

    /// What became of per-process probes made for process `pid`: a
    /// failure for a live process is kept.
    fn settle(&mut self, pid: u32, done: Result<bool, AttachError>) {
        match done {
            Ok(true) => {}
            Ok(false) => tracing::debug!(pid, "exited before its probes were made"),
            Err(_) if process_gone(pid) => tracing::debug!(pid, "exited while probed"),
            Err(error) => {
                tracing::error!(pid, %error, "attach failed");
                let image = match &error {
                    AttachError::Conflict { path, .. } | AttachError::Uprobe { path, .. } => {
                        path.display().to_string()
                    }
                    _ => String::new(),
                };
                self.failures.push(AttachFailure { pid, image, error });
            }
        }
    }

    /// Examines the requested image unless known, and with per-process
    /// probes makes the requesting process's probes on it.
    fn examine_request(&mut self, req: &MappingRecord) {
        let pid = req.pid;
        let id = FileId {
            dev: req.dev,
            ino: req.ino,
        };
        self.reload_released(req, id);
        if self.has_image(id) {
            self.per_process_request(pid, |p, progs, known| p.link(progs, known, pid, id));
            return;
        }
        if self.known.contains(&id) {
            return;
        }
        match self.examine(req, id) {
            Ok(Examined::Probed) => {
                self.mark_known(id);
                if self.has_image(id) {
                    self.link_first(pid, id);
                }
            }
            Ok(Examined::Skipped(image, reason)) => {
                self.skip(pid, id, image, reason);
                self.mark_known(id);
            }
            // Not examined: the next process that maps it asks again.
            Ok(Examined::Gone) => tracing::debug!(pid, image = %req.name, "exited before examined"),
            // It died while examined: as above.
            Err(_) if process_gone(pid) => {
                tracing::debug!(pid, image = %req.name, "exited while examined");
            }
            Err(error) => {
                tracing::error!(pid, image = %req.name, %error, "attach failed");
                self.failures.push(AttachFailure {
                    pid,
                    image: req.name.clone(),
                    error,
                });
                // Asking again would only fail again.
                self.mark_known(id);
            }
        }
    }

    /// Loads the table of image `id` again if it was released (no process
    /// mapped it; its `known_images` entry went with it, so this process
    /// asked, held: issue 23), and records the image known again.
    fn reload_released(&mut self, req: &MappingRecord, id: FileId) {
        let Some(tables) = self.tables.as_mut().filter(|t| t.was_released(id)) else {
            return;
        };
        let link = PathBuf::from(format!(
            "/proc/{}/map_files/{:x}-{:x}",
            req.pid, req.start, req.end
        ));
        // Gone meanwhile: the next process that maps it asks again.
        let Ok(real) = std::fs::read_link(&link).map(strip_deleted) else {
            return;
        };
        tables.load(&link, &real, id);
        tracing::debug!(image = %real.display(), "unwind table loaded again");
        if self.known.contains(&id) {
            self.mark_known(id);
        }
    }

    /// Makes the first per-process probes on image `id`, just examined,
    /// for process `pid`; an image whose code the kernel refuses to probe
    /// is skipped (and forgotten by the per-process probes), as one that
    /// failed to parse.
    fn link_first(&mut self, pid: u32, id: FileId) {
        let Some(per_process) = &self.per_process else {
            return;
        };
        let linked = lock(per_process).link(&self.progs, self.known_images.as_fd(), pid, id);
        let reason = linked.as_ref().err().and_then(AttachError::skip_reason);
        let Some(reason) = reason.filter(|_| !process_gone(pid)) else {
            return self.settle(pid, linked);
        };
        let image = lock(per_process).remove_image(id).unwrap_or_default();
        self.sites.retain(|s| s.image != image);
        self.examined.retain(|(path, _, _)| *path != image);
        self.skip(pid, id, image, reason);
        // Known to every process now: none of them gets probes on it.
        self.mark_known(id);
    }
}

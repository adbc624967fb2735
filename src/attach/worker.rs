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
//! A failure to resolve or attach for a live process is never silent: it
//! is kept and fails the capture, naming the file; the process is released
//! all the same, so nothing is left stopped.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use super::{
    AllocPrograms, AttachError, Links, Site, api, attach_sites, find_sites, image_key,
    strip_deleted,
};
use crate::engine::Sink;
use crate::proctree::stops::{Owner, Stops};
use crate::record::{self, MappingRecord};

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
    known: HashSet<(u64, u64)>,
    stops: Arc<Stops>,
    /// Probes attached so far; they live as long as the capture.
    pub links: Links,
    /// Sites attached so far, with their images' real paths.
    pub sites: Vec<Site>,
    pub failures: Vec<AttachFailure>,
    pub malformed: u64,
    /// Unwind tables, loaded for each image before its hold is released
    /// (None with `--unwind fp`).
    pub tables: Option<crate::unwind::Tables>,
}

impl AttachWorker {
    /// `known` lists the images already examined (and seeded into the
    /// `known_images` map).
    pub fn new(
        progs: AllocPrograms,
        known_images: OwnedFd,
        known: HashSet<(u64, u64)>,
        stops: Arc<Stops>,
        tables: Option<crate::unwind::Tables>,
    ) -> Self {
        Self {
            progs,
            known_images,
            known,
            stops,
            links: Links::default(),
            sites: Vec::new(),
            failures: Vec::new(),
            malformed: 0,
            tables,
        }
    }

    /// Examines and probes one image; `Ok(false)` when the process is gone.
    fn examine(&mut self, req: &MappingRecord, id: (u64, u64)) -> Result<bool, AttachError> {
        let link = PathBuf::from(format!(
            "/proc/{}/map_files/{:x}-{:x}",
            req.pid, req.start, req.end
        ));
        let real = match std::fs::read_link(&link) {
            Ok(path) => strip_deleted(path),
            Err(_) if !std::path::Path::new(&format!("/proc/{}", req.pid)).exists() => {
                return Ok(false);
            }
            Err(source) => return Err(AttachError::Read { path: link, source }),
        };
        if let Some(tables) = &mut self.tables {
            tables.load(&link, &real, id);
        }
        let mut sites = find_sites(&link, &api::all())?;
        if !sites.is_empty() {
            let mut links = Links::default();
            attach_sites(&self.progs, &sites, &mut links)?;
            self.links.append(&mut links);
            for site in &mut sites {
                site.image = real.clone();
            }
            tracing::debug!(image = %real.display(), sites = sites.len(), "probed");
            self.sites.extend(sites);
        }
        Ok(true)
    }

    fn mark_known(&mut self, id: (u64, u64)) {
        let key = image_key(id);
        if let Err(err) = crate::sys::bpf_map_update(self.known_images.as_fd(), &key, &[1]) {
            // Not fatal: BPF asks again for this image, and we answer again.
            tracing::warn!(%err, "could not record a known image");
        }
        self.known.insert(id);
    }
}

impl Sink for AttachWorker {
    fn record(&mut self, bytes: &[u8]) {
        let Ok(req) = record::decode_mapping(bytes) else {
            self.malformed += 1;
            return;
        };
        let pid = req.pid;
        if let Err(err) = self.stops.hold_stopped(pid as i32, Owner::Attach) {
            tracing::debug!(pid, %err, "could not hold the requesting process");
        }
        let id = (req.dev, req.ino);
        if !self.known.contains(&id) {
            match self.examine(&req, id) {
                Ok(_) => self.mark_known(id),
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
        if let Err(err) = self.stops.release(pid as i32, Owner::Attach) {
            tracing::warn!(pid, %err, "could not resume a process after attaching");
        }
    }
}

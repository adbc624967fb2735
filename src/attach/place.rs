//! Where an image's probes go: the one placement policy, for the images a
//! session probes up front and for those the attach worker examines.
//!
//! An image with allocator sites is, in this order of preference:
//! - recorded for per-process probes, when probes are made per process
//!   (each process that maps it gets its own links, made later);
//! - deferred, when the caller allows it (system-wide, up front, an image
//!   other than libc): its sites are kept and linked when a tracked process
//!   first maps it (see [`Placer::link_deferred`]);
//! - linked now, system-wide: all of its sites or none.
//!
//! An image without sites, or whose identity could not be read (it cannot
//! be told apart per process or when mapped), is linked now (nothing to
//! link for the former).

use std::collections::HashMap;
use std::mem;
use std::path::Path;

use super::per_process::PerProcess;
use super::{AllocPrograms, AttachError, HitSlots, Links, Site, attach_sites};
use crate::sys::FileId;

/// Where [`Placer::place`] put an image's sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// Recorded for per-process probes.
    PerProcess,
    /// Kept to be linked when a tracked process maps the image (the sites
    /// moved into the deferred map).
    Deferred,
    /// Linked system-wide (or nothing to link).
    Linked,
}

/// Sites examined but not linked yet, by image: linked system-wide when a
/// tracked process first maps their image.
pub type Deferred = HashMap<FileId, Vec<Site>>;

/// What an image's probes are placed with.
pub struct Placer<'a> {
    pub progs: &'a AllocPrograms,
    pub slots: &'a mut HitSlots,
    /// The per-process probes, when probes are made per process.
    pub per_process: Option<&'a mut PerProcess>,
    /// The images deferred so far.
    pub deferred: &'a mut Deferred,
    /// Whether system-wide images may be deferred (up front, for a tree
    /// held while the worker links).
    pub defer: bool,
    /// Where the links made now go.
    pub links: &'a mut Links,
}

/// One image to place.
pub struct Image<'p> {
    /// Its kernel file identity, when it could be read.
    pub id: Option<FileId>,
    /// The file probed (opened, linked).
    pub path: &'p Path,
    /// The name its sites carry once placed, when not `path` (the worker
    /// links through `/proc/PID/map_files` and names the real file).
    pub name: Option<&'p Path>,
    /// Whether it may be deferred (not libc: every command maps it).
    pub may_defer: bool,
}

impl Placer<'_> {
    /// Places `image`'s `sites` by the policy of the module docs.
    pub fn place(
        &mut self,
        image: &Image<'_>,
        sites: &mut Vec<Site>,
    ) -> Result<Placed, AttachError> {
        let rename = |sites: &mut Vec<Site>| {
            if let Some(name) = image.name {
                for site in sites {
                    site.image = name.to_owned();
                }
            }
        };
        if let Some(id) = image.id.filter(|_| !sites.is_empty()) {
            if let Some(per_process) = self.per_process.as_deref_mut() {
                self.slots.assign(sites);
                rename(sites);
                per_process.add_image(id, image.path, sites)?;
                return Ok(Placed::PerProcess);
            }
            if self.defer && image.may_defer {
                self.deferred.insert(id, mem::take(sites));
                return Ok(Placed::Deferred);
            }
        }
        // All of an image's links or none.
        let mut made = Links::default();
        attach_sites(self.progs, sites, self.slots, &mut made)?;
        self.links.append(&mut made);
        rename(sites);
        Ok(Placed::Linked)
    }

    /// Links the sites of image `id` examined earlier and deferred (see
    /// [`Placed::Deferred`]): all of them or none. None if it was not.
    pub fn link_deferred(&mut self, id: FileId) -> Option<Result<Vec<Site>, AttachError>> {
        let mut sites = self.deferred.remove(&id)?;
        let mut made = Links::default();
        Some(
            attach_sites(self.progs, &mut sites, self.slots, &mut made).map(|()| {
                self.links.append(&mut made);
                sites
            }),
        )
    }
}

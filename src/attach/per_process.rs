//! Per-process probes: uprobe_multi links that name one process, so that
//! only the tracked tree carries breakpoints and the rest of the host runs
//! its allocator untouched.
//!
//! The kernel filters such a link by its process: breakpoints go only into
//! that process's memory (and follow it across `exec`), and its program
//! runs only for that process's threads. A forked child inherits the
//! parent's breakpoints but not its links, so every process of the tree
//! needs links of its own: BPF holds a new process stopped at fork (before
//! its first instruction) and asks for them (`MT_REQ_FORK`); the attach
//! worker makes them for every image its parent has probes on, and
//! releases it. An image a process maps later is asked for as before, per
//! process (`known_images` keyed by image and process). At exit the links
//! go, closed on a thread of their own: the kernel waits for grace periods
//! (~30 ms) before a close returns.
//!
//! The price is a stop, a few `BPF_LINK_CREATE`s and a resume per fork
//! (perf/fork_storm.sh). What stays system-wide is cheap: the sched and
//! syscall tracepoints, which every process passes and leaves at once.

use crate::sys::{FileId, kernel_release};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::shim::{INTERPOSED, SHIM_COOKIE, Shim};
use super::{AllocPrograms, AttachError, Links, Role, Site, known_key, link_sites_with};

/// The per-process probes, shared by the attach worker and the session.
pub type Shared = std::sync::Arc<std::sync::Mutex<PerProcess>>;

/// The per-process probes, locked: the session holds them only while it
/// makes the command's first probes (before the command runs) and once the
/// worker has stopped.
pub fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, PerProcess> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An image with allocator sites, open for as long as the capture runs
/// (a file deleted or replaced meanwhile is still the one probed).
struct Probed {
    file: OwnedFd,
    sites: Vec<Site>,
}

/// A process's links on one image: whether they were made for a process
/// that maps the preload shim (without the allocator sites, see
/// [`kept_with_shim`]).
type Linked = (FileId, Links, bool);

/// The images with allocator sites met so far, and each live process's
/// links on them.
pub struct PerProcess {
    images: HashMap<FileId, Probed>,
    procs: HashMap<u32, Vec<Linked>>,
    detacher: Detacher,
    /// Links made over the capture, for the debug log at the end.
    pub made: u64,
    /// The preload shim (`--preload`): a process that maps it gets the
    /// hook's probe, and no allocator probe on any other image.
    shim: Option<Shim>,
    /// The processes whose program loaded the shim (the last one they
    /// exec'd, as far as its images' probes tell).
    pub preloaded: std::collections::BTreeSet<u32>,
}

impl PerProcess {
    pub fn new() -> Self {
        Self {
            images: HashMap::new(),
            procs: HashMap::new(),
            detacher: Detacher::default(),
            made: 0,
            shim: None,
            preloaded: std::collections::BTreeSet::new(),
        }
    }

    /// Probes the preload shim's hook in the processes that map it.
    pub fn set_shim(&mut self, shim: Shim) {
        self.shim = Some(shim);
    }

    /// Records image `id`, reached through `path`, with its `sites` (hit
    /// counters handed out already); none are attached yet.
    pub fn add_image(
        &mut self,
        id: FileId,
        path: &Path,
        sites: &[Site],
    ) -> Result<(), AttachError> {
        let file = std::fs::File::open(path).map_err(|source| AttachError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.images.insert(
            id,
            Probed {
                file: file.into(),
                sites: sites.to_vec(),
            },
        );
        Ok(())
    }

    /// Forgets image `id` (its probes could not be made); the path its
    /// sites named. Links already made on it stay until their process exits.
    pub fn remove_image(&mut self, id: FileId) -> Option<PathBuf> {
        let probed = self.images.remove(&id)?;
        probed.sites.first().map(|s| s.image.clone())
    }

    /// Whether image `id` has allocator sites (recorded by `add_image`),
    /// or is the preload shim.
    pub fn has_image(&self, id: FileId) -> bool {
        self.images.contains_key(&id) || self.shim.as_ref().is_some_and(|s| s.id == id)
    }

    /// Makes process `pid`'s probes on image `id` (once), and records the
    /// image known for it in BPF. `Ok(false)` when the process is gone.
    pub fn link(
        &mut self,
        progs: &AllocPrograms,
        known: BorrowedFd<'_>,
        pid: u32,
        id: FileId,
    ) -> Result<bool, AttachError> {
        if self.shim.as_ref().is_some_and(|s| s.id == id) {
            return self.link_shim(progs, known, pid);
        }
        let Some(probed) = self.images.get(&id) else {
            return Ok(true);
        };
        // A process that maps the shim now: no allocator probes.
        let filtered = self.shim.as_ref().is_some_and(|s| s.mapped_by(pid));
        let linked = self.procs.entry(pid).or_default();
        if let Some(at) = linked.iter().position(|(i, _, _)| *i == id) {
            if linked[at].2 == filtered {
                return Ok(true);
            }
            // Made before an exec into a program with (or without) the shim.
            let (_, old, _) = linked.remove(at);
            self.detacher.close(old);
        }
        // The executable comes before the shim in symbol lookup: its own
        // allocator, if it has one, is called without it.
        let sites: Vec<Site> = if filtered && !Shim::is_executable(pid, id) {
            kept_with_shim(&probed.sites)
        } else {
            probed.sites.clone()
        };
        let bits = if filtered { SHIM_COOKIE } else { 0 };
        let path = PathBuf::from(format!("/proc/self/fd/{}", probed.file.as_raw_fd()));
        let mut links = Links::default();
        match link_sites_with(progs, &sites, &path, pid, &mut links, bits) {
            Ok(()) => {}
            Err(AttachError::Uprobe { source, .. }) if source.errno() == Some(libc::ESRCH) => {
                return Ok(false);
            }
            Err(err) => return Err(err),
        }
        self.made += links.len() as u64;
        linked.push((id, links, filtered));
        if !filtered {
            // Its program now is one without the shim (after an exec).
            self.preloaded.remove(&pid);
        }
        // Not known with the shim: after an exec into a program without
        // it, the image is asked for again and probed whole.
        if !filtered && let Err(err) = crate::sys::bpf_map_update(known, &known_key(id, pid), &[1])
        {
            // Not fatal: BPF asks again, and `link` finds the links made.
            tracing::warn!(pid, %err, "could not record an image known for a process");
        }
        Ok(true)
    }

    /// Process `pid` maps the preload shim: probes its hook (once), and
    /// makes the process's links on other images again without their
    /// allocator sites (made before ld.so mapped the shim: the executable,
    /// or images of the program before an exec). Never recorded known: a
    /// later exec that maps it again asks again.
    fn link_shim(
        &mut self,
        progs: &AllocPrograms,
        known: BorrowedFd<'_>,
        pid: u32,
    ) -> Result<bool, AttachError> {
        let (Some(shim), Some(prog)) = (&self.shim, &progs.shim) else {
            return Ok(true);
        };
        let linked = self.procs.entry(pid).or_default();
        if !linked.iter().any(|(i, _, _)| *i == shim.id) {
            let path = shim.probe_path();
            let made = crate::sys::uprobe_multi(
                prog.prog.as_fd(),
                &path,
                &[shim.hook_offset],
                &[prog.cookie],
                prog.kind,
                pid,
            );
            let link = match made {
                Ok(link) => link,
                Err(source) if source.errno() == Some(libc::ESRCH) => return Ok(false),
                Err(source) => {
                    return Err(AttachError::Uprobe {
                        path,
                        symbol: "memtrail_hook".into(),
                        source,
                    });
                }
            };
            let mut links = Links::default();
            links.push_fd(link);
            self.made += 1;
            linked.push((shim.id, links, true));
        }
        self.preloaded.insert(pid);
        let whole: Vec<FileId> = linked
            .iter()
            .filter(|(i, _, filtered)| !filtered && *i != shim.id)
            .map(|(i, _, _)| *i)
            .collect();
        for id in whole {
            let _ = crate::sys::bpf_map_delete(known, &known_key(id, pid));
            if !self.link(progs, known, pid, id)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Gives `child`, forked by `parent`, probes on every image its parent
    /// has them on. `Ok(false)` when the child is gone.
    pub fn fork(
        &mut self,
        progs: &AllocPrograms,
        known: BorrowedFd<'_>,
        parent: u32,
        child: u32,
    ) -> Result<bool, AttachError> {
        let images: Vec<FileId> = self
            .procs
            .get(&parent)
            .map(|linked| linked.iter().map(|(id, _, _)| *id).collect())
            .unwrap_or_default();
        for id in images {
            if !self.link(progs, known, child, id)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Process `pid` exited: its links go (on the detacher), and its images
    /// are no longer known for it (its pid may name another process later).
    pub fn exit(&mut self, known: BorrowedFd<'_>, pid: u32) {
        let Some(linked) = self.procs.remove(&pid) else {
            return;
        };
        let mut all = Links::default();
        for (id, mut links, _) in linked {
            let _ = crate::sys::bpf_map_delete(known, &known_key(id, pid));
            all.append(&mut links);
        }
        self.detacher.close(all);
    }

    /// A thread other than `pid`'s leader exec'd: its links named the old
    /// leader, which is gone; they are made again for the process as it is.
    pub fn relink(
        &mut self,
        progs: &AllocPrograms,
        known: BorrowedFd<'_>,
        pid: u32,
    ) -> Result<bool, AttachError> {
        let Some(linked) = self.procs.remove(&pid) else {
            return Ok(true);
        };
        let mut old = Links::default();
        let mut images = Vec::new();
        for (id, mut links, _) in linked {
            images.push(id);
            old.append(&mut links);
        }
        for id in images {
            if !self.link(progs, known, pid, id)? {
                break;
            }
        }
        self.detacher.close(old);
        Ok(true)
    }

    /// Every link still open, and the detacher (dropping it waits for the
    /// closes it has under way).
    pub fn into_links(self) -> (Links, impl Send) {
        let mut all = Links::default();
        for (_, linked) in self.procs {
            for (_, mut links, _) in linked {
                all.append(&mut links);
            }
        }
        (all, self.detacher)
    }
}

/// The sites of an image (not the executable) kept in a process that maps
/// the preload shim: in libc, all but the allocator functions the shim
/// interposes, whose calls by name all go through it to libc's; in other
/// images, all. The probes kept (an allocator library's own API, as
/// `mi_malloc`, and its standard names, which the shim's calls reach when
/// it is the allocator; operator new, the syscall wrappers, the region
/// markers) make no record while the shim's real call runs (`SHIM_COOKIE`),
/// so nothing is counted twice, and a direct call (`mi_malloc`, or
/// `malloc` through `dlsym` on the library's handle) is counted by them.
/// (A site has one name per address: mimalloc's `malloc` is its
/// `mi_malloc`, named `malloc`.)
fn kept_with_shim(sites: &[Site]) -> Vec<Site> {
    let libc = sites.iter().any(|s| {
        s.image
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
    });
    sites
        .iter()
        .filter(|s| {
            !(libc
                && matches!(s.role, Role::Alloc | Role::Free | Role::Return(_))
                && INTERPOSED.contains(&s.symbol.as_str()))
        })
        .cloned()
        .collect()
}

impl Default for PerProcess {
    fn default() -> Self {
        Self::new()
    }
}

/// Closes links on a thread of its own (started at the first exit), a
/// batch at a time: whatever arrived while a batch waited for its grace
/// periods is closed together next, so a storm of exits costs a few grace
/// periods, not one per link.
#[derive(Default)]
struct Detacher {
    send: Option<mpsc::Sender<Links>>,
    thread: Option<JoinHandle<()>>,
}

impl Detacher {
    fn start(&mut self) {
        let (send, recv) = mpsc::channel::<Links>();
        let thread = std::thread::Builder::new()
            .name("memtrail-unlink".into())
            .spawn(move || {
                while let Ok(mut batch) = recv.recv() {
                    while let Ok(mut more) = recv.try_recv() {
                        batch.append(&mut more);
                    }
                    drop(batch);
                }
            });
        match thread {
            Ok(thread) => {
                self.send = Some(send);
                self.thread = Some(thread);
            }
            Err(err) => tracing::debug!(%err, "no detacher thread: links close where they go"),
        }
    }

    fn close(&mut self, links: Links) {
        if links.is_empty() {
            return;
        }
        if self.send.is_none() {
            self.start();
        }
        match &self.send {
            Some(send) => {
                // On failure the links come back in the error and close here.
                let _ = send.send(links);
            }
            None => drop(links),
        }
    }
}

impl Drop for Detacher {
    fn drop(&mut self) {
        drop(self.send.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where allocator probes go (`--probes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Probes {
    /// Per process for a running process (`memtrail attach`, a session on
    /// a pid or on its own process) where the kernel can hold a new process
    /// at fork (`bpf_send_signal_task`, Linux 6.13); system-wide for a
    /// command memtrail starts.
    #[default]
    Auto,
    /// Only in the tracked processes; fails on a kernel without it.
    PerProcess,
    /// In every process that maps a probed file (each pays a trap per
    /// allocator call while memtrail runs); no stop at fork.
    SystemWide,
}

/// Per-process probes were asked for on a kernel that cannot make them.
#[derive(Debug)]
pub struct Unsupported {
    /// The kernel feature missing.
    pub feature: &'static str,
    /// What to do instead.
    pub hint: &'static str,
}

/// The first Linux release with the `bpf_send_signal_task` kfunc.
const SEND_SIGNAL_TASK: (u32, u32) = (6, 13);

impl Probes {
    /// Whether probes are made per process on this kernel, for a capture
    /// of a running process (`running`) or of a command memtrail starts.
    ///
    /// `auto` keeps a command's probes system-wide: its tree is the
    /// workload, often thousands of short processes, each of which a
    /// per-process capture holds at fork (~1.3 ms, perf/RESULTS.md), and
    /// a parent that waits with `WUNTRACED` (a job-control shell) would
    /// see that hold as its child stopping. A running process is most
    /// often a service on a host doing other work, which system-wide
    /// probes would slow (a bystander's malloc/free pair: ~15 ns alone,
    /// ~2.9 µs under system-wide probes).
    pub fn per_process(self, running: bool) -> Result<bool, Unsupported> {
        let able = || kernel_release() >= SEND_SIGNAL_TASK;
        match self {
            Probes::SystemWide => Ok(false),
            Probes::Auto => Ok(running && able()),
            Probes::PerProcess if able() => Ok(true),
            Probes::PerProcess => Err(Unsupported {
                feature: "bpf_send_signal_task (Linux 6.13), for per-process probes",
                hint: "use --probes system-wide (or auto) on this kernel",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Probes, SEND_SIGNAL_TASK};
    use crate::sys::kernel_release;

    /// Check that `auto` makes probes per process for a running process
    /// only, and only on a kernel that can hold a process at fork; that
    /// `system-wide` never does; and that `per-process` does where it can
    /// and is refused where it cannot.
    #[test]
    fn probes_auto_per_process_for_running_targets() {
        let able = kernel_release() >= SEND_SIGNAL_TASK;
        assert!(!Probes::Auto.per_process(false).expect("auto"));
        assert_eq!(Probes::Auto.per_process(true).expect("auto"), able);
        assert!(!Probes::SystemWide.per_process(true).expect("system-wide"));
        assert_eq!(Probes::PerProcess.per_process(false).is_ok(), able);
    }
}

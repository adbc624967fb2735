//! The tree's cgroup: pausing the tracked tree in a way it cannot observe.
//!
//! memtrail puts the command, before its first instruction, into a cgroup
//! v2 of its own (`memtrail-PID`, a child of memtrail's own cgroup), which
//! every descendant inherits. Pausing the tree is then one write to the
//! cgroup's `cgroup.freeze`: the kernel parks every task at its next
//! signal-delivery point without generating a signal, so a parent sees no
//! `SIGCHLD`, `waitpid(WUNTRACED)` reports nothing, and a job-control shell
//! shows no `Stopped` job (SIGSTOP did all three). `cgroup.events` says when
//! every task has got there (`frozen 1`); a vfork parent waiting for its
//! child counts as frozen, so a vfork in the tree does not stall a pause.
//!
//! Ownership: [`CgroupPlace`] finds where the cgroup goes before anything
//! is made, so that the guardian (`sys::Guardian`), which thaws and removes
//! the cgroup if memtrail dies, starts before the cgroup exists: no kill of
//! memtrail can leave it behind (issue 28). [`TreeCgroup`] then owns the
//! directory; dropping it thaws the cgroup and removes it once empty.
//!
//! Where there is no usable cgroup v2 (not mounted, no `cgroup.freeze`
//! file, no right to create a cgroup) [`CgroupPlace::locate`] or
//! [`CgroupPlace::create`] fails and the
//! pressure coordinator falls back to stopping processes through pidfds.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::engine::idle::IdleWait;

/// Errors setting up or driving the tree's cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted")]
    NotMounted,
    #[error("memtrail's own cgroup v2 path is not in /proc/self/cgroup")]
    NoOwnCgroup,
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A cgroup v2 holding the tracked tree, with its freezer.
#[derive(Debug)]
pub struct TreeCgroup {
    dir: PathBuf,
    /// `cgroup.freeze`, open for writing.
    freeze: File,
    /// `cgroup.events`, open for reading.
    events: File,
}

/// Where the cgroup v2 hierarchy is mounted, from /proc/mounts (the hybrid
/// layout mounts it at /sys/fs/cgroup/unified, the unified one at
/// /sys/fs/cgroup).
fn cgroup2_mount() -> Result<PathBuf, CgroupError> {
    let mounts = fs::read_to_string("/proc/mounts").map_err(|source| CgroupError::Io {
        what: "reading",
        path: "/proc/mounts".into(),
        source,
    })?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let _source = fields.next()?;
            let dir = fields.next()?;
            (fields.next()? == "cgroup2").then(|| PathBuf::from(unescape_mount(dir)))
        })
        .next()
        .ok_or(CgroupError::NotMounted)
}

/// /proc/mounts escapes space, tab, newline and backslash as octal.
fn unescape_mount(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Removes the empty `memtrail-PID` cgroups of memtrails that are gone: a
/// cgroup whose pid names no process at all and that holds none. (A live
/// process with that pid keeps it, whatever its name: memtrail may run
/// under another name, and a concurrent capture's cgroup is empty until
/// its command starts; issue 28.)
fn remove_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("memtrail-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        let empty = fs::read_to_string(entry.path().join("cgroup.events"))
            .is_ok_and(|e| e.lines().any(|l| l == "populated 0"));
        if !alive && empty && fs::remove_dir(entry.path()).is_ok() {
            tracing::debug!(cgroup = %entry.path().display(), "removed a stale cgroup");
        }
    }
}

/// memtrail's own cgroup v2 path (the `0::` line of /proc/self/cgroup).
fn own_cgroup() -> Result<String, CgroupError> {
    let text = fs::read_to_string("/proc/self/cgroup").map_err(|source| CgroupError::Io {
        what: "reading",
        path: "/proc/self/cgroup".into(),
        source,
    })?;
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(|p| p.trim_start_matches('/').to_owned())
        .ok_or(CgroupError::NoOwnCgroup)
}

/// Where the tree's cgroup goes: `memtrail-PID` under memtrail's own
/// cgroup v2, found (and stale cgroups of dead memtrails removed) but not
/// made yet.
#[derive(Debug)]
pub struct CgroupPlace {
    /// memtrail's own cgroup, the new one's parent.
    parent_dir: PathBuf,
    parent: File,
    name: std::ffi::CString,
}

impl CgroupPlace {
    /// Finds memtrail's own cgroup v2 and opens it.
    pub fn locate() -> Result<Self, CgroupError> {
        let parent_dir = cgroup2_mount()?.join(own_cgroup()?);
        remove_stale(&parent_dir);
        let parent = File::open(&parent_dir).map_err(|source| CgroupError::Io {
            what: "opening",
            path: parent_dir.clone(),
            source,
        })?;
        let name = std::ffi::CString::new(format!("memtrail-{}", std::process::id()))
            .expect("no NUL in a number");
        Ok(Self {
            parent_dir,
            parent,
            name,
        })
    }

    /// What the guardian needs to thaw and remove the cgroup if memtrail
    /// dies (it may not exist yet).
    pub fn for_guardian(&self) -> crate::sys::GuardianCgroup<'_> {
        crate::sys::GuardianCgroup {
            parent: self.parent.as_fd(),
            name: &self.name,
        }
    }

    /// Creates the cgroup and opens its freezer.
    pub fn create(self) -> Result<TreeCgroup, CgroupError> {
        let dir = self.parent_dir.join(self.name.to_string_lossy().as_ref());
        let io_err = |what, path: &Path| {
            let path = path.to_owned();
            move |source| CgroupError::Io { what, path, source }
        };
        match fs::create_dir(&dir) {
            Ok(()) => {}
            // Left by an earlier memtrail with this pid that was killed:
            // reuse it if it is empty (adding a process fails otherwise).
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("creating cgroup", &dir)(e)),
        }
        let open = |name: &str, write: bool| {
            let path = dir.join(name);
            OpenOptions::new()
                .read(!write)
                .write(write)
                .open(&path)
                .map_err(io_err("opening", &path))
        };
        let opened =
            open("cgroup.freeze", true).and_then(|f| Ok((f, open("cgroup.events", false)?)));
        let (freeze, events) = match opened {
            Ok(files) => files,
            Err(err) => {
                let _ = fs::remove_dir(&dir);
                return Err(err);
            }
        };
        let cgroup = TreeCgroup {
            dir,
            freeze,
            events,
        };
        // A reused directory may have been left frozen.
        cgroup.thaw()?;
        Ok(cgroup)
    }
}

impl TreeCgroup {
    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves process `pid` (with all its threads) into the cgroup.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        let path = self.dir.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(pid.to_string().as_bytes()))
            .map_err(|source| CgroupError::Io {
                what: "adding a process to",
                path,
                source,
            })
    }

    fn write_freeze(&self, value: &[u8]) -> Result<(), CgroupError> {
        (&self.freeze)
            .write_all(value)
            .map_err(|source| CgroupError::Io {
                what: "writing",
                path: self.dir.join("cgroup.freeze"),
                source,
            })
    }

    /// Asks the kernel to freeze every task of the cgroup; see
    /// [`TreeCgroup::wait_frozen`].
    pub fn freeze(&self) -> Result<(), CgroupError> {
        self.write_freeze(b"1")
    }

    /// Lets every task of the cgroup run again.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        self.write_freeze(b"0")
    }

    /// Whether `cgroup.events` reports the freeze complete.
    pub fn is_frozen(&self) -> Result<bool, CgroupError> {
        Ok(self.event("frozen")? == Some(1))
    }

    /// Whether any process is left in the cgroup.
    pub fn is_populated(&self) -> Result<bool, CgroupError> {
        Ok(self.event("populated")? == Some(1))
    }

    fn event(&self, key: &str) -> Result<Option<u64>, CgroupError> {
        let mut text = String::new();
        let mut file = &self.events;
        file.rewind()
            .and_then(|_| file.read_to_string(&mut text))
            .map_err(|source| CgroupError::Io {
                what: "reading",
                path: self.dir.join("cgroup.events"),
                source,
            })?;
        Ok(text.lines().find_map(|line| {
            let (k, v) = line.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok())?
        }))
    }

    /// Waits until the freeze is complete, or `deadline` passes (`None`:
    /// no deadline). Returns whether it completed.
    pub fn wait_frozen(&self, deadline: Option<Instant>) -> Result<bool, CgroupError> {
        let mut idle = IdleWait::new(std::time::Duration::from_micros(100));
        loop {
            if self.is_frozen()? {
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            idle.idle();
        }
    }

    /// Pids of the processes in the cgroup.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let path = self.dir.join("cgroup.procs");
        let text = fs::read_to_string(&path).map_err(|source| CgroupError::Io {
            what: "reading",
            path,
            source,
        })?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }
}

impl Drop for TreeCgroup {
    /// Thaws the cgroup and removes it if it is empty (the tree has exited
    /// on every normal path; a cgroup still holding processes stays, and
    /// the guardian, dismissed after this, removes it once the tree has
    /// left).
    fn drop(&mut self) {
        if let Err(err) = self.thaw()
            && self.dir.exists()
        {
            tracing::warn!(%err, "could not thaw the tree's cgroup");
        }
        if let Err(err) = fs::remove_dir(&self.dir) {
            tracing::debug!(%err, cgroup = %self.dir.display(), "could not remove the tree's cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check that /proc/mounts' octal escapes are decoded.
    #[test]
    fn cgroup_mount_unescape() {
        assert_eq!(unescape_mount("/sys/fs/cgroup"), "/sys/fs/cgroup");
        assert_eq!(unescape_mount("/a\\040b"), "/a b");
        assert_eq!(unescape_mount("/a\\134b"), "/a\\b");
        assert_eq!(unescape_mount("/a\\9"), "/a\\9");
    }
}

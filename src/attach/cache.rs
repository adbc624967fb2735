//! Images examined by earlier captures, kept on disk, so that a capture
//! holds a process at exec or `mmap` only for an image no capture has seen.
//!
//! The attach hold stops a process with SIGSTOP, which its parent can see
//! (a job-control shell reports the job `Stopped`). It is needed only
//! until memtrail knows whether the image has allocator entry points, and
//! has probed them if it does. So each capture records the images it
//! examined — path, kernel file identity (device, inode), size, mtime and
//! ctime, and whether it found allocator entry points — and the next
//! capture, before the command starts, checks every entry against the file
//! at its path: an unchanged image without entry points is marked known
//! in BPF (no hold), one with entry points is probed up front (no hold
//! either). A file replaced or modified since changes inode or ctime and is
//! examined again, held. An image whose only sites are USDT region markers
//! is never recorded (it would be probed up front in every capture): it is
//! examined, held, in each capture that maps it.
//!
//! Where: `$MEMTRAIL_CACHE_DIR`, else `$XDG_CACHE_HOME/memtrail`, else
//! `$HOME/.cache/memtrail`; the file is `images-v3.tsv`, written whole
//! (temporary file + rename), at most [`MAX_ENTRIES`] lines, newest last.
//! A missing, unreadable or malformed cache is an empty one: the cache only
//! saves holds, never changes counts.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Entries kept; the oldest go first.
pub const MAX_ENTRIES: usize = 4096;

/// v2: the probed APIs gained libc's mmap and sbrk, so an image v1 recorded
/// as having no entry points may have some now. v3: a static image without
/// symbols has its allocator found by its code (`static_image`), so one v2
/// recorded without entry points may have some now.
const FILE: &str = "images-v3.tsv";

/// What a file looked like when it was examined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Stamp {
    /// The stamp of the file at `path` now (following symlinks).
    pub fn of(path: &Path) -> Option<Self> {
        let md = fs::metadata(path).ok()?;
        if !md.is_file() {
            return None;
        }
        let dev = md.dev();
        Some(Self {
            dev: crate::sys::kernel_dev(dev),
            ino: md.ino(),
            size: md.size(),
            mtime_ns: i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec()),
            ctime_ns: i128::from(md.ctime()) * 1_000_000_000 + i128::from(md.ctime_nsec()),
        })
    }

    /// The kernel's identity of the file, as BPF's `known_images` keys it.
    pub fn id(&self) -> crate::sys::FileId {
        crate::sys::FileId {
            dev: self.dev,
            ino: self.ino,
        }
    }
}

/// One examined image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub path: PathBuf,
    pub stamp: Stamp,
    /// Whether it has allocator entry points (probed when found).
    pub has_sites: bool,
}

/// The cache file's entries, by path.
#[derive(Debug, Default)]
pub struct ImageCache {
    file: Option<PathBuf>,
    /// In the order they were last recorded, oldest first.
    entries: Vec<Entry>,
}

/// The cache directory (see the module docs); `None` when no variable
/// names one.
pub fn dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("MEMTRAIL_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(xdg).join("memtrail"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".cache/memtrail"))
}

impl ImageCache {
    /// Reads the cache from [`dir`]; empty when there is none.
    pub fn load() -> Self {
        let Some(file) = dir().map(|d| d.join(FILE)) else {
            return Self::default();
        };
        let entries = fs::read(&file)
            .map(|bytes| parse(&bytes))
            .unwrap_or_default();
        Self {
            file: Some(file),
            entries,
        }
    }

    /// Entries whose file is unchanged since it was examined.
    pub fn valid(&self) -> Vec<&Entry> {
        self.entries
            .iter()
            .filter(|e| Stamp::of(&e.path).as_ref() == Some(&e.stamp))
            .collect()
    }

    /// Records that the image at `path`, as `stamp` describes it, was
    /// examined.
    pub fn record(&mut self, path: &Path, stamp: Stamp, has_sites: bool) {
        self.entries.retain(|e| e.path != path);
        self.entries.push(Entry {
            path: path.to_owned(),
            stamp,
            has_sites,
        });
    }

    /// Writes the cache back whole. Failing to is not an error of the
    /// capture: the next one holds again, that is all.
    pub fn save(&mut self) {
        let Some(file) = &self.file else {
            return;
        };
        let excess = self.entries.len().saturating_sub(MAX_ENTRIES);
        self.entries.drain(..excess);
        let mut text = Vec::new();
        for e in &self.entries {
            let s = &e.stamp;
            let _ = write!(
                text,
                "{}\t{}\t{}\t{}\t{}\t{}\t",
                s.dev,
                s.ino,
                s.size,
                s.mtime_ns,
                s.ctime_ns,
                u8::from(e.has_sites)
            );
            text.extend_from_slice(e.path.as_os_str().as_bytes());
            text.push(b'\n');
        }
        let written = file
            .parent()
            .map_or(Ok(()), fs::create_dir_all)
            .and_then(|()| {
                let dir = file.parent().unwrap_or(Path::new("."));
                let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
                tmp.write_all(&text)?;
                tmp.persist(file).map_err(|e| e.error)?;
                Ok(())
            });
        if let Err(err) = written {
            tracing::debug!(%err, cache = %file.display(), "could not write the image cache");
        }
    }
}

/// Entries of a cache file; malformed lines are skipped.
fn parse(bytes: &[u8]) -> Vec<Entry> {
    let mut by_path: HashMap<PathBuf, usize> = HashMap::new();
    let mut entries: Vec<Entry> = Vec::new();
    for line in bytes.split(|&b| b == b'\n') {
        let mut fields = line.splitn(7, |&b| b == b'\t');
        let mut num = || -> Option<i128> { std::str::from_utf8(fields.next()?).ok()?.parse().ok() };
        let (Some(dev), Some(ino), Some(size), Some(mtime_ns), Some(ctime_ns), Some(sites)) =
            (num(), num(), num(), num(), num(), num())
        else {
            continue;
        };
        let Some(path) = fields.next().filter(|p| p.first() == Some(&b'/')) else {
            continue;
        };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(path));
        let (Ok(dev), Ok(ino), Ok(size)) =
            (u64::try_from(dev), u64::try_from(ino), u64::try_from(size))
        else {
            continue;
        };
        let entry = Entry {
            path: path.clone(),
            stamp: Stamp {
                dev,
                ino,
                size,
                mtime_ns,
                ctime_ns,
            },
            has_sites: sites != 0,
        };
        match by_path.get(&path) {
            Some(&i) => entries[i] = entry,
            None => {
                by_path.insert(path, entries.len());
                entries.push(entry);
            }
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check that a saved cache reads back, that a changed file is no
    /// longer valid, and that malformed lines are skipped.
    #[test]
    fn attach_image_cache_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("img");
        fs::write(&image, b"one").unwrap();
        let mut cache = ImageCache {
            file: Some(dir.path().join(FILE)),
            entries: Vec::new(),
        };
        cache.record(&image, Stamp::of(&image).unwrap(), false);
        cache.save();
        let mut text = fs::read(dir.path().join(FILE)).unwrap();
        text.extend_from_slice(b"garbage\n1\t2\t3\n");
        fs::write(dir.path().join(FILE), &text).unwrap();
        let read = parse(&fs::read(dir.path().join(FILE)).unwrap());
        assert_eq!(read, cache.entries);
        let loaded = ImageCache {
            file: None,
            entries: read,
        };
        assert_eq!(loaded.valid().len(), 1);
        // Rewriting changes size and ctime.
        fs::write(&image, b"other contents").unwrap();
        assert!(loaded.valid().is_empty());
    }
}

//! Releasing the tables of images no process maps any more (issue 23).
//!
//! Who maps an image is the kernel's to say: `/proc/PID/maps` of every
//! process lists the files mapped, after every fork (a child inherits its
//! parent's mappings), exec, exit, munmap or dlclose, with no record to
//! lose or to order against another ring's. So no count is kept: when the
//! slots would grow by a shard (or at every load, with the test fault
//! `sweep-unwind-tables`), [`Tables::release_unmapped`] looks which loaded
//! tables' images no process maps, and releases those. Every process
//! counts, tracked or not: a table stays while anything maps its file
//! (never less than the tracked processes need).
//!
//! A release, in this order (BPF's side: the comment above `row_cache` in
//! bpf/maps.bpf.h):
//! 1. The image's `known_images` entry goes: a process that maps it from
//!    now on asks for it, held, and the attach worker loads its table again
//!    before resuming it (`Tables::was_released`).
//! 2. The mappings are read again: a process that mapped the image before
//!    1 without asking is seen now, and the image stays (its entry back).
//! 3. Its `unwind_images` entry goes; an RCU grace period (every BPF
//!    program that could have copied the entry has returned); every
//!    `code_maps` entry goes (the copies made before the delete); a second
//!    grace period (no program holds such a copy any more: none reads the
//!    slots or writes a row cache entry naming them).
//! 4. The row cache is cleared (its entries name slots only through a
//!    hash), and the slots are free; the next table written into them is published by its
//!    `unwind_images` update, a syscall, after all of this.
//!
//! A walk that raced the release lost the table before its slots changed:
//! it ends or takes frame-pointer steps as in an image without a table,
//! never reading another image's rows. Where the kernel cannot wait for a
//! grace period (`sys::rcu_grace_period`), nothing is released.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use memmap2::MmapMut;

use super::Tables;
use crate::sys::FileId;

/// Slots of BPF's row cache (`MT_ROW_CACHE`).
const ROW_CACHE_SLOTS: usize = 1 << 16;

/// The BPF maps a release touches besides the tables' own.
#[derive(Clone, Copy)]
pub struct ReleaseMaps<'a> {
    /// `known_images`: images examined, for which BPF asks nothing.
    pub known_images: BorrowedFd<'a>,
    /// `code_maps`: each process's cached executable mappings.
    pub code_maps: BorrowedFd<'a>,
    /// `row_cache`: the rows searches found lately (mappable).
    pub row_cache: BorrowedFd<'a>,
}

/// [`ReleaseMaps`], kept; None when tables cannot be released (a map
/// could not be kept or mapped, or the kernel cannot wait for a grace
/// period): they then stay until the capture ends.
pub(super) struct Maps(Option<Kept>);

struct Kept {
    known_images: OwnedFd,
    code_maps: OwnedFd,
    row_cache: MmapMut,
}

impl Maps {
    pub(super) fn new(maps: ReleaseMaps<'_>) -> Self {
        let kept = (|| -> std::io::Result<Kept> {
            // SAFETY: row_cache is a BPF_F_MMAPABLE array of
            // ROW_CACHE_SLOTS 8-byte words; the mapping keeps the map alive
            // and is only read and written as whole aligned words (see
            // `row_cache`).
            let row_cache = unsafe {
                memmap2::MmapOptions::new()
                    .len(ROW_CACHE_SLOTS * 8)
                    .map_mut(std::os::fd::AsRawFd::as_raw_fd(&maps.row_cache))
            }?;
            if let Err(err) = row_cache.advise(memmap2::Advice::DontFork) {
                tracing::debug!(%err, "row cache: MADV_DONTFORK not set");
            }
            Ok(Kept {
                known_images: maps.known_images.try_clone_to_owned()?,
                code_maps: maps.code_maps.try_clone_to_owned()?,
                row_cache,
            })
        })();
        match kept {
            Ok(kept) => Self(Some(kept)),
            Err(err) => {
                tracing::debug!(%err, "unwind tables stay until the capture ends");
                Self(None)
            }
        }
    }
}

impl Kept {
    /// The row cache's words.
    fn row_cache(&self) -> &[AtomicU64] {
        let words = self.row_cache.as_ptr().cast::<AtomicU64>();
        // SAFETY: the mapping is page-aligned, ROW_CACHE_SLOTS words long
        // and lives as long as self; BPF writes the words whole (8 bytes,
        // aligned), so atomics view them as they are.
        unsafe { std::slice::from_raw_parts(words, ROW_CACHE_SLOTS) }
    }

    /// Clears the row cache: its entries name a place in the tables only
    /// through a hash (bpf/unwind.c, `row_cache`), so every entry
    /// goes, those of the tables kept too (a frame of theirs searches its
    /// row again once).
    fn clear_rows(&self) -> u64 {
        let mut cleared = 0;
        for word in self.row_cache() {
            // Relaxed: no BPF program writes an entry naming the released
            // slots any more (the grace periods before); the stores are
            // ordered before the next table's entry by its update syscall.
            let entry = word.load(Ordering::Relaxed);
            if entry != 0 {
                let _ = word.compare_exchange(entry, 0, Ordering::Relaxed, Ordering::Relaxed);
                cleared += 1;
            }
        }
        cleared
    }
}

/// The files some process maps, from every `/proc/PID/maps`: their
/// (kernel device, inode), and their paths; None when /proc cannot be
/// listed.
///
/// Both, because the two can differ from what BPF read: on overlayfs,
/// maps shows the overlay's inode where BPF reads the mapped backing
/// file's; a table whose image matches either stays.
fn mapped_files() -> Option<Mapped> {
    let mut files = Mapped::default();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        // Gone meanwhile, or exiting (its maps empty): maps nothing.
        let Ok(maps) = crate::sys::read_maps(&entry.path().join("maps")) else {
            continue;
        };
        for line in maps.lines() {
            if let Some(id) = file_of_line(line) {
                files.ids.insert(id);
                if let Some(at) = line.find(" /") {
                    let path = line[at + 1..].trim_end();
                    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
                    files.paths.insert(std::path::PathBuf::from(path));
                }
            }
        }
    }
    Some(files)
}

/// What [`mapped_files`] found.
#[derive(Default)]
struct Mapped {
    ids: HashSet<FileId>,
    paths: HashSet<std::path::PathBuf>,
}

impl Mapped {
    /// Whether image `id`, at `path`, is mapped.
    fn has(&self, id: &FileId, path: &std::path::Path) -> bool {
        self.ids.contains(id) || self.paths.contains(path)
    }
}

/// The file a `/proc/PID/maps` line maps: `start-end perms offset
/// MAJ:MIN inode path`, the device in hex, as the kernel encodes `s_dev`
/// (major << 20 | minor, which BPF reads); None for anonymous memory.
fn file_of_line(line: &str) -> Option<FileId> {
    let mut fields = line.split_ascii_whitespace().skip(3);
    let (major, minor) = fields.next()?.split_once(':')?;
    let ino: u64 = fields.next()?.parse().ok()?;
    if ino == 0 {
        return None;
    }
    let dev = u64::from_str_radix(major, 16).ok()? << 20 | u64::from_str_radix(minor, 16).ok()?;
    Some(FileId { dev, ino })
}

impl Tables {
    /// Releases the tables of images no process maps (see the module's
    /// docs for the order); their slots become free.
    pub(super) fn release_unmapped(&mut self) {
        let Some(kept) = self.release.0.take() else {
            return;
        };
        if self.release_with(&kept) {
            self.release.0 = Some(kept);
        } else {
            // The tables are gone from BPF, but a walk may still read
            // their slots: none is reused, and nothing released again.
            tracing::warn!("no RCU grace period: released unwind tables' slots are not reused");
        }
    }

    /// [`release_unmapped`](Self::release_unmapped) with the maps `kept`;
    /// false when the kernel could not wait for a grace period.
    fn release_with(&mut self, kept: &Kept) -> bool {
        let started = Instant::now();
        let unmapped = |this: &Self, id: &FileId, mapped: &Mapped| {
            let l = &this.loaded[id];
            let path = this.images_seen.get(l.entry).map(|i| i.image.as_path());
            !mapped.has(id, path.unwrap_or(std::path::Path::new("")))
        };
        let unpinned = |this: &Self, mapped: &Mapped| -> Vec<FileId> {
            let loaded = this.loaded.iter();
            loaded
                .filter(|(id, l)| !l.pinned && unmapped(this, id, mapped))
                .map(|(id, _)| *id)
                .collect()
        };
        let Some(mapped) = mapped_files() else {
            return true;
        };
        let mut gone = unpinned(self, &mapped);
        if gone.is_empty() {
            return true;
        }
        // 1. New mappers ask from now on.
        let known = kept.known_images.as_fd();
        let mut unknown = Vec::new();
        for id in &gone {
            let key = known_key(*id);
            if crate::sys::bpf_map_contains(known, &key, 1)
                && crate::sys::bpf_map_delete(known, &key).is_ok()
            {
                unknown.push((*id, key));
            }
        }
        // 2. Mapped before 1 without asking: seen now.
        match mapped_files() {
            Some(mapped) => gone.retain(|id| unmapped(self, id, &mapped)),
            None => gone.clear(),
        }
        for (id, key) in &unknown {
            if !gone.contains(id)
                && let Err(err) = crate::sys::bpf_map_update(known, key, &[1])
            {
                tracing::warn!(%err, "could not record a known image again");
            }
        }
        // 3. No walk reaches the tables any more.
        gone.retain(|id| {
            crate::sys::bpf_map_delete(self.images.as_fd(), &crate::sys::image_key(*id)).is_ok()
        });
        if gone.is_empty() {
            return true;
        }
        let forgotten = crate::sys::rcu_grace_period() && {
            let tgids = crate::sys::bpf_map_u32_keys(kept.code_maps.as_fd()).unwrap_or_default();
            for tgid in tgids {
                let _ = crate::sys::bpf_map_delete(kept.code_maps.as_fd(), &tgid.to_ne_bytes());
            }
            crate::sys::rcu_grace_period()
        };
        let ranges: Vec<(u64, u64)> = gone
            .iter()
            .map(|id| (self.loaded[id].start, self.loaded[id].len))
            .collect();
        let cleared = if forgotten { kept.clear_rows() } else { 0 };
        for id in &gone {
            let l = self.loaded.remove(id).expect("a loaded table");
            if forgotten {
                self.free.give(l.start, l.len);
            }
            self.in_use -= l.len;
            self.released_count += 1;
            self.released.insert(*id);
            if let Some(seen) = self.images_seen.get_mut(l.entry) {
                seen.released = true;
            }
        }
        tracing::debug!(
            tables = gone.len(),
            slots = ranges.iter().map(|r| r.1).sum::<u64>(),
            cleared,
            us = started.elapsed().as_micros() as u64,
            "unwind tables released: no process maps their images"
        );
        forgotten
    }
}

/// `known_images`' key for image `id`, for every process (the attach
/// module's `known_key(id, 0)`: the image key, then a zero tgid and
/// padding).
fn known_key(id: FileId) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(&crate::sys::image_key(id));
    key
}

#[cfg(test)]
mod tests {
    use super::{FileId, file_of_line};

    /// Check that a maps line gives the file's device in the kernel's
    /// encoding and its inode, and anonymous memory nothing.
    #[test]
    fn unwind_release_reads_maps_lines() {
        let line = "7f2a1c000000-7f2a1c022000 r-xp 00028000 fd:01 1311237    /usr/lib/x86_64-linux-gnu/libc.so.6";
        assert_eq!(
            file_of_line(line),
            Some(FileId {
                dev: 0xfd << 20 | 1,
                ino: 1311237
            })
        );
        assert_eq!(
            file_of_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0    [stack]"),
            None
        );
        assert_eq!(
            file_of_line("55d0c000-55d0d000 rw-p 00000000 00:00 0"),
            None
        );
        assert_eq!(
            file_of_line("55d0c000-55d0d000 r-xp 00000000 103:0a 42 /a b"),
            Some(FileId {
                dev: 0x103 << 20 | 0xa,
                ino: 42
            })
        );
    }
}

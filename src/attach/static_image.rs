//! Allocator entry points of static images without symbols (issue 41).
//!
//! A statically linked program carries its own allocator. With symbols,
//! [`super::find_sites`] finds it by name; a stripped one (Debian's
//! `busybox`) has none, and its heap went uncounted, silently. Here the
//! entry points of glibc's allocator and syscall wrappers are found by
//! their code, matched against the system's `libc.a`
//! ([`crate::symbolize::static_code`]), and take the places of the names
//! the image lacks: the sites that follow get the roles, kinds and
//! argument layouts of the named ones.
//!
//! A static image where no allocator entry point is found either way (a
//! musl or other libc's, a glibc other than the system's, no `libc.a`
//! installed) is not probed: it is skipped with [`UNCOUNTED`] as its
//! reason, which the summary shows with the brk and mmap totals the
//! capture has instead. Never a silent zero.
//!
//! What was found in an image is kept in the cache directory
//! (`static-v1.tsv`, beside the image cache), keyed by the image's stamp
//! and the archive's, so that the matching runs once per image.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use object::elf;

use super::cache::Stamp;
use super::{AttachError, Entry, Role};
use crate::symbolize::static_code::{self, Found};

pub use crate::profile::STATIC_HEAP_UNCOUNTED as UNCOUNTED;

/// The cache file, in [`super::cache::dir`].
const FILE: &str = "static-v1.tsv";
/// Entries kept in it; the oldest go first.
const MAX_ENTRIES: usize = 256;

/// Completes `functions` (the addresses of `api`'s names that `file`
/// defines) with the allocator entry points found by their code when
/// `file` is a static image without them; an error naming the image
/// [`UNCOUNTED`] when it is static, was asked for allocators, and has
/// none.
pub(super) fn complete<'n>(
    file: &object::File<'_>,
    data: &[u8],
    image: &Path,
    api: &'n [Entry],
    functions: &mut HashMap<&'n [u8], u64>,
) -> Result<(), AttachError> {
    let is_alloc = |e: &Entry| e.role == Role::Alloc;
    let has_alloc = |f: &HashMap<&[u8], u64>| {
        api.iter()
            .filter(|e| is_alloc(e))
            .any(|e| f.contains_key(e.name.as_bytes()))
    };
    if !api.iter().any(is_alloc) || has_alloc(functions) || !is_static(file, data) {
        return Ok(());
    }
    for found in found_in(image, data) {
        if let Some(entry) = api.iter().find(|e| e.name == found.name) {
            functions
                .entry(entry.name.as_bytes())
                .or_insert(found.vaddr);
        }
    }
    if has_alloc(functions) {
        tracing::debug!(image = %image.display(), "static image: allocator found by its code");
        return Ok(());
    }
    Err(AttachError::Unexaminable {
        path: image.to_owned(),
        reason: UNCOUNTED.to_owned(),
    })
}

/// Whether `file` is a statically linked executable: no program
/// interpreter, and either not position-independent or a static PIE
/// (`DF_1_PIE`; a shared library has no interpreter either).
pub fn is_static(file: &object::File<'_>, data: &[u8]) -> bool {
    let object::File::Elf64(f) = file else {
        return false;
    };
    let e = f.endian();
    let mut dynamic: Option<&[u8]> = None;
    for ph in f.elf_program_headers() {
        use object::read::elf::ProgramHeader;
        match ph.p_type(e) {
            elf::PT_INTERP => return false,
            elf::PT_DYNAMIC => dynamic = ph.data(e, data).ok(),
            _ => {}
        }
    }
    use object::read::elf::FileHeader;
    match f.elf_header().e_type(e) {
        elf::ET_EXEC => true,
        elf::ET_DYN => dynamic.is_some_and(|d| {
            d.chunks_exact(16).any(|entry| {
                let word = |at: usize| {
                    u64::from_le_bytes(entry[at..at + 8].try_into().unwrap_or_default())
                };
                word(0) == elf::DT_FLAGS_1 as u64 && word(8) & u64::from(elf::DF_1_PIE) != 0
            })
        }),
        _ => false,
    }
}

/// What [`static_code::find`] finds of glibc's in the image at `image`
/// (its bytes `data`), from the cache when the image and the archive are
/// unchanged.
fn found_in(image: &Path, data: &[u8]) -> Vec<Found> {
    // Cached only for the file's own bytes (a caller may hand other bytes
    // under its path).
    let stamp = Stamp::of(image).filter(|s| s.size == data.len() as u64);
    let stamps: Vec<String> = static_code::LIBCS
        .iter()
        .filter_map(|r| static_code::archive_stamp(r))
        .collect();
    let archive = (!stamps.is_empty()).then(|| stamps.join(" "));
    let file = super::cache::dir().map(|d| d.join(FILE));
    let key = match (&stamp, &archive) {
        (Some(s), Some(a)) => Some(format!(
            "{}\t{}\t{}\t{}\t{}\t{a}",
            s.dev, s.ino, s.size, s.mtime_ns, s.ctime_ns
        )),
        _ => None,
    };
    let mut lines = file
        .as_ref()
        .and_then(|f| fs::read(f).ok())
        .map(|b| parse(&b))
        .unwrap_or_default();
    if let Some(found) = key
        .as_ref()
        .and_then(|k| lines.iter().find(|(lk, _)| lk == k))
    {
        return found.1.clone();
    }
    // The first C library whose allocator is there.
    let found = static_code::LIBCS
        .iter()
        .map(|r| static_code::find(data, r))
        .find(|f| f.iter().any(|f| is_allocator(&f.name)))
        .unwrap_or_default();
    if let (Some(file), Some(key)) = (file, key) {
        let id = format!("{}\t", stamp_id(&stamp));
        lines.retain(|(k, _)| !k.starts_with(&id));
        lines.push((key, found.clone()));
        save(&file, &lines, image);
    }
    found
}

/// Whether `name` is an allocating entry point (not a syscall wrapper).
fn is_allocator(name: &str) -> bool {
    super::api::libc()
        .iter()
        .any(|e| e.name == name && e.role == Role::Alloc)
}

/// `dev\tino` of a stamp, the start of its cache key.
fn stamp_id(stamp: &Option<Stamp>) -> String {
    stamp
        .as_ref()
        .map_or_else(String::new, |s| format!("{}\t{}", s.dev, s.ino))
}

/// The cache file's lines: key (six tab-separated fields) and what was
/// found; malformed lines are skipped.
fn parse(bytes: &[u8]) -> Vec<(String, Vec<Found>)> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((key, rest)) = line.rsplit_once('\t') else {
            continue;
        };
        if key.split('\t').count() != 6 {
            continue;
        }
        let found: Option<Vec<Found>> = rest
            .split(',')
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (name, at) = f.split_once('=')?;
                let mut at = at.split(':');
                let mut hex = || u64::from_str_radix(at.next()?, 16).ok();
                Some(Found {
                    name: name.to_owned(),
                    vaddr: hex()?,
                    size: hex()?,
                    offset: hex()?,
                })
            })
            .collect();
        if let Some(found) = found {
            out.push((key.to_owned(), found));
        }
    }
    out
}

/// Writes the cache whole (temporary file and rename); failing to only
/// means matching again next time.
fn save(file: &Path, lines: &[(String, Vec<Found>)], image: &Path) {
    let skip = lines.len().saturating_sub(MAX_ENTRIES);
    let mut text = Vec::new();
    for (key, found) in &lines[skip..] {
        let list: Vec<String> = found
            .iter()
            .map(|f| format!("{}={:x}:{:x}:{:x}", f.name, f.vaddr, f.size, f.offset))
            .collect();
        let _ = writeln!(text, "{key}\t{}", list.join(","));
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    let written = fs::create_dir_all(dir).and_then(|()| {
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(&text)?;
        tmp.persist(file).map_err(|e| e.error)?;
        Ok(())
    });
    if let Err(err) = written {
        tracing::debug!(%err, image = %image.display(), cache = ?file.as_os_str().as_bytes(),
            "could not write the static image cache");
    }
}

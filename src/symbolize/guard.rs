//! What blazesym is given to read: images any tracked user can craft.
//!
//! blazesym opens the image by its path, follows its debug link
//! (`.gnu_debuglink`: a name looked up in the image's directory and under
//! `/usr/lib/debug`), opens `IMAGE.dwp`, and decompresses the compressed
//! sections it reads whole, whatever they claim. As root, that let a
//! tracked user make memtrail open a FIFO (waiting forever for a writer) or
//! a device, or decompress a zlib bomb into gigabytes; and a malformed image
//! made it panic (an `unwrap` on a note section's data). So:
//! - a file is opened here, through `O_PATH` first, only if it is a regular
//!   file, and blazesym gets `/proc/self/fd/N` of that open file for the
//!   call: nothing swapped in at the path meanwhile reaches it, and no
//!   `IMAGE.dwp` is looked for next to a descriptor;
//! - an image is inspected first: its debug link must be a plain file name
//!   whose candidates (those that exist) are regular files, else its debug
//!   information is not read (`debug_syms` off); in an image another user
//!   can write (see `sys::map_file`), and in such a candidate, every
//!   compressed section blazesym may read must decompress to exactly the
//!   size it claims, at most [`MAX_SECTION`] bytes, else the image is not
//!   symbolized (or its debug information not read);
//! - every call into blazesym runs under `catch_unwind`: a panic leaves the
//!   frames of that file without functions.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

/// The largest section blazesym is let decompress, in bytes.
pub const MAX_SECTION: u64 = 1 << 30;

/// Sections of one image checked at most (blazesym reads a few by name).
const MAX_CHECKED: usize = 64;

/// A file blazesym may read, open for one call into it: blazesym keeps
/// its own descriptor of what it loaded, found again by the file's device
/// and inode whatever descriptor path names it next time, so one
/// descriptor of memtrail's per file is not held on top of it.
pub(super) struct Readable {
    _file: File,
    /// `/proc/self/fd/N` of the open file.
    pub path: PathBuf,
    /// Whether its debug information (DWARF, its debug link) may be read.
    pub debug_syms: bool,
}

/// A file as it was checked: its identity (device, inode, size, change
/// time) and the verdict (whether blazesym may read its debug information;
/// None: nothing of it).
type Verdict = ((u64, u64, i64, i64), Option<bool>);

/// The files looked at so far, by path: each is checked once, again only
/// if it changed.
#[derive(Default)]
pub(super) struct Files {
    seen: RefCell<HashMap<PathBuf, Verdict>>,
}

impl Files {
    /// What blazesym may read of `path`, opened now; None when nothing
    /// (not a regular file, unreadable, or failing the checks).
    pub fn get(&self, path: &Path) -> Option<Readable> {
        let (file, trusted) = crate::sys::open_regular(path)
            .inspect_err(|err| tracing::debug!(path = %path.display(), %err, "not symbolized"))
            .ok()?;
        let stat = rustix::fs::fstat(&file).ok()?;
        let id = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_ctime);
        let known = self.seen.borrow().get(path).copied();
        let debug_syms = match known {
            Some((seen, verdict)) if seen == id => verdict,
            _ => {
                let verdict = inspect(path, &file, trusted)
                    .inspect_err(|reason| {
                        tracing::warn!(path = %path.display(), %reason, "not symbolized");
                    })
                    .ok();
                self.seen
                    .borrow_mut()
                    .insert(path.to_owned(), (id, verdict));
                verdict
            }
        }?;
        Some(Readable {
            path: PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
            _file: file,
            debug_syms,
        })
    }
}

/// Runs `f`, a call into blazesym for `path`; None if it panicked.
pub(super) fn catch<T>(path: &Path, f: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(value) => Some(value),
        Err(panic) => {
            tracing::warn!(
                path = %path.display(),
                panic = crate::sys::panic_text(&*panic),
                "symbolizer panicked on this file: its frames have no functions"
            );
            None
        }
    }
}

/// Checks an image: `Err` if blazesym must not read it, else whether it
/// may read its debug information. The compressed sections of a file only
/// root can write are not checked; its debug link is (the directory it
/// names files in may be anyone's).
fn inspect(path: &Path, file: &File, trusted: bool) -> Result<bool, String> {
    let data = crate::sys::contents(file, trusted).map_err(|e| e.to_string())?;
    let elf = object::File::parse(&*data).map_err(|e| e.to_string())?;
    if !trusted {
        sections_bounded(&elf, file)?;
    }
    let Ok(Some((name, _crc))) = elf.gnu_debuglink() else {
        return Ok(true);
    };
    let plain = !name.is_empty() && !name.contains(&b'/') && name != b"." && name != b"..";
    let Some(name) = std::str::from_utf8(name).ok().filter(|_| plain) else {
        tracing::warn!(path = %path.display(), "debug link is no plain file name: debug information not read");
        return Ok(false);
    };
    let build_id = elf.build_id().ok().flatten().unwrap_or_default();
    for candidate in debug_candidates(path, name, build_id) {
        // Only what exists: blazesym takes the first that does.
        if std::fs::symlink_metadata(&candidate).is_err() {
            continue;
        }
        let fine = crate::sys::open_regular(&candidate).is_ok_and(|(file, trusted)| {
            trusted
                || crate::sys::contents(&file, false).is_ok_and(|data| {
                    object::File::parse(&*data)
                        .is_ok_and(|elf| sections_bounded(&elf, &file).is_ok())
                })
        });
        if !fine {
            tracing::warn!(
                path = %path.display(),
                candidate = %candidate.display(),
                "debug link leads to a file blazesym must not read: debug information not read"
            );
            return Ok(false);
        }
    }
    Ok(true)
}

/// `Err` unless every compressed section (the first of each name, as
/// blazesym finds them) decompresses to exactly the size it claims, at
/// most [`MAX_SECTION`].
fn sections_bounded(elf: &object::File<'_>, file: &File) -> Result<(), String> {
    let mut names = std::collections::HashSet::new();
    for section in elf.sections() {
        let Ok(name) = section.name_bytes() else {
            continue;
        };
        if !names.insert(name) {
            continue;
        }
        if names.len() > MAX_CHECKED {
            return Err(format!("more than {MAX_CHECKED} section names"));
        }
        let Ok(compressed) = section.compressed_file_range() else {
            return Err("a section's compression header is unreadable".into());
        };
        let claimed = compressed.uncompressed_size;
        // From the file: an image read without its DWARF (`sys::contents`)
        // has only the sections' headers in memory.
        let data = FileRange {
            file,
            at: compressed.offset,
            end: compressed.offset.saturating_add(compressed.compressed_size),
        };
        let decoder: Box<dyn Read + '_> = match compressed.format {
            object::CompressionFormat::None => continue,
            object::CompressionFormat::Zlib => Box::new(flate2::read::ZlibDecoder::new(data)),
            object::CompressionFormat::Zstandard => {
                Box::new(zstd::stream::read::Decoder::new(data).map_err(|e| e.to_string())?)
            }
            _ => return Err("a section compressed in an unknown format".into()),
        };
        if claimed > MAX_SECTION {
            return Err(format!("a section claims {claimed} bytes decompressed"));
        }
        let got = std::io::copy(&mut decoder.take(claimed + 1), &mut std::io::sink())
            .map_err(|e| format!("a compressed section does not decompress: {e}"))?;
        if got != claimed {
            return Err(format!(
                "a compressed section claims {claimed} bytes and holds {got}{}",
                if got > claimed { " or more" } else { "" }
            ));
        }
    }
    Ok(())
}

/// Bytes `at..end` of a file, read as they are asked for.
struct FileRange<'a> {
    file: &'a File,
    at: u64,
    end: u64,
}

impl Read for FileRange<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let left = usize::try_from(self.end.saturating_sub(self.at)).unwrap_or(usize::MAX);
        let n = buf.len().min(left);
        let n = self.file.read_at(&mut buf[..n], self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Where blazesym looks for the debug file `name` of `image` (a superset):
/// the build-id path, the debug directories, the image's directory, and
/// the image's directory and its parents under the debug directories.
fn debug_candidates(image: &Path, name: &str, build_id: &[u8]) -> Vec<PathBuf> {
    const DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];
    let mut out = Vec::new();
    if let [first, rest @ ..] = build_id {
        let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
        out.push(PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{first:02x}/{hex}.debug"
        )));
    }
    out.extend(DEBUG_DIRS.iter().map(|d| Path::new(d).join(name)));
    let real = std::fs::canonicalize(image).unwrap_or_else(|_| image.to_owned());
    if let Some(dir) = real.parent() {
        out.push(dir.join(name));
        let relative = dir.strip_prefix("/").unwrap_or(dir);
        for up in relative.ancestors() {
            out.extend(DEBUG_DIRS.iter().map(|d| Path::new(d).join(up).join(name)));
        }
    }
    out
}

//! The on-disk cache of compiled unwind tables, by build id and CFI.
//!
//! `$MEMTRAIL_CACHE_DIR`, else `$XDG_CACHE_HOME/memtrail`, else
//! `~/.cache/memtrail`; tables go to `unwind/<build id>-<cfi hash>.v4`
//! (v3: rows of C++ `operator new` wrappers flagged, issue 22, and rows
//! that count their CFA offset in 8-byte words, issue 23; v4: rows of a
//! second executable segment at the first's bias, and frames past 256 KiB,
//! issue 41).
//! The build id alone is what the image says it is: any tracked user can
//! craft an image with libc's build id and call frame information of their
//! own, and its table, cached under that id, was then every later
//! capture's table for libc (issue 28). The key also hashes everything
//! the table is compiled from ([`Cache::key`]) with SipHash-2-4 keyed by a
//! secret of the cache's (`unwind/key`, 16 random bytes, mode 0600), so an
//! entry only ever serves an image with the same CFI, and no image can be
//! crafted to collide with another's. An entry is written whole (a temporary file
//! renamed into place) and checked when read: a damaged or foreign file is
//! ignored and compiled again. Images without a build id are compiled every
//! time. The cache is an optimisation only: any failure to use it is
//! logged at debug level.

use std::io::Write;
use std::path::{Path, PathBuf};

use object::Object;

use super::table::{Row, Table};

const MAGIC: &[u8; 8] = b"MTUNWND2";
const HEADER: usize = 8 + 8 + 4 + 4;
const SOURCES: [&str; 2] = [".eh_frame", ".debug_frame"];

/// The largest cache entry read: a table of [`super::table::MAX_SPANS`]
/// rows (no image compiles to more).
const MAX_ENTRY_BYTES: u64 = (HEADER + super::table::MAX_SPANS * Row::SIZE) as u64;

/// The cache directory.
pub struct Cache {
    dir: PathBuf,
    /// The secret key of the CFI hash.
    secret: (u64, u64),
}

/// The GNU build id of an ELF image, as hex.
pub fn build_id(data: &[u8]) -> Option<String> {
    let file = object::File::parse(data).ok()?;
    let id = file.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// The secret at `path`, made (16 bytes of `/dev/urandom`, mode 0600,
/// written whole before it appears) if there is none yet.
fn secret(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    // A regular file only: a FIFO in a cache directory its user owns is
    // not waited on (issue 40).
    match crate::report::open_input(path) {
        Ok(mut file) => file.reader(16, "a cache key")?.read_exact(&mut bytes)?,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
            let dir = path.parent().unwrap_or(Path::new("."));
            // tempfile makes its files 0600.
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            tmp.write_all(&bytes)?;
            if let Err(err) = tmp.persist_noclobber(path) {
                // Another capture made it first: its secret is the one.
                if err.error.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(err.error);
                }
                crate::report::open_input(path)?
                    .reader(16, "a cache key")?
                    .read_exact(&mut bytes)?;
            }
        }
        Err(err) => return Err(err),
    }
    let (k0, k1) = bytes.split_at(8);
    Ok((
        u64::from_le_bytes(k0.try_into().unwrap_or_default()),
        u64::from_le_bytes(k1.try_into().unwrap_or_default()),
    ))
}

impl Cache {
    /// The cache, if a directory for it can be named and made.
    pub fn open() -> Option<Self> {
        let base = std::env::var_os("MEMTRAIL_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| Path::new(&d).join("memtrail")))
            .or_else(|| std::env::var_os("HOME").map(|d| Path::new(&d).join(".cache/memtrail")))?;
        let dir = base.join("unwind");
        Self::at(&dir)
            .inspect_err(|err| tracing::debug!(dir = %dir.display(), %err, "no unwind table cache"))
            .ok()
    }

    /// A cache in `dir` (made if missing).
    pub fn at(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            secret: secret(&dir.join("key"))?,
        })
    }

    /// The cache key of an ELF image: its build id (as hex; at most 64
    /// bytes of it) and the keyed hash of what [`super::table::compile`]
    /// reads: the CFI section's bytes and address, the addresses of `.text`
    /// and `.got`, and the first executable segment's address and file
    /// offset. None without a build id.
    pub fn key(&self, data: &[u8]) -> Option<String> {
        use object::{ObjectSection, ObjectSegment};
        use std::hash::Hasher;
        let file = object::File::parse(data).ok()?;
        let id = file.build_id().ok()??;
        if id.is_empty() || id.len() > 64 {
            return None;
        }
        #[expect(
            deprecated,
            reason = "std's SipHash-2-4 is the only keyed hash at hand; deprecated for \
                      HashMaps, not broken"
        )]
        let mut hash = std::hash::SipHasher::new_with_keys(self.secret.0, self.secret.1);
        for name in [".eh_frame", ".debug_frame", ".text", ".got"] {
            if let Some(section) = file.section_by_name(name) {
                hash.write(name.as_bytes());
                hash.write_u64(section.address());
                if name.ends_with("frame") {
                    let bytes = section.data().unwrap_or_default();
                    hash.write_usize(bytes.len());
                    hash.write(bytes);
                }
            }
        }
        if let Some(exec) = file.segments().find(|seg| match seg.flags() {
            object::SegmentFlags::Elf { p_flags } => p_flags & 1 != 0,
            _ => false,
        }) {
            hash.write_u64(exec.address());
            hash.write_u64(exec.file_range().0);
        }
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        Some(format!("{hex}-{:016x}", hash.finish()))
    }

    fn path(&self, build_id: &str) -> PathBuf {
        self.dir.join(format!("{build_id}.v4"))
    }

    /// The cached table of the image with [`key`] `build_id`: a regular
    /// file of at most [`MAX_ENTRY_BYTES`] (the cache may be in a
    /// directory its user owns, e.g. under `sudo -E`: a FIFO there is not
    /// waited on, a large file not read; issue 40).
    pub fn get(&self, build_id: &str) -> Option<Table> {
        use std::io::Read;
        let mut input = crate::report::open_input(&self.path(build_id)).ok()?;
        let mut data = Vec::new();
        input
            .reader(MAX_ENTRY_BYTES, "a cached unwind table")
            .and_then(|mut r| r.read_to_end(&mut data))
            .inspect_err(|err| tracing::debug!(build_id, %err, "ignoring a cached unwind table"))
            .ok()?;
        let table = decode(&data);
        if table.is_none() {
            tracing::debug!(build_id, "ignoring a damaged cached unwind table");
        }
        table
    }

    /// Caches `table` for the image with `build_id`.
    pub fn put(&self, build_id: &str, table: &Table) {
        let result = (|| -> std::io::Result<()> {
            let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
            tmp.write_all(&encode(table))?;
            tmp.persist(self.path(build_id))?;
            Ok(())
        })();
        if let Err(err) = result {
            tracing::debug!(build_id, %err, "could not cache an unwind table");
        }
    }
}

fn encode(table: &Table) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + table.rows.len() * Row::SIZE);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&table.bias.to_le_bytes());
    let source = SOURCES.iter().position(|s| *s == table.source).unwrap_or(0) as u32;
    out.extend_from_slice(&source.to_le_bytes());
    out.extend_from_slice(&(table.rows.len() as u32).to_le_bytes());
    for row in &table.rows {
        out.extend_from_slice(&row.pc.to_le_bytes());
        out.extend_from_slice(&row.cfa_off.to_le_bytes());
        out.push(row.kind);
        out.push(row.rbp_off as u8);
    }
    out
}

fn decode(data: &[u8]) -> Option<Table> {
    let (head, body) = data.split_at_checked(HEADER)?;
    if &head[..8] != MAGIC {
        return None;
    }
    let bias = i64::from_le_bytes(head[8..16].try_into().ok()?);
    let source = *SOURCES.get(u32::from_le_bytes(head[16..20].try_into().ok()?) as usize)?;
    let count = u32::from_le_bytes(head[20..24].try_into().ok()?) as usize;
    if body.len() != count.checked_mul(Row::SIZE)? {
        return None;
    }
    let rows: Vec<Row> = body
        .chunks_exact(Row::SIZE)
        .map(|c| Row {
            pc: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            cfa_off: i16::from_le_bytes([c[4], c[5]]),
            kind: c[6],
            rbp_off: c[7] as i8,
        })
        .collect();
    rows.windows(2)
        .all(|w| w[0].pc < w[1].pc)
        .then_some(Table { bias, rows, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check that a table survives the cache's encoding, and that a cut or
    /// foreign file is refused.
    #[test]
    fn unwind_cache_round_trip() {
        let table = Table {
            bias: -4096,
            rows: vec![
                Row {
                    pc: 0x1000,
                    cfa_off: 8,
                    kind: 1,
                    rbp_off: 0,
                },
                Row {
                    pc: 0x1004,
                    cfa_off: 16,
                    kind: 0x12,
                    rbp_off: -16,
                },
            ],
            source: ".debug_frame",
        };
        let bytes = encode(&table);
        assert_eq!(decode(&bytes), Some(table));
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode(b"not a table at all, no no no"), None);
    }

    /// Check that an entry that is not a regular file (a FIFO, not waited
    /// on) or is larger than any table is ignored, as is a FIFO key
    /// (issue 40: the cache may be in a directory its user owns).
    #[test]
    fn unwind_cache_entries_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = Cache::at(dir.path()).expect("cache");
        let fifo = |path: &Path| {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
        };
        fifo(&cache.path("aa"));
        assert!(cache.get("aa").is_none());
        let table = Table {
            bias: 0,
            rows: vec![Row {
                pc: 1,
                cfa_off: 8,
                kind: 1,
                rbp_off: 0,
            }],
            source: ".eh_frame",
        };
        cache.put("bb", &table);
        assert_eq!(cache.get("bb"), Some(table));
        std::fs::File::create(cache.path("cc"))
            .and_then(|f| f.set_len(MAX_ENTRY_BYTES + 1))
            .expect("sparse file");
        assert!(cache.get("cc").is_none());
        let other = tempfile::tempdir().expect("tempdir");
        fifo(&other.path().join("key"));
        assert!(Cache::at(other.path()).is_err());
    }
}

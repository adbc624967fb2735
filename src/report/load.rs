//! Reading the files memtrail is given: every command that reads a file
//! (`report`, `compare`, `bench --from`/`--baseline`/`--suite`, `events`,
//! the C ABI's `memtrail_write_report`) opens it with [`open_input`], so
//! they all follow the same rules (issue 28):
//!
//! - Only a regular file is read: a FIFO is opened without waiting for a
//!   writer and refused, like a device (`/dev/zero`), a directory or a
//!   socket, before any byte is read.
//! - A document read whole has a size cap ([`MAX_PROFILE_BYTES`],
//!   [`MAX_SUITE_BYTES`]), checked on the file's size before any read and
//!   again while reading (the file may grow meanwhile). A binary event
//!   stream is read as a stream, in bounded memory, whatever its size.
//! - Memory is bounded by what the document holds, not by its bytes: JSON
//!   of more than [`IN_MEMORY_BYTES`] is parsed from a buffered reader
//!   ([`InputFile::json`]), not from a copy of the file in memory.
//! - The file's device and inode ([`InputFile::id`]) are kept, so that an
//!   output naming the same file is refused rather than written over its
//!   input ([`crate::output::check_not_input`]).
//!
//! A profile's `format` and `version` are checked before its fields, so a
//! file of another kind or version gets an error that says so rather than a
//! complaint about a missing field. Every field of the profile must then be
//! present (`null` where the schema allows it). Versions 2 and 3 are read
//! (the profile module reads either form of `stacks`).
//!
//! A JSON document compressed with zstd (a profile written to a `.zst`
//! name, or any file compressed by `zstd`) is recognized by zstd's magic
//! and read decompressed, the cap applying to both the file and what it
//! inflates to; corrupt or cut-short compressed data is an invalid document.
//! What it may inflate to is also bounded by its size on disk
//! ([`inflated_cap`]: [`MAX_INFLATE_RATIO`] times it, at least
//! [`MIN_INFLATED_BYTES`]), so that memory follows the bytes the file
//! holds, not what a few KiB of zstd can claim (issue 40: a 4.7 KB file
//! inflating to gigabytes took 551 MB, a 91 KB one over 4 GB).

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ReportError;
use crate::profile::{OLDEST_PROFILE_VERSION, PROFILE_FORMAT, PROFILE_VERSION, Profile};
pub use crate::sys::FileId;

/// The fields that say what a document is.
#[derive(Deserialize)]
#[serde(expecting = "a memtrail profile (a JSON object)")]
struct Header {
    format: Option<Value>,
    version: Option<Value>,
}

/// The largest JSON document memtrail reads (a profile, bench results):
/// 1 GiB, far above what a capture writes (a profile with 100,000 distinct
/// stacks of 30 frames is about 500 MiB).
pub const MAX_PROFILE_BYTES: u64 = 1 << 30;

/// The largest JSON document parsed from a copy in memory; larger ones are
/// parsed as they are read ([`InputFile::json`]).
pub const IN_MEMORY_BYTES: u64 = 64 << 20;

/// The largest bench suite file memtrail reads: 16 MiB (a suite of ten
/// thousand benchmarks is about 1 MiB).
pub const MAX_SUITE_BYTES: u64 = 16 << 20;

/// The most a zstd-compressed document may inflate to per byte of the
/// file: 100 (memtrail's profiles compress 9 to 12 times at the level it
/// writes them, issue 40).
pub const MAX_INFLATE_RATIO: u64 = 100;

/// What any zstd-compressed document may inflate to, however small the
/// file: 16 MiB.
pub const MIN_INFLATED_BYTES: u64 = 16 << 20;

/// What a zstd-compressed file of `len` bytes may inflate to, for a
/// document whose cap is `cap`.
pub fn inflated_cap(len: u64, cap: u64) -> u64 {
    len.saturating_mul(MAX_INFLATE_RATIO)
        .max(MIN_INFLATED_BYTES)
        .min(cap)
}

/// zstd's frame magic: a file that starts with it is read decompressed.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The largest zstd window read (2^27 bytes, `zstd --long`'s): the window
/// is the decoder's memory; memtrail writes with a far smaller one.
const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// What a file that is not a regular file is, for messages.
fn kind_of(ft: fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// A regular file opened for reading (see the module docs).
#[derive(Debug)]
pub struct InputFile {
    file: File,
    len: u64,
    id: FileId,
}

/// Opens `path` for reading if it is a regular file: a FIFO is opened
/// without blocking and refused, like any other kind of file, before
/// anything is read from it.
pub fn open_input(path: &Path) -> io::Result<InputFile> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file ({})", kind_of(meta.file_type())),
        ));
    }
    // A regular file never blocks; reads need no O_NONBLOCK (and a file
    // on a filesystem that honours it would fail them with EAGAIN).
    let flags = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, flags - rustix::fs::OFlags::NONBLOCK)?;
    Ok(InputFile {
        len: meta.len(),
        id: FileId::of(&meta),
        file,
    })
}

/// Reads `path` whole, as text, if it is a regular file of at most `cap`
/// bytes (`what` names the kind of file in the message of a larger one).
pub fn read_text(path: &Path, cap: u64, what: &str) -> io::Result<String> {
    let mut input = open_input(path)?;
    let mut text = String::with_capacity(input.len().min(cap) as usize);
    input.reader(cap, what)?.read_to_string(&mut text)?;
    Ok(text)
}

/// Why [`InputFile::json`] failed.
#[derive(Debug)]
pub enum JsonError {
    /// The file could not be read (or is larger than its cap).
    Read(io::Error),
    /// It is not JSON of the expected shape.
    Invalid(serde_json::Error),
}

impl InputFile {
    /// The file's device and inode.
    pub fn id(&self) -> FileId {
        self.id
    }

    /// Its size when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it was empty when opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the file from its start, failing once more than `cap` bytes
    /// were read (`what`, e.g. "a profile", names the kind of file in that
    /// message). Refuses a file already larger before reading anything.
    pub fn reader(&mut self, cap: u64, what: &str) -> io::Result<impl BufRead + '_> {
        let too_large = format!("larger than the {} {what} may have", shown_size(cap));
        if self.len > cap {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, too_large));
        }
        self.file.rewind()?;
        Ok(BufReader::with_capacity(
            1 << 16,
            Capped {
                inner: &mut self.file,
                left: cap,
                too_large,
            },
        ))
    }

    /// The SHA-256 of the file's bytes (at most `cap`), in hex as
    /// `sha256sum` prints it.
    pub fn sha256(&mut self, cap: u64, what: &str) -> io::Result<String> {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        let mut reader = self.reader(cap, what)?;
        loop {
            let chunk = reader.fill_buf()?;
            if chunk.is_empty() {
                break;
            }
            hasher.update(chunk);
            let n = chunk.len();
            reader.consume(n);
        }
        Ok(hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect())
    }

    /// The file from its current position, uncapped: for a stream read in
    /// bounded memory whatever its size (a binary event stream).
    pub fn stream(self) -> File {
        self.file
    }

    /// Parses the whole file (from its start, at most `cap` bytes) as JSON
    /// of type `T`. A file of up to [`IN_MEMORY_BYTES`] is read into memory
    /// and parsed there (the fastest way); a larger one is parsed from a
    /// buffered reader, so that memory follows what `T` keeps, not the
    /// file's size (issue 28: a 1000 MiB file took 1.03 GB).
    pub fn json<T: DeserializeOwned>(&mut self, cap: u64, what: &str) -> Result<T, JsonError> {
        let len = self.len;
        let mut reader = self.reader(cap, what).map_err(JsonError::Read)?;
        if reader
            .fill_buf()
            .map_err(JsonError::Read)?
            .starts_with(&ZSTD_MAGIC)
        {
            return zstd_json(reader, len, cap, what);
        }
        let parsed = if len <= IN_MEMORY_BYTES {
            let mut bytes = Vec::with_capacity(len as usize);
            reader.read_to_end(&mut bytes).map_err(JsonError::Read)?;
            serde_json::from_slice(&bytes)
        } else {
            serde_json::from_reader(reader)
        };
        parsed.map_err(|e| {
            if e.is_io() {
                JsonError::Read(e.into())
            } else {
                JsonError::Invalid(e)
            }
        })
    }
}

/// `1 GiB`, `16 MiB`.
fn shown_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b => format!("{b} bytes"),
    }
}

/// Parses zstd-compressed JSON from `reader` (a file of `len` bytes), its
/// decompressed bytes capped at [`inflated_cap`]. The decoder's own errors
/// (corrupt or cut-short data) make an invalid document; errors reading
/// the file stay read errors.
fn zstd_json<T: DeserializeOwned>(
    reader: impl BufRead,
    len: u64,
    cap: u64,
    what: &str,
) -> Result<T, JsonError> {
    let mut decoder =
        zstd::stream::read::Decoder::with_buffer(Source(reader)).map_err(JsonError::Read)?;
    decoder
        .window_log_max(ZSTD_WINDOW_LOG_MAX)
        .map_err(JsonError::Read)?;
    let inflated_cap = inflated_cap(len, cap);
    let too_large = if inflated_cap < cap {
        format!(
            "decompressed, larger than the {} {what} of {len} compressed bytes may inflate to \
             ({MAX_INFLATE_RATIO} times its size, at least {})",
            shown_size(inflated_cap),
            shown_size(MIN_INFLATED_BYTES)
        )
    } else {
        format!(
            "decompressed, larger than the {} {what} may have",
            shown_size(cap)
        )
    };
    let inflated = Capped {
        inner: Inflate(decoder),
        left: inflated_cap,
        too_large,
    };
    serde_json::from_reader(BufReader::with_capacity(1 << 16, inflated)).map_err(|e| {
        match e.io_error_kind() {
            Some(io::ErrorKind::InvalidData) | None => JsonError::Invalid(e),
            Some(_) => JsonError::Read(e.into()),
        }
    })
}

/// An error of the file under a zstd decoder, told from the decoder's own.
#[derive(Debug)]
struct SourceError(io::Error);

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SourceError {}

/// The compressed file, its errors marked as [`SourceError`].
struct Source<R>(R);

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0
            .read(buf)
            .map_err(|e| io::Error::new(e.kind(), SourceError(e)))
    }
}

impl<R: BufRead> BufRead for Source<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.0
            .fill_buf()
            .map_err(|e| io::Error::new(e.kind(), SourceError(e)))
    }

    fn consume(&mut self, n: usize) {
        self.0.consume(n);
    }
}

/// A zstd decoder whose own errors become `InvalidData` with a message
/// that says the compressed data is bad; the file's errors pass unchanged.
struct Inflate<R>(R);

impl<R: Read> Read for Inflate<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| {
            if e.get_ref().is_some_and(|inner| inner.is::<SourceError>()) {
                let kind = e.kind();
                match e.into_inner().map(|inner| inner.downcast::<SourceError>()) {
                    Some(Ok(source)) => source.0,
                    _ => io::Error::from(kind),
                }
            } else {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("its zstd compression is corrupt or cut short ({e})"),
                )
            }
        })
    }
}

/// A reader that fails once more than `left` bytes were asked of it.
struct Capped<R> {
    inner: R,
    left: u64,
    /// The message of that failure.
    too_large: String,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // One byte more than the cap tells a file that grew past it from
        // one that ends there.
        let want = buf.len().min(self.left.saturating_add(1) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        if n as u64 > self.left {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                self.too_large.clone(),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Reads and checks the profile at `path`.
pub fn load_profile(path: &Path) -> Result<Profile, ReportError> {
    load_profile_with_id(path).map(|(profile, _)| profile)
}

/// Reads and checks the profile at `path`; also returns its file's device
/// and inode.
pub fn load_profile_with_id(path: &Path) -> Result<(Profile, FileId), ReportError> {
    let read_err = |source| ReportError::Read {
        path: path.to_owned(),
        source,
    };
    let mut input = open_input(path).map_err(read_err)?;
    let profile = read_profile(&mut input, path)?;
    Ok((profile, input.id()))
}

/// Reads the profile of `input` (opened from `path`) and checks its format
/// and version.
pub fn read_profile(input: &mut InputFile, path: &Path) -> Result<Profile, ReportError> {
    let parse = |input: &mut InputFile| input.json::<Profile>(MAX_PROFILE_BYTES, "a profile");
    let what = |e| match e {
        JsonError::Read(source) => ReportError::Read {
            path: path.to_owned(),
            source,
        },
        JsonError::Invalid(source) => ReportError::Invalid {
            path: path.to_owned(),
            source,
        },
    };
    // One pass when it is a profile of this version; the header is read
    // (a second pass, keeping only two fields) to say why when it is not.
    let parsed = parse(input);
    let (format, version) = match &parsed {
        Ok(p) => (
            Some(Value::from(p.format.clone())),
            Some(Value::from(p.version)),
        ),
        Err(JsonError::Read(_)) => return parsed.map_err(what),
        Err(JsonError::Invalid(_)) => {
            let header: Header = input.json(MAX_PROFILE_BYTES, "a profile").map_err(what)?;
            (header.format, header.version)
        }
    };
    check_header(path, format, version)?;
    parsed.map_err(what)
}

/// Refuses a document whose `format` or `version` is not a profile's of
/// this memtrail.
fn check_header(
    path: &Path,
    format: Option<Value>,
    version: Option<Value>,
) -> Result<(), ReportError> {
    let shown = |v: Option<Value>| v.map_or_else(|| "missing".to_owned(), |v| v.to_string());
    if format.as_ref().and_then(Value::as_str) != Some(PROFILE_FORMAT) {
        return Err(ReportError::Format {
            path: path.to_owned(),
            found: shown(format),
        });
    }
    let known = u64::from(OLDEST_PROFILE_VERSION)..=u64::from(PROFILE_VERSION);
    if !version
        .as_ref()
        .and_then(Value::as_u64)
        .is_some_and(|v| known.contains(&v))
    {
        return Err(ReportError::Version {
            path: path.to_owned(),
            found: shown(version),
        });
    }
    Ok(())
}

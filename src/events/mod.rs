//! The compact binary event stream (`.mtev`, format in docs/events.md) and
//! its reader.
//!
//! A stream is one zstd frame with its content checksum (XXH64, which zstd
//! checks when the frame ends: a flipped bit anywhere fails the read, issue
//! 28); inside, an 8-byte header (`MTEV`, version, three zero bytes) and then
//! one record per event: a LEB128 length and the record's bytes. Version 1
//! streams, written before the checksum, are still read (without it).
//! Numbers are LEB128 varints; signed ones and deltas are zigzag-encoded.
//! Timestamps, pids and addresses are deltas against the previous record,
//! so that a malloc/free loop takes a few bytes a record before compression
//! and about one after.
//!
//! [`Encoder`] and [`Decoder`] keep the delta state; they hold no file. The
//! encoder runs on the events poller, allocating nothing per record.

pub mod json;
pub mod writer;

use std::io::{self, BufRead, Read, Write};

use crate::bpf::record::{Body, Header, Kind, Mem, Record};

/// The header that opens the decompressed stream.
pub const MAGIC: [u8; 4] = *b"MTEV";
/// The format version this code writes: 3, version 2 (whose zstd frame
/// has its content checksum) with the mprotect and rss kinds.
pub const VERSION: u8 = 3;
/// The oldest version this code reads: 1, the same records in a frame
/// without a checksum.
pub const OLDEST_VERSION: u8 = 1;
/// zstd's frame magic, which opens a binary stream file.
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The Content_Checksum_flag of a zstd frame header's descriptor (the byte
/// after the magic; RFC 8878, 3.1.1.1.1).
const ZSTD_CHECKSUM_FLAG: u8 = 1 << 2;

/// The largest zstd window a reader accepts (2^24 bytes): the writer's
/// level 1 uses 2^19, and the window is the decoder's memory.
const WINDOW_LOG_MAX: u32 = 24;

/// zstd level of written streams: level 1 keeps pace with the events
/// poller and already takes a malloc/free loop to ~1 byte an event.
pub const LEVEL: i32 = 1;

/// The longest record accepted on reading (an exec's file name is at most
/// PATH_MAX bytes).
const MAX_RECORD: usize = 64 << 10;

// Flag bits of a record's second byte.
const F_IN_ALLOCATOR: u8 = 1;
const F_SIZE: u8 = 1 << 1;
const F_OLD_ADDR: u8 = 1 << 2;
const F_OLD_SIZE: u8 = 1 << 3;
const F_STACK: u8 = 1 << 4;

/// Why a stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("cannot read the event stream {}", path.display())]
    Open {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading the event stream failed")]
    Read(#[source] io::Error),
    #[error("writing the events failed")]
    Write(#[source] io::Error),
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
    #[error("not a memtrail binary event stream (no zstd frame or no MTEV header)")]
    NotBinary,
    #[error(
        "unsupported event stream version {0} (this memtrail reads versions \
         {OLDEST_VERSION} to {VERSION})"
    )]
    Version(u8),
    #[error("record {index} (byte {offset} of the decompressed stream) is malformed: {what}")]
    Malformed {
        index: u64,
        offset: u64,
        what: &'static str,
    },
    /// The zstd frame is corrupt (its checksum, a block, or bytes around
    /// it): `index` and `offset` say how far the records were read.
    #[error(
        "the event stream is corrupt at record {index} (byte {offset} of the decompressed \
         stream): {cause}"
    )]
    Corrupt {
        index: u64,
        offset: u64,
        cause: String,
    },
    /// The file ends inside the zstd frame.
    #[error(
        "the event stream ends early, at record {index} (byte {offset} of the decompressed \
         stream): the file was cut short (a capture that did not finish, or a partial copy)"
    )]
    Truncated { index: u64, offset: u64 },
}

impl EventsError {
    /// Whether the error is a closed standard output (`| head`).
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Write(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Appends `v` as LEB128.
fn put(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Delta state shared by the encoder and the decoder.
#[derive(Default, Clone, Copy)]
struct State {
    ts: u64,
    pid: u32,
    addr: u64,
}

/// The zstd frame a binary stream is written into, over `w`: level
/// [`LEVEL`], the content checksum on, the header written. Each record then
/// goes through [`Encoder::encode`]; `finish` ends the frame.
pub fn compressor<W: Write>(w: W) -> io::Result<zstd::stream::write::Encoder<'static, W>> {
    let mut zstd = zstd::stream::write::Encoder::new(w, LEVEL)?;
    zstd.include_checksum(true)?;
    zstd.write_all(&Encoder::header())?;
    Ok(zstd)
}

/// Turns records into the stream's bytes (before compression).
#[derive(Default)]
pub struct Encoder {
    state: State,
    buf: Vec<u8>,
}

impl Encoder {
    /// The stream's header.
    pub fn header() -> [u8; 8] {
        [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], VERSION, 0, 0, 0]
    }

    /// Encodes `rec` (with its length prefix) into `out`.
    pub fn encode(&mut self, rec: &Record<'_>, out: &mut impl Write) -> io::Result<()> {
        let h = &rec.hdr;
        let s = &mut self.state;
        let b = &mut self.buf;
        b.clear();
        b.push(h.kind as u16 as u8);
        b.push(0);
        let mut flags = if h.in_allocator { F_IN_ALLOCATOR } else { 0 };
        put(b, zigzag(h.ts_ns.wrapping_sub(s.ts) as i64));
        put(b, zigzag(i64::from(h.pid) - i64::from(s.pid)));
        put(b, zigzag(i64::from(h.tid) - i64::from(h.pid)));
        s.ts = h.ts_ns;
        s.pid = h.pid;
        match rec.body {
            Body::Mem(m) => {
                put(b, zigzag(m.addr.wrapping_sub(s.addr) as i64));
                s.addr = m.addr;
                if m.size != 0 {
                    flags |= F_SIZE;
                    put(b, m.size);
                }
                if m.old_addr != 0 {
                    flags |= F_OLD_ADDR;
                    put(b, zigzag(m.old_addr.wrapping_sub(m.addr) as i64));
                }
                if m.old_size != 0 {
                    flags |= F_OLD_SIZE;
                    put(b, m.old_size);
                }
                if m.stack_id != 0 {
                    flags |= F_STACK;
                    put(b, m.stack_id);
                }
            }
            Body::Fork { child_pid } => put(b, u64::from(child_pid)),
            Body::Exec { filename } => b.extend_from_slice(filename),
            Body::Exit { exit_code } => put(b, zigzag(i64::from(exit_code))),
            Body::Region { name } => b.extend_from_slice(name),
            Body::Rss { rss, peak } => {
                put(b, rss);
                put(b, peak);
            }
        }
        b[1] = flags;
        let mut len = [0u8; 10];
        let mut n = 0;
        let mut v = b.len() as u64;
        while v >= 0x80 {
            len[n] = v as u8 | 0x80;
            v >>= 7;
            n += 1;
        }
        len[n] = v as u8;
        out.write_all(&len[..=n])?;
        out.write_all(b)
    }
}

/// Reads records back from a decompressed stream.
pub struct Decoder<R> {
    input: R,
    state: State,
    buf: Vec<u8>,
    index: u64,
    /// Bytes of the decompressed stream read so far.
    offset: u64,
    version: u8,
}

/// A cursor over one record's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    index: u64,
    offset: u64,
}

impl<'a> Cursor<'a> {
    fn malformed(&self, what: &'static str) -> EventsError {
        EventsError::Malformed {
            index: self.index,
            offset: self.offset,
            what,
        }
    }

    fn byte(&mut self) -> Result<u8, EventsError> {
        let (&first, rest) = self
            .bytes
            .split_first()
            .ok_or_else(|| self.malformed("truncated"))?;
        self.bytes = rest;
        Ok(first)
    }

    fn varint(&mut self) -> Result<u64, EventsError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.malformed("a number longer than 64 bits"))
    }

    fn signed(&mut self) -> Result<i64, EventsError> {
        self.varint().map(unzigzag)
    }

    fn u32(&self, v: i64) -> Result<u32, EventsError> {
        u32::try_from(v).map_err(|_| self.malformed("an id out of range"))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }
}

/// An error of the file under the zstd decoder, told apart from the
/// decoder's own (a corrupt frame): see [`Tagged`].
#[derive(Debug)]
struct FileError(io::Error);

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for FileError {}

/// The compressed input, its errors tagged as the file's ([`FileError`]):
/// a failed read is exit 66, a corrupt stream 65.
struct Tagged<R>(R);

fn tag(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), FileError(e))
}

impl<R: Read> Read for Tagged<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(tag)
    }
}

impl<R: BufRead> BufRead for Tagged<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.0.fill_buf().map_err(tag)
    }

    fn consume(&mut self, amt: usize) {
        self.0.consume(amt)
    }
}

/// Reads into `buf` until it is full or the input ends; returns how much
/// was read (less than `buf.len()` only at the end of the input).
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> Decoder<R> {
    /// Reads and checks the header of decompressed `input`.
    pub fn new(mut input: R) -> Result<Self, EventsError> {
        let mut header = [0u8; 8];
        let n = read_full(&mut input, &mut header).map_err(|e| input_error(e, 0, 0))?;
        if n < header.len() || header[..4] != MAGIC {
            return Err(EventsError::NotBinary);
        }
        if !(OLDEST_VERSION..=VERSION).contains(&header[4]) {
            return Err(EventsError::Version(header[4]));
        }
        Ok(Self {
            input,
            state: State::default(),
            buf: Vec::new(),
            index: 0,
            offset: header.len() as u64,
            version: header[4],
        })
    }

    /// The stream's format version.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// Bytes of the decompressed stream read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn malformed(&self, what: &'static str) -> EventsError {
        EventsError::Malformed {
            index: self.index,
            offset: self.offset,
            what,
        }
    }

    /// Reads one record's LEB128 length; None at a clean end of input.
    fn read_len(&mut self) -> Result<Option<(u64, u64)>, EventsError> {
        let mut v = 0u64;
        for (i, shift) in (0..64).step_by(7).enumerate() {
            let mut byte = [0u8];
            let n = read_full(&mut self.input, &mut byte)
                .map_err(|e| input_error(e, self.index, self.offset))?;
            match n {
                0 if i == 0 => return Ok(None),
                0 => return Err(self.malformed("the stream ends inside a record's length")),
                _ => {}
            }
            v |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                return Ok(Some((v, i as u64 + 1)));
            }
        }
        Err(self.malformed("a length longer than 64 bits"))
    }

    /// Calls `f` with each record, in stream order; returns the number of
    /// records read.
    pub fn for_each(
        &mut self,
        mut f: impl FnMut(&Record<'_>) -> Result<(), EventsError>,
    ) -> Result<u64, EventsError> {
        loop {
            let Some((len, prefix)) = self.read_len()? else {
                return Ok(self.index);
            };
            let len = usize::try_from(len)
                .ok()
                .filter(|&l| l <= MAX_RECORD)
                .ok_or_else(|| self.malformed("a record longer than 64 KiB"))?;
            self.buf.resize(len, 0);
            let n = read_full(&mut self.input, &mut self.buf)
                .map_err(|e| input_error(e, self.index, self.offset))?;
            if n < len {
                return Err(self.malformed("the stream ends inside a record"));
            }
            let rec = decode(&self.buf, &mut self.state, self.index, self.offset)?;
            f(&rec)?;
            self.index += 1;
            self.offset += prefix + len as u64;
        }
    }
}

/// What an error reading the decompressed stream means: the file's own
/// (tagged by [`Tagged`]) could not be read; the zstd decoder's is a
/// corrupt or cut-short frame, found at record `index`.
fn input_error(e: io::Error, index: u64, offset: u64) -> EventsError {
    if e.get_ref().is_some_and(|inner| inner.is::<FileError>()) {
        let inner = e.into_inner().expect("checked above");
        return match inner.downcast::<FileError>() {
            Ok(file) => EventsError::Read(file.0),
            Err(other) => EventsError::Read(io::Error::other(other)),
        };
    }
    if e.kind() == io::ErrorKind::UnexpectedEof {
        return EventsError::Truncated { index, offset };
    }
    EventsError::Corrupt {
        index,
        offset,
        cause: format!("zstd: {e}"),
    }
}

fn decode<'a>(
    bytes: &'a [u8],
    s: &mut State,
    index: u64,
    offset: u64,
) -> Result<Record<'a>, EventsError> {
    let mut c = Cursor {
        bytes,
        index,
        offset,
    };
    let kind = Kind::from_raw(u16::from(c.byte()?)).ok_or_else(|| c.malformed("unknown kind"))?;
    let flags = c.byte()?;
    s.ts = s.ts.wrapping_add(c.signed()? as u64);
    let delta = c.signed()?;
    let pid = c.u32(i64::from(s.pid) + delta)?;
    s.pid = pid;
    let delta = c.signed()?;
    let tid = c.u32(i64::from(pid) + delta)?;
    let hdr = Header {
        ts_ns: s.ts,
        pid,
        tid,
        kind,
        in_allocator: flags & F_IN_ALLOCATOR != 0,
    };
    let body = match kind {
        Kind::Fork => {
            let child = c.varint()?;
            Body::Fork {
                child_pid: u32::try_from(child).map_err(|_| c.malformed("an id out of range"))?,
            }
        }
        Kind::Exec => Body::Exec { filename: c.rest() },
        Kind::RegionBegin | Kind::RegionEnd => Body::Region { name: c.rest() },
        Kind::Rss => Body::Rss {
            rss: c.varint()?,
            peak: c.varint()?,
        },
        Kind::Exit => Body::Exit {
            exit_code: i32::try_from(c.signed()?)
                .map_err(|_| c.malformed("an exit code out of range"))?,
        },
        _ => {
            let addr = s.addr.wrapping_add(c.signed()? as u64);
            s.addr = addr;
            let mut field = |bit: u8| -> Result<u64, EventsError> {
                if flags & bit != 0 { c.varint() } else { Ok(0) }
            };
            let size = field(F_SIZE)?;
            let old_addr = match field(F_OLD_ADDR)? {
                0 if flags & F_OLD_ADDR == 0 => 0,
                delta => addr.wrapping_add(unzigzag(delta) as u64),
            };
            let old_size = field(F_OLD_SIZE)?;
            let stack_id = field(F_STACK)?;
            Body::Mem(Mem {
                addr,
                size,
                old_addr,
                old_size,
                stack_id,
            })
        }
    };
    if !c.bytes.is_empty() {
        return Err(c.malformed("trailing bytes"));
    }
    Ok(Record { hdr, body })
}

/// Converts a binary stream file (`input`, compressed) to JSON lines on
/// `out`; returns the number of events. Memory stays bounded whatever the
/// stream's size: one record at a time, in a zstd window of at most 2^24
/// bytes. A corrupt stream fails ([`EventsError::Corrupt`], or `Malformed`,
/// `Truncated`) once it is found: with a version 2 stream, at the latest
/// when the frame's checksum is checked at its end, after the lines of the
/// records before were written.
pub fn to_jsonl(input: impl BufRead, out: &mut impl Write) -> Result<u64, EventsError> {
    let mut input = Tagged(input);
    let head = input.fill_buf().map_err(|e| input_error(e, 0, 0))?.to_vec();
    if head.len() < 5 {
        // Part of a zstd frame's magic and descriptor: cut short.
        return Err(
            if !head.is_empty() && ZSTD_MAGIC.starts_with(&head[..head.len().min(4)]) {
                EventsError::Truncated {
                    index: 0,
                    offset: 0,
                }
            } else {
                EventsError::NotBinary
            },
        );
    }
    if head[..4] != ZSTD_MAGIC {
        return Err(EventsError::NotBinary);
    }
    let checksum = head[4] & ZSTD_CHECKSUM_FLAG != 0;
    let mut zstd = zstd::stream::read::Decoder::with_buffer(input)
        .map_err(EventsError::Read)?
        .single_frame();
    zstd.window_log_max(WINDOW_LOG_MAX)
        .map_err(EventsError::Read)?;
    let mut decoder = match Decoder::new(&mut zstd) {
        // A version this memtrail does not know, or a corrupt header: with
        // a checksum, the whole frame says which.
        Err(EventsError::Version(v)) if checksum => {
            io::copy(&mut zstd, &mut io::sink()).map_err(|e| input_error(e, 0, 0))?;
            return Err(EventsError::Version(v));
        }
        other => other?,
    };
    if decoder.version() >= 2 && !checksum {
        return Err(EventsError::Corrupt {
            index: 0,
            offset: 0,
            cause: format!(
                "a version {} stream whose zstd frame has no checksum",
                decoder.version()
            ),
        });
    }
    let n = decoder.for_each(|rec| json::write_json(out, rec).map_err(EventsError::Write))?;
    let offset = decoder.offset();
    // The frame is the whole file.
    let rest = zstd
        .get_mut()
        .fill_buf()
        .map_err(|e| input_error(e, n, offset))?;
    if !rest.is_empty() {
        return Err(EventsError::Corrupt {
            index: n,
            offset,
            cause: "bytes follow the end of the zstd frame".to_owned(),
        });
    }
    out.flush().map_err(EventsError::Write)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(kind: Kind, ts: u64, pid: u32, m: Mem) -> Record<'static> {
        Record {
            hdr: Header {
                ts_ns: ts,
                pid,
                tid: pid + 1,
                kind,
                in_allocator: kind == Kind::Mmap,
            },
            body: Body::Mem(m),
        }
    }

    /// A record of a process's life: its main thread's, outside the
    /// allocator.
    fn life(kind: Kind, ts: u64, pid: u32, body: Body<'static>) -> Record<'static> {
        Record {
            hdr: Header {
                ts_ns: ts,
                pid,
                tid: pid,
                kind,
                in_allocator: false,
            },
            body,
        }
    }

    /// Check that every kind of record, with extreme values, decodes to
    /// what was encoded.
    #[test]
    fn events_binary_round_trip_records() {
        let recs = vec![
            mem(
                Kind::Malloc,
                u64::MAX - 5,
                u32::MAX - 1,
                Mem {
                    addr: u64::MAX,
                    size: 1,
                    old_addr: 0,
                    old_size: 0,
                    stack_id: u64::MAX,
                },
            ),
            mem(
                Kind::Realloc,
                3,
                1,
                Mem {
                    addr: 16,
                    size: 0,
                    old_addr: u64::MAX - 3,
                    old_size: 0,
                    stack_id: 7,
                },
            ),
            mem(
                Kind::Mremap,
                3,
                1,
                Mem {
                    addr: 0,
                    size: 4096,
                    old_addr: 8192,
                    old_size: 12288,
                    stack_id: 0,
                },
            ),
            mem(
                Kind::Mmap,
                2,
                9,
                Mem {
                    addr: 1 << 40,
                    size: 1 << 20,
                    old_addr: 0,
                    old_size: 0,
                    stack_id: 0,
                },
            ),
            life(Kind::Fork, 10, 9, Body::Fork { child_pid: 12 }),
            life(
                Kind::Exec,
                11,
                12,
                Body::Exec {
                    filename: b"/usr/bin/x\xff y",
                },
            ),
            life(
                Kind::Exit,
                12,
                12,
                Body::Exit {
                    exit_code: i32::MIN,
                },
            ),
        ];
        let mut bytes = Encoder::header().to_vec();
        let mut enc = Encoder::default();
        for rec in &recs {
            enc.encode(rec, &mut bytes).unwrap();
        }
        let mut back = Vec::new();
        let n = Decoder::new(&bytes[..])
            .unwrap()
            .for_each(|rec| {
                back.push(format!("{rec:?}"));
                Ok(())
            })
            .unwrap();
        assert_eq!(n, recs.len() as u64);
        let want: Vec<String> = recs.iter().map(|r| format!("{r:?}")).collect();
        assert_eq!(back, want);
        // A stream cut inside a record is malformed, not shorter.
        let cut = &bytes[..bytes.len() - 1];
        assert!(matches!(
            Decoder::new(cut).unwrap().for_each(|_| Ok(())),
            Err(EventsError::Malformed { index: 6, .. })
        ));
    }
}

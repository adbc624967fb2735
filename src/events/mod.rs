//! The compact binary event stream (`.mtev`, format in docs/events.md) and
//! its reader.
//!
//! A stream is zstd-compressed; inside, an 8-byte header (`MTEV`, version,
//! three zero bytes) and then one record per event: a LEB128 length and the
//! record's bytes. Numbers are LEB128 varints; signed ones and deltas are
//! zigzag-encoded. Timestamps, pids and addresses are deltas against the
//! previous record, so that a malloc/free loop takes a few bytes a record
//! before compression and about one after.
//!
//! [`Encoder`] and [`Decoder`] keep the delta state; they hold no file. The
//! encoder runs on the events poller, allocating nothing per record.

use std::io::{self, BufRead, Read, Write};

use crate::record::{Body, Header, Kind, Mem, Record};

/// The header that opens the decompressed stream.
pub const MAGIC: [u8; 4] = *b"MTEV";
/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// zstd's frame magic, which opens a binary stream file.
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

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
    #[error("reading the event stream failed")]
    Read(#[source] io::Error),
    #[error("writing the events failed")]
    Write(#[source] io::Error),
    #[error("not a memtrail binary event stream (no zstd frame or no MTEV header)")]
    NotBinary,
    #[error("unsupported event stream version {0} (this memtrail reads version {VERSION})")]
    Version(u8),
    #[error("record {index} is malformed: {what}")]
    Malformed { index: u64, what: &'static str },
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
}

/// A cursor over one record's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    index: u64,
}

impl<'a> Cursor<'a> {
    fn malformed(&self, what: &'static str) -> EventsError {
        EventsError::Malformed {
            index: self.index,
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

/// Reads one LEB128 number from `input`; None at a clean end of input.
fn read_len(input: &mut impl Read) -> Result<Option<u64>, EventsError> {
    let mut v = 0u64;
    for (i, shift) in (0..64).step_by(7).enumerate() {
        let mut byte = [0u8];
        match input.read_exact(&mut byte) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && i == 0 => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(EventsError::Malformed {
                    index: 0,
                    what: "truncated length",
                });
            }
            Err(e) => return Err(EventsError::Read(e)),
        }
        v |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            return Ok(Some(v));
        }
    }
    Err(EventsError::Malformed {
        index: 0,
        what: "a length longer than 64 bits",
    })
}

impl<R: Read> Decoder<R> {
    /// Reads and checks the header of decompressed `input`.
    pub fn new(mut input: R) -> Result<Self, EventsError> {
        let mut header = [0u8; 8];
        input.read_exact(&mut header).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => EventsError::NotBinary,
            _ => EventsError::Read(e),
        })?;
        if header[..4] != MAGIC {
            return Err(EventsError::NotBinary);
        }
        if header[4] != VERSION {
            return Err(EventsError::Version(header[4]));
        }
        Ok(Self {
            input,
            state: State::default(),
            buf: Vec::new(),
            index: 0,
        })
    }

    /// Calls `f` with each record, in stream order.
    pub fn for_each(
        mut self,
        mut f: impl FnMut(&Record<'_>) -> Result<(), EventsError>,
    ) -> Result<u64, EventsError> {
        loop {
            let Some(len) = read_len(&mut self.input)? else {
                return Ok(self.index);
            };
            let len = usize::try_from(len)
                .ok()
                .filter(|&l| l <= MAX_RECORD)
                .ok_or(EventsError::Malformed {
                    index: self.index,
                    what: "a record longer than 64 KiB",
                })?;
            self.buf.resize(len, 0);
            self.input
                .read_exact(&mut self.buf)
                .map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => EventsError::Malformed {
                        index: self.index,
                        what: "truncated record",
                    },
                    _ => EventsError::Read(e),
                })?;
            let rec = decode(&self.buf, &mut self.state, self.index)?;
            f(&rec)?;
            self.index += 1;
        }
    }
}

fn decode<'a>(bytes: &'a [u8], s: &mut State, index: u64) -> Result<Record<'a>, EventsError> {
    let mut c = Cursor { bytes, index };
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
/// `out`; returns the number of events.
pub fn to_jsonl(input: impl BufRead, out: &mut impl Write) -> Result<u64, EventsError> {
    let mut input = input;
    let head = input.fill_buf().map_err(EventsError::Read)?;
    if head.len() < 4 || head[..4] != ZSTD_MAGIC {
        return Err(EventsError::NotBinary);
    }
    let zstd = zstd::stream::read::Decoder::with_buffer(input).map_err(EventsError::Read)?;
    let decoder = Decoder::new(zstd)?;
    let n = decoder
        .for_each(|rec| crate::report::stream::write_json(out, rec).map_err(EventsError::Write))?;
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
            Record {
                hdr: Header {
                    ts_ns: 10,
                    pid: 9,
                    tid: 9,
                    kind: Kind::Fork,
                    in_allocator: false,
                },
                body: Body::Fork { child_pid: 12 },
            },
            Record {
                hdr: Header {
                    ts_ns: 11,
                    pid: 12,
                    tid: 12,
                    kind: Kind::Exec,
                    in_allocator: false,
                },
                body: Body::Exec {
                    filename: b"/usr/bin/x\xff y",
                },
            },
            Record {
                hdr: Header {
                    ts_ns: 12,
                    pid: 12,
                    tid: 12,
                    kind: Kind::Exit,
                    in_allocator: false,
                },
                body: Body::Exit {
                    exit_code: i32::MIN,
                },
            },
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

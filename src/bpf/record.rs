//! Decoding ring records into events.
//!
//! The layouts come from the skeleton's generated types (see `bpf/memtrail.h`),
//! never from hand-written mirrors. Decoding borrows the ring's bytes and
//! allocates nothing, so it can run on the hot path.

use std::mem::size_of;

use crate::bpf::skel::memtrail::types as t;
use crate::profile::unwind::{Mode, StackEnd};

/// What a record reports: `enum mt_kind` of `bpf/memtrail.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Kind {
    Malloc = t::mt_kind::MT_MALLOC.0 as u16,
    Calloc = t::mt_kind::MT_CALLOC.0 as u16,
    Realloc = t::mt_kind::MT_REALLOC.0 as u16,
    Reallocarray = t::mt_kind::MT_REALLOCARRAY.0 as u16,
    AlignedAlloc = t::mt_kind::MT_ALIGNED_ALLOC.0 as u16,
    Memalign = t::mt_kind::MT_MEMALIGN.0 as u16,
    PosixMemalign = t::mt_kind::MT_POSIX_MEMALIGN.0 as u16,
    Valloc = t::mt_kind::MT_VALLOC.0 as u16,
    Pvalloc = t::mt_kind::MT_PVALLOC.0 as u16,
    Free = t::mt_kind::MT_FREE.0 as u16,
    ReallocBegin = t::mt_kind::MT_REALLOC_BEGIN.0 as u16,
    Mmap = t::mt_kind::MT_MMAP.0 as u16,
    Munmap = t::mt_kind::MT_MUNMAP.0 as u16,
    Mremap = t::mt_kind::MT_MREMAP.0 as u16,
    Brk = t::mt_kind::MT_BRK.0 as u16,
    Mprotect = t::mt_kind::MT_MPROTECT.0 as u16,
    Rss = t::mt_kind::MT_RSS.0 as u16,
    Fork = t::mt_kind::MT_FORK.0 as u16,
    Exec = t::mt_kind::MT_EXEC.0 as u16,
    Exit = t::mt_kind::MT_EXIT.0 as u16,
    RegionBegin = t::mt_kind::MT_REGION_BEGIN.0 as u16,
    RegionEnd = t::mt_kind::MT_REGION_END.0 as u16,
}

const ALL_KINDS: [Kind; 22] = [
    Kind::Malloc,
    Kind::Calloc,
    Kind::Realloc,
    Kind::Reallocarray,
    Kind::AlignedAlloc,
    Kind::Memalign,
    Kind::PosixMemalign,
    Kind::Valloc,
    Kind::Pvalloc,
    Kind::Free,
    Kind::ReallocBegin,
    Kind::Mmap,
    Kind::Munmap,
    Kind::Mremap,
    Kind::Brk,
    Kind::Mprotect,
    Kind::Rss,
    Kind::Fork,
    Kind::Exec,
    Kind::Exit,
    Kind::RegionBegin,
    Kind::RegionEnd,
];

impl Kind {
    pub fn from_raw(raw: u16) -> Option<Self> {
        ALL_KINDS.iter().copied().find(|k| *k as u16 == raw)
    }

    /// The name used in the event stream.
    pub fn name(self) -> &'static str {
        match self {
            Self::Malloc => "malloc",
            Self::Calloc => "calloc",
            Self::Realloc => "realloc",
            Self::Reallocarray => "reallocarray",
            Self::AlignedAlloc => "aligned_alloc",
            Self::Memalign => "memalign",
            Self::PosixMemalign => "posix_memalign",
            Self::Valloc => "valloc",
            Self::Pvalloc => "pvalloc",
            Self::Free => "free",
            Self::ReallocBegin => "realloc_begin",
            Self::Mmap => "mmap",
            Self::Munmap => "munmap",
            Self::Mremap => "mremap",
            Self::Brk => "brk",
            Self::Mprotect => "mprotect",
            Self::Rss => "rss",
            Self::Fork => "fork",
            Self::Exec => "exec",
            Self::Exit => "exit",
            Self::RegionBegin => "region_begin",
            Self::RegionEnd => "region_end",
        }
    }

    /// Calls of the allocator API that return new memory.
    pub fn is_allocation(self) -> bool {
        (Self::Malloc as u16..=Self::Pvalloc as u16).contains(&(self as u16))
    }

    /// realloc and reallocarray.
    pub fn is_realloc(self) -> bool {
        matches!(self, Self::Realloc | Self::Reallocarray)
    }
}

/// The common part of every record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub kind: Kind,
    /// The syscall was made inside an allocator call (`MT_F_IN_ALLOCATOR`).
    pub in_allocator: bool,
}

/// The kind-specific part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// Allocator calls and memory syscalls (see `struct mt_alloc_event`).
    Mem(Mem),
    Fork {
        child_pid: u32,
    },
    /// The file name as the kernel saw it, without its NUL.
    Exec {
        filename: &'a [u8],
    },
    /// The kernel's wait status of the process.
    Exit {
        exit_code: i32,
    },
    /// A process's resident set size moved (`struct mt_rss_event`): bytes
    /// now, and its highest so far.
    Rss {
        rss: u64,
        peak: u64,
    },
    /// A USDT region marker (`struct mt_region_event`): the name of a
    /// begin, without its NUL (empty for an end, or a name BPF could not
    /// read).
    Region {
        name: &'a [u8],
    },
}

/// The fields of an allocator call or memory syscall record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mem {
    pub addr: u64,
    pub size: u64,
    /// realloc and mremap: the old address; mmap and mprotect: the
    /// protection (`PROT_*` bits, 0 for `PROT_NONE`; see [`Mem::prot`]).
    pub old_addr: u64,
    pub old_size: u64,
    /// The allocation's call stack (see [`StackRecord`]), 0 if none.
    pub stack_id: u64,
}

impl Mem {
    /// An mmap's or mprotect's protection bits (`enum mt_prot`).
    pub fn prot(&self) -> u32 {
        (self.old_addr
            & u64::from(
                t::mt_prot::MT_PROT_READ.0
                    | t::mt_prot::MT_PROT_WRITE.0
                    | t::mt_prot::MT_PROT_EXEC.0,
            )) as u32
    }
}

/// One decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub hdr: Header,
    pub body: Body<'a>,
}

/// A record userspace cannot read: from BPF's rings, a BPF/userspace
/// layout mismatch; from a ring a tracked process writes (the preload
/// shim's), that process's corruption.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its {need}-byte layout")]
    Short { len: usize, need: usize },
    #[error("unknown record kind {0}")]
    Kind(u16),
    #[error("a stack record claiming {nr} frames (at most {MAX_FRAMES})")]
    Frames { nr: usize },
}

/// The pid a record's header names, if it has one.
pub fn header_pid(bytes: &[u8]) -> Option<u32> {
    read::<t::mt_header>(bytes).ok().map(|h| h.pid)
}

/// Reads a `T` from the front of `bytes`.
/// The NUL-terminated name that fills a record of `need` bytes after its
/// header (an exec's filename, a region's name).
fn name_after_header(bytes: &[u8], need: usize) -> Result<&[u8], DecodeError> {
    if bytes.len() < need {
        return Err(DecodeError::Short {
            len: bytes.len(),
            need,
        });
    }
    let name = &bytes[size_of::<t::mt_header>()..need];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(&name[..end])
}

/// Plain data: any bit pattern of its size is a valid value, so it can be
/// read from the bytes of a ring record (aya's `Pod`, libbpf-rs's `Plain`).
///
/// # Safety
///
/// Only for `#[repr(C)]` types made of integers, arrays of integers and
/// other `Pod` types (the skeleton's generated record types: their enums
/// are newtypes over integers, their padding explicit byte arrays), with
/// no pointer, reference, `bool` or Rust enum inside.
pub unsafe trait Pod: Copy {}

// SAFETY: generated by libbpf-cargo from bpf/memtrail.h: `#[repr(C)]`
// structs of integers and integer arrays, padding spelled out as `__pad`
// byte arrays, enums as integer newtypes.
unsafe impl Pod for t::mt_header {}
// SAFETY: as `mt_header`.
unsafe impl Pod for t::mt_fork_event {}
// SAFETY: as `mt_header`.
unsafe impl Pod for t::mt_exit_event {}
// SAFETY: as `mt_header`.
unsafe impl Pod for t::mt_alloc_event {}
// SAFETY: as `mt_header`.
unsafe impl Pod for t::mt_stack_record {}
// SAFETY: as `mt_header`.
unsafe impl Pod for t::mt_rss_event {}
// SAFETY: as `mt_header`.
unsafe impl Pod for t::mt_mapping_record {}
// SAFETY: as `mt_header`.
unsafe impl Pod for t::mt_py_code_record {}

fn read<T: Pod>(bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() < size_of::<T>() {
        return Err(DecodeError::Short {
            len: bytes.len(),
            need: size_of::<T>(),
        });
    }
    // SAFETY: `bytes` holds at least size_of::<T>() bytes, every bit
    // pattern is a valid T (`Pod`), and read_unaligned tolerates any
    // alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Decodes one ring record.
pub fn decode(bytes: &[u8]) -> Result<Record<'_>, DecodeError> {
    let raw: t::mt_header = read(bytes)?;
    let kind = Kind::from_raw(raw.kind).ok_or(DecodeError::Kind(raw.kind))?;
    let hdr = Header {
        ts_ns: raw.ts_ns,
        pid: raw.pid,
        tid: raw.tid,
        kind,
        in_allocator: u32::from(raw.flags) & t::mt_flags::MT_F_IN_ALLOCATOR.0 != 0,
    };
    let body = match kind {
        Kind::Fork => {
            let e: t::mt_fork_event = read(bytes)?;
            Body::Fork {
                child_pid: e.child_pid,
            }
        }
        Kind::Exec => Body::Exec {
            filename: name_after_header(bytes, size_of::<t::mt_exec_event>())?,
        },
        Kind::Exit => {
            let e: t::mt_exit_event = read(bytes)?;
            Body::Exit {
                exit_code: e.exit_code,
            }
        }
        Kind::RegionBegin | Kind::RegionEnd => Body::Region {
            name: name_after_header(bytes, size_of::<t::mt_region_event>())?,
        },
        Kind::Rss => {
            let e: t::mt_rss_event = read(bytes)?;
            Body::Rss {
                rss: e.rss,
                peak: e.peak,
            }
        }
        _ => {
            let e: t::mt_alloc_event = read(bytes)?;
            // One field carries mremap's old length or an allocation's stack.
            let (old_size, stack_id) = if kind == Kind::Mremap {
                (e.aux, 0)
            } else {
                (0, e.aux)
            };
            Body::Mem(Mem {
                addr: e.addr,
                size: e.size,
                old_addr: e.old_addr,
                old_size,
                stack_id,
            })
        }
    };
    Ok(Record { hdr, body })
}

/// `MT_FP_STEP_FRAME`: in a native frame's word, the frame's image has an
/// unwind table without a row for it, and the walk found its caller by
/// frame pointer (issue 41).
pub const FP_STEP_FRAME: u64 = 1 << 62;

/// A call stack from the stack ring (`struct mt_stack_record`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackRecord<'a> {
    pub id: u64,
    pub pid: u32,
    /// Why the walk stopped after these frames (`enum mt_stack_end`).
    pub end: u16,
    /// Return addresses, innermost first, as raw little-endian `u64`s.
    ips: &'a [u8],
}

impl StackRecord<'_> {
    /// The return addresses, innermost first.
    pub fn ips(&self) -> impl Iterator<Item = u64> + '_ {
        self.ips
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunks")))
    }
}

/// Decodes a stack-ring record.
/// The preload shim's batched frees (`struct mt_free_batch`, issue 22), if
/// the events ring's record `bytes` is one: the header each of them takes
/// (kind [`Kind::Free`]) and the blocks, in the order they were freed (up
/// to the first 0 or the record's end).
pub fn decode_free_batch(
    bytes: &[u8],
) -> Option<Result<(Header, impl Iterator<Item = u64> + '_), DecodeError>> {
    let raw: t::mt_header = read(bytes).ok()?;
    if u32::from(raw.kind) != t::mt_kind::MT_FREE_BATCH.0 {
        return None;
    }
    let at = std::mem::offset_of!(t::mt_free_batch, addrs);
    let need = at + 8 * t::mt_free_batch_slots::MT_FREE_BATCH_SMALL.0 as usize;
    if bytes.len() < need {
        return Some(Err(DecodeError::Short {
            len: bytes.len(),
            need,
        }));
    }
    let hdr = Header {
        ts_ns: raw.ts_ns,
        pid: raw.pid,
        tid: raw.tid,
        kind: Kind::Free,
        in_allocator: false,
    };
    let addrs = bytes[at..]
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunks")))
        .take_while(|&addr| addr != 0);
    Some(Ok((hdr, addrs)))
}

/// A call stack the preload shim walked in its process (`struct
/// mt_shim_stack`, issue 22), if the events record `bytes` is one.
/// A process's `MT_SHIM_RINGS` record: the process (the kernel's id) and
/// its ring file's descriptor there, if `bytes` is one.
pub fn decode_shim_rings(bytes: &[u8]) -> Option<(u32, u64)> {
    let raw: t::mt_header = read(bytes).ok()?;
    if u32::from(raw.kind) != t::mt_kind::MT_SHIM_RINGS.0 {
        return None;
    }
    let e: t::mt_alloc_event = read(bytes).ok()?;
    Some((e.hdr.pid, e.addr))
}

pub fn decode_shim_stack(bytes: &[u8]) -> Option<Result<StackRecord<'_>, DecodeError>> {
    let raw: t::mt_header = read(bytes).ok()?;
    if u32::from(raw.kind) != t::mt_kind::MT_SHIM_STACK.0 {
        return None;
    }
    const IPS_AT: usize = 40;
    let word = |at: usize| {
        bytes
            .get(at..at + 8)
            .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
    };
    let (Some(id), Some(packed)) = (word(24), word(32)) else {
        return Some(Err(DecodeError::Short {
            len: bytes.len(),
            need: IPS_AT,
        }));
    };
    let nr = (packed >> 32) as u16 as usize;
    if nr > MAX_FRAMES {
        return Some(Err(DecodeError::Frames { nr }));
    }
    let need = IPS_AT + 8 * nr;
    if bytes.len() < need {
        return Some(Err(DecodeError::Short {
            len: bytes.len(),
            need,
        }));
    }
    Some(Ok(StackRecord {
        id,
        pid: packed as u32,
        end: (packed >> 48) as u16,
        ips: &bytes[IPS_AT..need],
    }))
}

/// Frames a stack holds at most (`MT_MAX_STACK`).
pub const MAX_FRAMES: usize = 128;

/// A Python code object's record (`struct mt_py_code_record`), if the
/// stack ring's record `bytes` is one (its first word is 0, never a stack's
/// id).
pub fn decode_py_code(bytes: &[u8]) -> Option<Result<t::mt_py_code_record, DecodeError>> {
    (bytes.len() >= 8 && bytes[..8] == [0; 8]).then(|| read(bytes))
}

/// A Python code object's record the preload shim wrote to its ring (a
/// header of kind `MT_SHIM_PY_CODE`, then `struct mt_py_code_record`), if
/// the events record `bytes` is one.
pub fn decode_shim_py_code(bytes: &[u8]) -> Option<Result<t::mt_py_code_record, DecodeError>> {
    let raw: t::mt_header = read(bytes).ok()?;
    if u32::from(raw.kind) != t::mt_kind::MT_SHIM_PY_CODE.0 {
        return None;
    }
    let body = &bytes[size_of::<t::mt_header>()..];
    Some(decode_py_code(body).unwrap_or(Err(DecodeError::Short {
        len: bytes.len(),
        need: size_of::<t::mt_header>() + size_of::<t::mt_py_code_record>(),
    })))
}

pub fn decode_stack(bytes: &[u8]) -> Result<StackRecord<'_>, DecodeError> {
    let rec: t::mt_stack_record = read(bytes)?;
    let ips_at = std::mem::offset_of!(t::mt_stack_record, ips);
    let nr = usize::from(rec.nr).min(rec.ips.len());
    Ok(StackRecord {
        id: rec.id,
        pid: rec.pid,
        end: rec.end,
        ips: &bytes[ips_at..ips_at + nr * 8],
    })
}

/// An executable file mapping from the mappings ring
/// (`struct mt_mapping_record`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappingRecord {
    pub ts_ns: u64,
    pub pid: u32,
    /// What an attach request asks (`enum mt_request`); an image on the
    /// mappings ring.
    pub request: Request,
    pub start: u64,
    pub end: u64,
    pub pgoff: u64,
    /// The kernel's `dev_t` encoding (major << 20 | minor).
    pub dev: u64,
    pub ino: u64,
    /// The file's name, without its directory.
    pub name: String,
}

/// What a record of the attach ring asks about its process (`enum
/// mt_request`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// An executable image it mapped.
    Image,
    /// It was just forked by `parent` (per-process probes), and is held.
    Fork { parent: u32 },
    /// It exited (per-process probes).
    Exit,
    /// A thread other than its leader exec'd (per-process probes); held.
    Relink,
}

/// Decodes a mappings-ring record.
pub fn decode_mapping(bytes: &[u8]) -> Result<MappingRecord, DecodeError> {
    let m: t::mt_mapping_record = read(bytes)?;
    let name: Vec<u8> = m
        .name
        .iter()
        .map(|&c| c as u8)
        .take_while(|&c| c != 0)
        .collect();
    let request = match m.kind {
        k if k == t::mt_request::MT_REQ_IMAGE.0 => Request::Image,
        k if k == t::mt_request::MT_REQ_FORK.0 => Request::Fork {
            parent: m.start as u32,
        },
        k if k == t::mt_request::MT_REQ_EXIT.0 => Request::Exit,
        k if k == t::mt_request::MT_REQ_RELINK.0 => Request::Relink,
        k => return Err(DecodeError::Kind(k as u16)),
    };
    Ok(MappingRecord {
        ts_ns: m.ts_ns,
        pid: m.pid,
        request,
        start: m.start,
        end: m.end,
        pgoff: m.pgoff,
        dev: m.dev,
        ino: m.ino,
        name: String::from_utf8_lossy(&name).into_owned(),
    })
}

/// Why a stack walk stopped, from a stack record's `end`
/// (`enum mt_stack_end`).
pub fn stack_end(raw: u16) -> StackEnd {
    use super::skel::memtrail::types::mt_stack_end as End;
    match End(u32::from(raw)) {
        End::MT_END_DEPTH => StackEnd::DepthLimit,
        End::MT_END_NO_TABLE => StackEnd::NoTable,
        End::MT_END_UNREADABLE => StackEnd::Unreadable,
        End::MT_END_NOT_CODE => StackEnd::NotCode,
        End::MT_END_UNSUPPORTED => StackEnd::Unsupported,
        End::MT_END_BUSY => StackEnd::MappingsBusy,
        End::MT_END_STACK_SWITCH => StackEnd::StackSwitch,
        _ => StackEnd::Complete,
    }
}

/// The `unwind_mode` tunable for `mode` (`enum mt_unwind_mode`).
pub fn unwind_mode(mode: Mode) -> u32 {
    use super::skel::memtrail::types::mt_unwind_mode as M;
    match mode {
        Mode::Auto => M::MT_UNWIND_AUTO.0,
        Mode::Fp => M::MT_UNWIND_FP.0,
        Mode::Dwarf => M::MT_UNWIND_DWARF.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T: Copy>(v: &T) -> Vec<u8> {
        // SAFETY: T is a plain-data generated record type; we copy its bytes.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    /// Check that every kind survives a round trip through its raw value.
    #[test]
    fn record_kind_round_trip() {
        for kind in ALL_KINDS {
            assert_eq!(Kind::from_raw(kind as u16), Some(kind));
        }
        assert_eq!(Kind::from_raw(0), None);
    }

    /// Check that a batch of frees (issue 22) gives its blocks in order up
    /// to the first 0, or to the end of a small record, each with the
    /// batch's header as a free's; and that other records are not one.
    #[test]
    fn record_decode_free_batch() {
        let mut e = t::mt_free_batch::default();
        e.hdr.ts_ns = 7;
        e.hdr.pid = 10;
        e.hdr.tid = 11;
        e.hdr.kind = t::mt_kind::MT_FREE_BATCH.0 as u16;
        e.addrs[..3].copy_from_slice(&[0x1000, 0x2000, 0x3000]);
        let bytes = bytes_of(&e);
        let (hdr, addrs) = decode_free_batch(&bytes).unwrap().unwrap();
        assert_eq!(
            (hdr.ts_ns, hdr.pid, hdr.tid, hdr.kind),
            (7, 10, 11, Kind::Free)
        );
        assert_eq!(addrs.collect::<Vec<_>>(), [0x1000, 0x2000, 0x3000]);

        e.addrs[..5].copy_from_slice(&[1, 2, 3, 4, 5]);
        let small = &bytes_of(&e)[..size_of::<t::mt_header>() + 4 * 8];
        let (_, addrs) = decode_free_batch(small).unwrap().unwrap();
        assert_eq!(addrs.collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert!(matches!(
            decode_free_batch(&small[..small.len() - 1]),
            Some(Err(DecodeError::Short { .. }))
        ));
        assert!(decode_free_batch(&bytes_of(&t::mt_alloc_event::default())).is_none());
    }

    /// Check that an allocation record decodes field by field.
    #[test]
    fn record_decode_alloc() {
        let mut e = t::mt_alloc_event::default();
        e.hdr.ts_ns = 7;
        e.hdr.pid = 10;
        e.hdr.tid = 11;
        e.hdr.kind = Kind::Realloc as u16;
        e.addr = 0x1000;
        e.size = 64;
        e.old_addr = 0x2000;
        e.aux = 77;
        let bytes = bytes_of(&e);
        let rec = decode(&bytes).unwrap();
        assert_eq!(rec.hdr.kind, Kind::Realloc);
        assert_eq!((rec.hdr.pid, rec.hdr.tid, rec.hdr.ts_ns), (10, 11, 7));
        assert_eq!(
            rec.body,
            Body::Mem(Mem {
                addr: 0x1000,
                size: 64,
                old_addr: 0x2000,
                old_size: 0,
                stack_id: 77
            })
        );
        // The same field is mremap's old length.
        e.hdr.kind = Kind::Mremap as u16;
        let Body::Mem(mem) = decode(&bytes_of(&e)).unwrap().body else {
            panic!("mremap decodes as a memory record");
        };
        assert_eq!((mem.old_size, mem.stack_id), (77, 0));
    }

    /// Check that an allocation record is 56 bytes, 64 in the ring with its
    /// 8-byte header: one cache line.
    #[test]
    fn record_alloc_event_fills_one_line() {
        assert_eq!(std::mem::size_of::<t::mt_alloc_event>(), 56);
    }

    /// Check that a region marker record is one ring line like an
    /// allocation's, and that its name decodes without the NUL.
    #[test]
    fn record_decode_region() {
        assert_eq!(std::mem::size_of::<t::mt_region_event>(), 56);
        let mut e = t::mt_region_event::default();
        e.hdr.kind = Kind::RegionBegin as u16;
        e.hdr.tid = 5;
        for (d, s) in e.name.iter_mut().zip(b"parse") {
            *d = *s as _;
        }
        let bytes = bytes_of(&e);
        let rec = decode(&bytes).unwrap();
        assert_eq!(rec.hdr.kind, Kind::RegionBegin);
        assert_eq!(rec.body, Body::Region { name: b"parse" });
        assert!(matches!(
            decode(&bytes[..40]),
            Err(DecodeError::Short { .. })
        ));
    }

    /// Check that a truncated record and an unknown kind are errors, not UB.
    #[test]
    fn record_decode_rejects_bad_input() {
        assert!(matches!(decode(&[0; 4]), Err(DecodeError::Short { .. })));
        let mut h = t::mt_alloc_event::default();
        h.hdr.kind = 999;
        assert_eq!(decode(&bytes_of(&h)), Err(DecodeError::Kind(999)));
    }
}

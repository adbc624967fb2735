//! Naming code objects: from the copies BPF makes while their process runs
//! (`struct mt_py_code_record`), else from the live process's memory.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::{CodeOffsets, Interpreter, MODULE, decode, linetable};
use crate::bpf::skel::memtrail::types::mt_py_code_record;
use crate::profile::Frame;

/// Longest string (in characters) and location table read (a longer one
/// is cut): with a code object's header, the most the reader reads at once.
const MAX_STRING: u64 = 4096;
const MAX_TABLE: u64 = 1 << 20;
/// Bytes read of a process at once at most: a table (more than a string of
/// 4-byte characters, or a code object's header).
const MAX_READ: u64 = MAX_TABLE;
const _: () = assert!(4 * MAX_STRING <= MAX_READ);

/// What identifies a code object's contents at an address: the
/// pointers to its name, file and location table and its first line. A
/// freed code object's address reused by another gives another key (its
/// strings and table are other objects), so a cached name is never taken
/// for it.
type Key = [u64; 4];

/// A code object's names and location table, and the frames made of it so
/// far by offset: a frame is made once, and every stack that has it shares
/// it (its Arc), which the profile's writer finds by address (a
/// python3.11 import capture has 111,000 Python frames of 2,400 places).
struct Code {
    qualname: std::sync::Arc<str>,
    filename: std::sync::Arc<str>,
    first: i32,
    table: Vec<u8>,
    frames: HashMap<u32, Arc<Frame>>,
}

/// Bytes read of one process in all at most (its code objects' names and
/// tables, kept: a python3.11 importing a dozen modules reads 2 MB of them,
/// when BPF or the shim did not copy them). Past it, its frames unnamed: a
/// process whose stack records name ever new code objects with 1 MiB
/// tables costs memtrail that much time and memory, no more (issue 40).
const PROC_BUDGET: u64 = 64 << 20;
/// Bytes of code objects' copies kept of one process at most (a
/// python3.11 importing a dozen modules: 1.5 MB): a process whose ring
/// names ever new code objects gets no more kept (issue 40); past it, its
/// new ones are read from the process while it lives.
const LEARN_BUDGET: u64 = 64 << 20;

/// A process running an interpreter, read through /proc/PID/mem.
struct Proc {
    pid: u32,
    mem: File,
    off: CodeOffsets,
    codes: HashMap<u64, (Key, Code)>,
    /// What may still be read of it ([`PROC_BUDGET`]).
    budget: std::cell::Cell<u64>,
}

/// Names the Python frames of stacks, by process; see the module's docs.
#[derive(Default)]
pub struct Resolver {
    /// Code objects BPF copied, by (process, address): a record precedes
    /// the first stack naming its object on the ring, and the newest
    /// record of an address is its current object's.
    learned: HashMap<(u32, u64), Code>,
    /// Bytes of the copies kept, by process ([`LEARN_BUDGET`]).
    learned_bytes: HashMap<u32, u64>,
    procs: HashMap<u32, Option<Proc>>,
    /// Interpreter images looked at, by path.
    images: HashMap<PathBuf, Option<Interpreter>>,
}

impl Resolver {
    /// Takes a code object BPF copied.
    pub fn learn(&mut self, rec: &mt_py_code_record) {
        let text = |state: u32, bytes: &[u8], len: u32| {
            let len = (len as usize).min(bytes.len());
            decode_str(state, &bytes[..len]).unwrap_or_default()
        };
        let table = (rec.table_len as usize).min(rec.table.len());
        let code = Code {
            qualname: text(rec.name_state, &rec.name, rec.name_len).into(),
            filename: text(rec.file_state, &rec.file, rec.file_len).into(),
            first: rec.first,
            table: rec.table[..table].to_vec(),
            frames: HashMap::new(),
        };
        let kept = self.learned_bytes.entry(rec.pid).or_default();
        let size = code.size();
        if *kept + size > LEARN_BUDGET {
            if *kept <= LEARN_BUDGET {
                tracing::warn!(
                    target: crate::profile::NOTE,
                    pid = rec.pid,
                    "code records of this process past {} MiB not kept",
                    LEARN_BUDGET >> 20
                );
                *kept = LEARN_BUDGET + 1; // noted once
            }
            // A copy of an older object at the address names no frame of
            // this one: its frames are read from the process.
            self.learned.remove(&(rec.pid, rec.code));
            return;
        }
        *kept += size;
        if let Some(old) = self.learned.insert((rec.pid, rec.code), code) {
            *kept -= old.size();
        }
    }

    /// The frames of one group of a stack of process `pid` (raw words,
    /// innermost first): named from BPF's copies, else from the process
    /// while it can still be read, else `<code 0x…>`.
    pub fn frames(&mut self, pid: u32, group: &[u64]) -> Vec<Arc<Frame>> {
        let learned = group
            .iter()
            .filter_map(|&w| decode(w))
            .all(|(code, _)| self.learned.contains_key(&(pid, code)));
        if !learned && !self.procs.contains_key(&pid) {
            let proc = self.open(pid);
            self.procs.insert(pid, proc);
        }
        let mut proc = self.procs.get_mut(&pid).and_then(Option::as_mut);
        group
            .iter()
            .filter_map(|&w| decode(w))
            .map(|(code, offset)| {
                let named = match self.learned.get_mut(&(pid, code)) {
                    Some(c) => Some(c.frame(code, offset)),
                    None => proc.as_mut().and_then(|p| p.frame(code, offset)),
                };
                named.unwrap_or_else(|| {
                    Arc::new(Frame {
                        function: Some(format!("<code {code:#x}>").into()),
                        module: Some(module_name()),
                        ..Frame::unknown(code)
                    })
                })
            })
            .collect()
    }

    /// Reads the code objects of process `pid` as those of `interp` (whose
    /// layout [`super::check_layout`] took) from now on.
    pub fn open_with(&mut self, pid: u32, interp: &Interpreter) {
        let proc = Proc::open(pid, interp);
        self.procs.insert(pid, proc);
    }

    /// The process's memory and its interpreter's layouts, found among its
    /// mappings.
    fn open(&mut self, pid: u32) -> Option<Proc> {
        let maps =
            crate::sys::read_maps(std::path::Path::new(&format!("/proc/{pid}/maps"))).ok()?;
        let interp = maps
            .lines()
            .filter_map(|line| line.split_whitespace().nth(5))
            .filter(|path| path.starts_with('/') && path.contains("python"))
            .find_map(|path| {
                let path = PathBuf::from(path);
                *self
                    .images
                    .entry(path.clone())
                    .or_insert_with(|| super::interpreter(&path))
            })?;
        Proc::open(pid, &interp)
    }
}

impl Proc {
    fn open(pid: u32, interp: &Interpreter) -> Option<Self> {
        Some(Self {
            pid,
            mem: File::open(format!("/proc/{pid}/mem")).ok()?,
            off: interp.code,
            codes: HashMap::new(),
            budget: PROC_BUDGET.into(),
        })
    }

    /// `len` bytes at `addr` of the process (at most [`MAX_READ`], within
    /// its budget); None where any is unmapped.
    fn read(&self, addr: u64, len: u64) -> Option<Vec<u8>> {
        let left = self.budget.get();
        if len > MAX_READ {
            return None;
        }
        if len > left {
            if left > 0 {
                tracing::warn!(
                    target: crate::profile::NOTE,
                    pid = self.pid,
                    "Python frames of this process left unnamed: {} MiB of its code objects read",
                    PROC_BUDGET >> 20
                );
                self.budget.set(0);
            }
            return None;
        }
        self.budget.set(left - len);
        let mut buf = vec![0u8; usize::try_from(len).ok()?];
        self.mem.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }

    /// The word at `addr + off` (None past the address space).
    fn word(&self, addr: u64, off: u64) -> Option<u64> {
        let b = self.read(addr.checked_add(off)?, 8)?;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }

    fn frame(&mut self, code: u64, offset: u32) -> Option<Arc<Frame>> {
        let o = self.off;
        // Every field it reads is in the header (offsets up to
        // MAX_CODE_OFFSET: the layout was checked when it was taken).
        let fields = [o.linetable, o.qualname, o.filename, o.firstlineno];
        let len = fields.iter().copied().max().unwrap_or(0);
        let header = self.read(code, u64::from(len) + 8)?;
        let at = |off: u16| {
            let i = usize::from(off);
            header
                .get(i..i + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_ne_bytes)
        };
        let i = usize::from(o.firstlineno);
        let first = header
            .get(i..i + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, i32::from_ne_bytes);
        let key = [
            at(o.qualname),
            at(o.filename),
            at(o.linetable),
            first as u64,
        ];
        if self.codes.get(&code).is_none_or(|(k, _)| *k != key) {
            let read = Code {
                qualname: self.string(key[0])?.into(),
                filename: self.string(key[1])?.into(),
                first,
                table: self.bytes(key[2])?,
                frames: HashMap::new(),
            };
            self.codes.insert(code, (key, read));
        }
        Some(self.codes.get_mut(&code)?.1.frame(code, offset))
    }

    /// A `str` object's text: compact strings (what code objects hold).
    fn string(&self, obj: u64) -> Option<String> {
        let len = self.word(obj, 16)?.min(MAX_STRING);
        let state = self.read(obj.checked_add(32)?, 4)?;
        let state = u32::from_ne_bytes(state.try_into().ok()?);
        let (kind, ascii) = ((state >> 2) & 7, (state >> 6) & 1);
        let (at, len) = if ascii == 1 {
            (self.off.ascii_data, len)
        } else {
            (self.off.compact_data, len * u64::from(kind))
        };
        let b = self.read(obj.checked_add(u64::from(at))?, len)?;
        decode_str(state, &b)
    }

    /// A `bytes` object's contents.
    fn bytes(&self, obj: u64) -> Option<Vec<u8>> {
        let len = self.word(obj, 16)?.min(MAX_TABLE);
        self.read(obj.checked_add(32)?, len)
    }
}

/// [`MODULE`], one string shared by every Python frame (a frame's strings
/// are told apart by address when a profile is written).
fn module_name() -> Arc<str> {
    static NAME: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| MODULE.into());
    NAME.clone()
}

impl Code {
    /// About the bytes it holds (its frames apart).
    fn size(&self) -> u64 {
        (self.qualname.len() + self.filename.len() + self.table.len() + 64) as u64
    }

    /// The frame at `offset` of this code object (at address `code`).
    fn frame(&mut self, code: u64, offset: u32) -> Arc<Frame> {
        self.frames
            .entry(offset)
            .or_insert_with(|| {
                Arc::new(Frame {
                    function: Some(self.qualname.clone()),
                    file: Some(self.filename.clone()),
                    line: linetable::line_of(&self.table, self.first, offset),
                    module: Some(module_name()),
                    ..Frame::unknown(code)
                })
            })
            .clone()
    }
}

/// The text of a compact `str` object of state word `state` (CPython's
/// `PyASCIIObject.state`: kind, compact and ascii bits) from its
/// characters; None for a string that is not compact.
fn decode_str(state: u32, b: &[u8]) -> Option<String> {
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 {
        return None;
    }
    if ascii == 1 {
        return Some(String::from_utf8_lossy(b).into_owned());
    }
    let chars: Vec<u32> = match kind {
        1 => b.iter().map(|&c| u32::from(c)).collect(),
        2 => b
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_ne_bytes([c[0], c[1]])))
            .collect(),
        4 => b
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => return None,
    };
    Some(
        chars
            .into_iter()
            .map(|c| char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::{Proc, decode_str};

    /// Check that the copies of code objects kept for one process stay
    /// within their budget, and that a copy refused past it leaves no older
    /// copy of its address to name its frames (issue 40).
    #[test]
    fn python_learned_copies_bounded() {
        use crate::bpf::skel::memtrail::types::mt_py_code_record;
        let mut resolver = super::Resolver::default();
        let mut rec = mt_py_code_record {
            pid: 7,
            table_len: 1024,
            ..Default::default()
        };
        let per = 1024 + 64;
        let fit = super::LEARN_BUDGET / per;
        for code in 0..fit + 10 {
            rec.code = 0x1000 + 8 * code;
            resolver.learn(&rec);
        }
        assert_eq!(resolver.learned.len() as u64, fit);
        assert!(resolver.learned_bytes[&7] <= super::LEARN_BUDGET + 1);
        rec.code = 0x1000; // a new object at a kept address, refused
        resolver.learn(&rec);
        assert!(!resolver.learned.contains_key(&(7, 0x1000)));
        rec.pid = 8; // another process: its own budget
        resolver.learn(&rec);
        assert!(resolver.learned.contains_key(&(8, 0x1000)));
    }

    /// Check that the reader of a process reads at most its budget in
    /// all, and at most MAX_READ at once (issue 40).
    #[test]
    fn python_proc_reads_bounded() {
        let interp = crate::python::Interpreter {
            minor: 12,
            runtime: 0,
            walk: crate::python::WALK_3_12,
            code: crate::python::CODE_3_12,
            tls_index: 0,
        };
        let proc = Proc::open(std::process::id(), &interp).expect("own memory");
        let data = [7u8; 64];
        let at = data.as_ptr() as u64;
        assert_eq!(proc.read(at, 64).as_deref(), Some(&data[..]));
        assert_eq!(proc.read(at, super::MAX_READ + 1), None);
        proc.budget.set(100);
        assert!(proc.read(at, 64).is_some());
        assert_eq!(proc.read(at, 64), None);
        assert_eq!(proc.read(at, 8), None, "the budget is spent");
        assert_eq!(proc.word(u64::MAX - 4, 16), None);
    }

    #[test]
    fn python_compact_strings() {
        let ascii = 1 << 2 | 1 << 5 | 1 << 6;
        assert_eq!(decode_str(ascii, b"run").as_deref(), Some("run"));
        let ucs2 = 2 << 2 | 1 << 5;
        let text: Vec<u8> = "λx".encode_utf16().flat_map(u16::to_ne_bytes).collect();
        assert_eq!(decode_str(ucs2, &text).as_deref(), Some("λx"));
        assert_eq!(decode_str(1 << 2, b"legacy"), None);
    }
}

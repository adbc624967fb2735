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

/// Longest string and location table read (a longer one is cut).
const MAX_STRING: u64 = 4096;
const MAX_TABLE: u64 = 1 << 20;

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

/// A process running an interpreter, read through /proc/PID/mem.
struct Proc {
    mem: File,
    off: CodeOffsets,
    codes: HashMap<u64, (Key, Code)>,
}

/// Names the Python frames of stacks, by process; see the module's docs.
#[derive(Default)]
pub struct Resolver {
    /// Code objects BPF copied, by (process, address): a record precedes
    /// the first stack naming its object on the ring, and the newest
    /// record of an address is its current object's.
    learned: HashMap<(u32, u64), Code>,
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
        self.learned.insert((rec.pid, rec.code), code);
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
        let mem = File::open(format!("/proc/{pid}/mem")).ok()?;
        Some(Proc {
            mem,
            off: interp.code,
            codes: HashMap::new(),
        })
    }
}

impl Proc {
    fn read(&self, addr: u64, len: u64) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; usize::try_from(len).ok()?];
        self.mem.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }

    fn word(&self, addr: u64) -> Option<u64> {
        let b = self.read(addr, 8)?;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }

    fn frame(&mut self, code: u64, offset: u32) -> Option<Arc<Frame>> {
        let o = self.off;
        let header = self.read(
            code,
            u64::from(o.linetable.max(o.qualname).max(o.filename)) + 8,
        )?;
        let at = |off: u16| {
            let i = usize::from(off);
            u64::from_ne_bytes(header[i..i + 8].try_into().unwrap_or_default())
        };
        let i = usize::from(o.firstlineno);
        let first = i32::from_ne_bytes(header[i..i + 4].try_into().unwrap_or_default());
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
        let len = self.word(obj + 16)?.min(MAX_STRING);
        let state = self.read(obj + 32, 4)?;
        let state = u32::from_ne_bytes(state.try_into().ok()?);
        let (kind, ascii) = ((state >> 2) & 7, (state >> 6) & 1);
        let b = if ascii == 1 {
            self.read(obj + u64::from(self.off.ascii_data), len)?
        } else {
            self.read(
                obj + u64::from(self.off.compact_data),
                len * u64::from(kind),
            )?
        };
        decode_str(state, &b)
    }

    /// A `bytes` object's contents.
    fn bytes(&self, obj: u64) -> Option<Vec<u8>> {
        let len = self.word(obj + 16)?.min(MAX_TABLE);
        self.read(obj + 32, len)
    }
}

/// [`MODULE`], one string shared by every Python frame (a frame's strings
/// are told apart by address when a profile is written).
fn module_name() -> Arc<str> {
    static NAME: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| MODULE.into());
    NAME.clone()
}

impl Code {
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
    use super::decode_str;

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

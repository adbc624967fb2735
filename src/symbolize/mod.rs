//! Turning captured stacks into function names and source lines, after the
//! capture and off the hot path.
//!
//! A stack holds return addresses of one process. Each address is mapped to
//! a (file, file offset) through the executable mappings the mapping
//! pipeline recorded for that process (or for the ancestor it forked from),
//! so stacks of processes that have exited still symbolize. blazesym then
//! resolves file offsets with ELF symbols and DWARF (lines, inlined
//! functions, demangled C++ and Rust names), caching each file.
//!
//! Return addresses point after the call: `addr - 1` is symbolized, so the
//! line is the call's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use crate::report::Frame;

/// An executable file mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    /// The file: a full path once resolved, else its bare name.
    pub path: PathBuf,
    /// The file's identity (kernel `dev_t` encoding, inode), when known.
    pub file_id: Option<(u64, u64)>,
}

/// Gives full paths to mappings recorded by name only (their process was
/// gone before /proc could be asked): a file with the same device and inode
/// in a directory of another mapping, of a hint (the executables the tree
/// ran), or of the usual library directories.
pub fn resolve_paths(mappings: &mut HashMap<u32, Vec<Mapping>>, hints: &[PathBuf]) {
    use std::os::unix::fs::MetadataExt;
    let mut dirs: Vec<PathBuf> = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
        "/usr/local/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let mut candidates: Vec<PathBuf> = hints.to_vec();
    for m in mappings.values().flatten() {
        if m.path.is_absolute() {
            candidates.push(m.path.clone());
            if let Some(dir) = m.path.parent() {
                dirs.push(dir.to_owned());
            }
        }
    }
    for hint in hints {
        if let Some(dir) = hint.parent() {
            dirs.push(dir.to_owned());
        }
    }
    dirs.sort();
    dirs.dedup();
    let same_file = |path: &Path, (dev, ino): (u64, u64)| {
        std::fs::metadata(path).is_ok_and(|md| {
            let st_dev = md.dev();
            md.ino() == ino
                && u64::from(libc::major(st_dev)) == dev >> 20
                && u64::from(libc::minor(st_dev)) == dev & 0xfffff
        })
    };
    for m in mappings.values_mut().flatten() {
        if m.path.is_absolute() {
            continue;
        }
        let Some(id) = m.file_id else { continue };
        let by_hint = candidates.iter().find(|c| same_file(c, id)).cloned();
        let by_dir = || {
            dirs.iter()
                .map(|d| d.join(&m.path))
                .find(|c| same_file(c, id))
        };
        if let Some(path) = by_hint.or_else(by_dir) {
            m.path = path;
        }
    }
}

/// The executable mappings of every process, with each process's parent
/// for forked children that inherited their parent's.
#[derive(Clone, Debug, Default)]
pub struct AddressSpaces {
    pub mappings: HashMap<u32, Vec<Mapping>>,
    pub parents: HashMap<u32, u32>,
}

impl AddressSpaces {
    /// The mapping of `pid` (or of the nearest ancestor with mappings, for a
    /// fork that did not exec) that holds `addr`.
    pub fn find(&self, pid: u32, addr: u64) -> Option<&Mapping> {
        let mut pid = pid;
        for _ in 0..64 {
            if let Some(maps) = self.mappings.get(&pid) {
                // Later mappings win: a range mapped again replaces the old.
                if let Some(m) = maps.iter().rev().find(|m| m.start <= addr && addr < m.end) {
                    return Some(m);
                }
            }
            pid = *self.parents.get(&pid)?;
        }
        None
    }
}

/// Symbolizes stacks of return addresses.
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl StackSymbolizer {
    pub fn new() -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .build(),
        }
    }

    /// Symbolizes many stacks of one process at once: frames innermost
    /// first, an address with inlined calls giving several frames.
    pub fn symbolize(
        &self,
        spaces: &AddressSpaces,
        pid: u32,
        stacks: &[&[u64]],
    ) -> Vec<Vec<Frame>> {
        // Group every address by file, symbolize each file in one batch.
        let mut by_file: HashMap<&Path, Vec<(usize, usize, u64)>> = HashMap::new();
        for (s, ips) in stacks.iter().enumerate() {
            for (f, &ip) in ips.iter().enumerate() {
                if let Some(m) = spaces.find(pid, ip) {
                    let offset = ip.saturating_sub(1) - m.start + m.pgoff;
                    by_file.entry(&m.path).or_default().push((s, f, offset));
                }
            }
        }
        let mut resolved: HashMap<(usize, usize), Vec<Frame>> = HashMap::new();
        for (path, items) in by_file {
            let offsets: Vec<u64> = items.iter().map(|&(_, _, o)| o).collect();
            if !path.is_absolute() {
                continue; // recorded by name only and never found
            }
            let src = Source::Elf(Elf::new(path));
            let module = path.display().to_string();
            let results = match self.symbolizer.symbolize(&src, Input::FileOffset(&offsets)) {
                Ok(r) => r,
                Err(err) => {
                    tracing::debug!(path = %module, %err, "symbolization failed");
                    continue;
                }
            };
            for ((s, f, _), sym) in items.iter().zip(results) {
                let addr = stacks[*s][*f];
                resolved.insert((*s, *f), frames_of(addr, &module, sym));
            }
        }
        stacks
            .iter()
            .enumerate()
            .map(|(s, ips)| {
                ips.iter()
                    .enumerate()
                    .flat_map(|(f, &addr)| {
                        resolved.remove(&(s, f)).unwrap_or_else(|| {
                            vec![Frame {
                                addr,
                                module: spaces
                                    .find(pid, addr)
                                    .map(|m| m.path.display().to_string()),
                                function: None,
                                file: None,
                                line: None,
                                inlined: false,
                            }]
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

/// The frames of one address: inlined calls innermost first, then the
/// function they were inlined into.
fn frames_of(addr: u64, module: &str, sym: Symbolized<'_>) -> Vec<Frame> {
    let unknown = || Frame {
        addr,
        module: Some(module.to_owned()),
        function: None,
        file: None,
        line: None,
        inlined: false,
    };
    let Symbolized::Sym(sym) = sym else {
        return vec![unknown()];
    };
    let location = |info: Option<&blazesym::symbolize::CodeInfo<'_>>| {
        info.map(|c| (c.to_path().display().to_string(), c.line))
    };
    let mut frames = Vec::with_capacity(1 + sym.inlined.len());
    for inl in sym.inlined.iter().rev() {
        let loc = location(inl.code_info.as_ref());
        frames.push(Frame {
            addr,
            module: Some(module.to_owned()),
            function: Some(inl.name.to_string()),
            file: loc.as_ref().map(|l| l.0.clone()),
            line: loc.and_then(|l| l.1),
            inlined: true,
        });
    }
    let loc = location(sym.code_info.as_deref());
    frames.push(Frame {
        addr,
        module: Some(module.to_owned()),
        function: Some(sym.name.to_string()),
        file: loc.as_ref().map(|l| l.0.clone()),
        line: loc.and_then(|l| l.1),
        inlined: false,
    });
    frames
}

//! Turning captured stacks into function names and source lines, after the
//! capture and off the hot path.
//!
//! A stack holds return addresses of one process. Each address is mapped to
//! a (file, file offset) through the executable mappings the mapping
//! pipeline recorded for that process (or for the ancestor it forked from),
//! so stacks of processes that have exited still symbolize. blazesym then
//! resolves file offsets with ELF symbols and DWARF (lines, inlined
//! functions), caching each file.
//!
//! Names are demangled here, and only names that are mangled: Itanium C++
//! and legacy Rust (`_Z…`), Rust v0 (`_R…`). A C++ demangler also parses
//! bare type encodings, which short C names are (`i` is `int`, `St` is
//! `std`): blazesym's demangling, which tries it on any name whose language
//! it does not know, turned C functions into C++ types (issue 26).
//!
//! Return addresses point after the call: `addr - 1` is symbolized, so the
//! line is the call's.
//!
//! The files are what the tracked programs mapped, crafted ones included:
//! blazesym only reads what the `guard` module lets it (regular files,
//! opened here; bounded compressed sections; sane debug links), under
//! `catch_unwind`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use crate::profile::Frame;

mod background;
mod guard;
pub mod static_code;
pub use background::Background;

/// The frames of each symbolized return address of one process
/// ([`StackSymbolizer::places`]), addressed to it; an address in no known
/// file has none.
#[derive(Debug, Default)]
pub struct Places(pub foldhash::HashMap<u64, Vec<Arc<Frame>>>);

impl Places {
    /// The frames of `ip`; none for an address in no known file.
    pub fn of(&self, ip: u64) -> Option<&[Arc<Frame>]> {
        self.0.get(&ip).map(Vec::as_slice)
    }
}

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
    pub file_id: Option<crate::sys::FileId>,
}

/// Gives full paths to mappings recorded by name only (their process was
/// gone before /proc could be asked): a file with the same device and inode
/// in a directory of another mapping, of a hint (the executables the tree
/// ran), or of the usual library directories.
pub fn resolve_paths(mappings: &mut HashMap<u32, Vec<Mapping>>, hints: &[PathBuf]) {
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
    let same_file = |path: &Path, id: crate::sys::FileId| {
        std::fs::metadata(path).is_ok_and(|md| crate::sys::FileId::of(&md) == id)
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
    /// The files blazesym may read, opened once each.
    files: guard::Files,
    /// Build ids of the files symbolized so far (read once per file, not
    /// once per process).
    build_ids: std::cell::RefCell<HashMap<PathBuf, Option<String>>>,
    /// Runtime functions found by their code in files without symbols
    /// ([`static_code::runtime_functions`]), looked for once per file.
    recovered: std::cell::RefCell<HashMap<PathBuf, Arc<Vec<static_code::Found>>>>,
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
                // Ours: only mangled names (see the module's docs).
                .enable_demangling(false)
                .build(),
            files: Default::default(),
            build_ids: Default::default(),
            recovered: Default::default(),
        }
    }

    /// Loads `path` (its symbols, and its DWARF where it or a debug file
    /// it links to has some) as symbolizing an address in it would.
    pub fn warm(&self, path: &Path) {
        if let Some(Err(err)) = self.symbolize_file(path, Input::FileOffset(&[0x1000])) {
            tracing::debug!(path = %path.display(), %err, "symbolizer: file not loaded ahead");
        }
        self.build_id(path);
    }

    /// Symbolizes `input` in the file at `path` through blazesym, as the
    /// `guard` module lets it; None when it may not read the file (or
    /// panicked on it).
    fn symbolize_file(
        &self,
        path: &Path,
        input: Input<&[u64]>,
    ) -> Option<Result<Vec<Symbolized<'_>>, blazesym::Error>> {
        let file = self.files.get(path)?;
        let src = Source::Elf(Elf {
            debug_syms: file.debug_syms,
            ..Elf::new(&file.path)
        });
        guard::catch(path, || self.symbolizer.symbolize(&src, input))
    }

    /// The runtime functions found by their code in the file at `path`
    /// (which has no symbol table), looked for once.
    fn recovered(&self, path: &Path) -> Arc<Vec<static_code::Found>> {
        self.recovered
            .borrow_mut()
            .entry(path.to_owned())
            .or_insert_with(|| {
                let found = self
                    .files
                    .get(path)
                    .and_then(|file| crate::sys::map_file(&file.path).ok())
                    .map(|data| static_code::runtime_functions(&data))
                    .unwrap_or_default();
                Arc::new(found)
            })
            .clone()
    }

    /// The build id of `path`, read once.
    fn build_id(&self, path: &Path) -> Option<String> {
        self.build_ids
            .borrow_mut()
            .entry(path.to_owned())
            .or_insert_with(|| {
                let file = self.files.get(path)?;
                guard::catch(path, || build_id_of(&file.path)).flatten()
            })
            .clone()
    }

    /// Symbolizes the return addresses of one process's stacks: each
    /// distinct address's frames (addressed to it), an address with inlined
    /// calls giving several, inlined ones first. Every frame in a known file
    /// names it, its build id and the file offset symbolized, resolved or
    /// not; an address in no known file has none. A stack's frames are its
    /// addresses' in order (its Python frames spliced in by the session),
    /// shared: each is made once, not once per stack that has it
    /// (python3.11 importing nine modules: 5,555 stacks of ~376,000 frames,
    /// 1,311 addresses).
    pub fn places(&self, spaces: &AddressSpaces, pid: u32, ips: &[u64]) -> Places {
        // Each distinct address is looked up once (stacks share most of
        // their frames, and a look-up scans the process's mappings), as a
        // file's index and the offset in it; every file's offsets are
        // symbolized in one batch.
        let mut places: foldhash::HashMap<u64, Option<(u32, u64)>> = Default::default();
        let mut files: Vec<(&Path, Vec<u64>)> = Vec::new();
        let mut file_index: foldhash::HashMap<&Path, u32> = Default::default();
        for &ip in ips {
            places.entry(ip).or_insert_with(|| {
                let m = spaces.find(pid, ip)?;
                let offset = ip.saturating_sub(1) - m.start + m.pgoff;
                let path = m.path.as_path();
                let file = *file_index.entry(path).or_insert_with(|| {
                    files.push((path, Vec::new()));
                    files.len() as u32 - 1
                });
                files[file as usize].1.push(offset);
                Some((file, offset))
            });
        }
        let mut names = Names::default();
        // Per file, each distinct offset's frames (their strings shared).
        let mut per_file: Vec<(Vec<u64>, Vec<Vec<Frame>>)> = Vec::with_capacity(files.len());
        for (path, mut offsets) in files {
            let module: std::sync::Arc<str> = path.display().to_string().into();
            let build_id: Option<std::sync::Arc<str>> = path
                .is_absolute()
                .then(|| self.build_id(path))
                .flatten()
                .map(Into::into);
            offsets.sort_unstable();
            offsets.dedup();
            let results = if path.is_absolute() {
                self.symbolize_file(path, Input::FileOffset(&offsets))
                    .and_then(|results| {
                        results
                            .inspect_err(|err| {
                                tracing::debug!(path = %module, %err, "symbolization failed");
                            })
                            .ok()
                    })
            } else {
                None // recorded by name only and never found
            };
            let mut results = results.map(Vec::into_iter);
            let per_offset: Vec<Vec<Frame>> = offsets
                .iter()
                .map(|&offset| {
                    let base = Frame {
                        module: Some(module.clone()),
                        build_id: build_id.clone(),
                        offset: Some(offset),
                        ..Frame::unknown(0)
                    };
                    let mut frames =
                        frames_of(base, results.as_mut().and_then(Iterator::next), &mut names);
                    if let [frame] = frames.as_mut_slice()
                        && frame.function.is_none()
                        && path.is_absolute()
                    {
                        frame.function = self
                            .recovered(path)
                            .iter()
                            .find(|f| (f.offset..f.offset + f.size).contains(&offset))
                            .map(|f| names.demangled(&f.name));
                    }
                    frames
                })
                .collect();
            per_file.push((offsets, per_offset));
        }
        let by_addr = places
            .into_iter()
            .filter_map(|(ip, place)| {
                let (file, offset) = place?;
                let (offsets, frames) = &per_file[file as usize];
                let at = offsets.binary_search(&offset).ok()?;
                let frames = frames[at].iter().map(|f| {
                    Arc::new(Frame {
                        addr: ip,
                        ..f.clone()
                    })
                });
                Some((ip, frames.collect()))
            })
            .collect();
        Places(by_addr)
    }

    /// Symbolizes again the frames without a source line whose image has a
    /// build id, from the first `DIR/.build-id/xx/rest.debug` of `dirs`
    /// (the layout of `/usr/lib/debug`, of debuginfod's cache and of
    /// distributions' `-dbgsym` packages, where gdb looks), by the file
    /// offset the capture recorded. Returns how many frames were
    /// symbolized again.
    pub fn resymbolize(
        &self,
        stacks: &mut [crate::profile::StackEntry],
        dirs: &[PathBuf],
    ) -> usize {
        let mut lists: Vec<&mut Vec<Arc<Frame>>> =
            stacks.iter_mut().map(|s| &mut s.frames).collect();
        self.resymbolize_lists(&mut lists, dirs)
    }

    /// [`resymbolize`](Self::resymbolize) for the addresses of
    /// [`places`](Self::places): once an address, not once a frame of every
    /// stack that has it.
    pub fn resymbolize_places(&self, places: &mut [Places], dirs: &[PathBuf]) -> usize {
        let mut lists: Vec<&mut Vec<Arc<Frame>>> =
            places.iter_mut().flat_map(|p| p.0.values_mut()).collect();
        self.resymbolize_lists(&mut lists, dirs)
    }

    /// [`resymbolize`](Self::resymbolize) for lists of frames: a frame
    /// symbolized again may become several (its inlined calls).
    fn resymbolize_lists(&self, stacks: &mut [&mut Vec<Arc<Frame>>], dirs: &[PathBuf]) -> usize {
        // (debug file, image) -> frames and their file offsets.
        type Items = Vec<(usize, usize, u64)>;
        let mut by_file: HashMap<(PathBuf, Option<&str>), Items> = HashMap::new();
        // Each build id looked for once; not one whose frames already have
        // lines elsewhere (its debug information was found: the frames
        // without lines have none there, and loading it again cost ~50 ms
        // of every capture through libc).
        let mut debug_files: HashMap<&str, Option<PathBuf>> = HashMap::new();
        // Frames share their build ids' strings: each is looked at once by
        // its address (a python3.11 capture's 376,000 frames hashed theirs
        // twice each).
        let mut seen: foldhash::HashSet<*const u8> = Default::default();
        let with_lines: std::collections::HashSet<&str> = stacks
            .iter()
            .flat_map(|s| s.iter())
            .filter(|f| f.file.is_some())
            .filter_map(|f| f.build_id.as_deref())
            .filter(|id| seen.insert(id.as_ptr()))
            .collect();
        let mut has_lines: foldhash::HashMap<*const u8, bool> = Default::default();
        for (s, stack) in stacks.iter().enumerate() {
            for (f, frame) in stack.iter().enumerate() {
                if frame.file.is_some() || frame.inlined {
                    continue;
                }
                let (Some(id), Some(offset)) = (frame.build_id.as_deref(), frame.offset) else {
                    continue;
                };
                // `stacks` is borrowed: an address names one string.
                if *has_lines
                    .entry(id.as_ptr())
                    .or_insert_with(|| with_lines.contains(id))
                {
                    continue;
                }
                let found = debug_files
                    .entry(id)
                    .or_insert_with(|| dirs.iter().find_map(|dir| debug_file(dir, id)));
                if let Some(path) = found {
                    let image = frame.module.as_deref();
                    by_file
                        .entry((path.clone(), image))
                        .or_default()
                        .push((s, f, offset));
                }
            }
        }
        let mut found: Vec<((usize, usize), Frame, Symbolized<'_>)> = Vec::new();
        for ((path, image), items) in by_file {
            let offsets: Vec<u64> = items.iter().map(|&(_, _, o)| o).collect();
            // A split debug file keeps the image's segment addresses but
            // not their file offsets (its code sections are empty): the
            // image itself, when it is still there and the same build,
            // turns offsets into addresses; else the debug file (a full
            // copy of the image) does.
            let build_id = stacks[items[0].0][items[0].1].build_id.as_deref();
            let layout = image
                .map(Path::new)
                .filter(|image| self.build_id(image).as_deref() == build_id)
                .unwrap_or(&path);
            let Some(addrs) = virtual_addresses(layout, &offsets) else {
                tracing::warn!(image = %layout.display(), "no segment layout to place offsets");
                continue;
            };
            let results = match self.symbolize_file(&path, Input::VirtOffset(&addrs)) {
                Some(Ok(r)) => r,
                Some(Err(err)) => {
                    tracing::warn!(path = %path.display(), %err, "debug file unreadable");
                    continue;
                }
                None => continue,
            };
            for (&(s, f, _), sym) in items.iter().zip(results) {
                if matches!(sym, Symbolized::Sym(_)) {
                    found.push(((s, f), Frame::clone(&stacks[s][f]), sym));
                }
            }
        }
        splice(stacks, found)
    }
}

/// Puts the frames `found` symbolized again (at `(stack, frame)`, with the
/// frame they replace) in their stacks, each as one frame or several (its
/// inlined calls); returns how many frames were replaced.
fn splice(
    stacks: &mut [&mut Vec<Arc<Frame>>],
    found: Vec<((usize, usize), Frame, Symbolized<'_>)>,
) -> usize {
    let mut names = Names::default();
    let mut replaced: HashMap<(usize, usize), Vec<Arc<Frame>>> = found
        .into_iter()
        .map(|(at, base, sym)| {
            let frames = frames_of(base, Some(sym), &mut names);
            (at, frames.into_iter().map(Arc::new).collect())
        })
        .collect();
    let count = replaced.len();
    for (s, stack) in stacks.iter_mut().enumerate() {
        if !(0..stack.len()).any(|f| replaced.contains_key(&(s, f))) {
            continue;
        }
        let frames = std::mem::take(&mut **stack);
        **stack = frames
            .into_iter()
            .enumerate()
            .flat_map(|(f, frame)| replaced.remove(&(s, f)).unwrap_or_else(|| vec![frame]))
            .collect();
    }
    count
}

/// The build id of the ELF file at `path`, in lowercase hex.
fn build_id_of(path: &Path) -> Option<String> {
    let id = blazesym::helper::read_elf_build_id(path)
        .inspect_err(|err| tracing::debug!(path = %path.display(), %err, "no build id"))
        .ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// The virtual addresses of file offsets of the ELF file at `path`,
/// through its loadable segments (an offset in none gives address 0).
fn virtual_addresses(path: &Path, offsets: &[u64]) -> Option<Vec<u64>> {
    use object::{Object, ObjectSegment};
    let data = crate::sys::map_file(path)
        .inspect_err(|err| tracing::debug!(path = %path.display(), %err, "unreadable"))
        .ok()?;
    let file = object::File::parse(&*data).ok()?;
    let segments: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|seg| {
            let (off, size) = seg.file_range();
            (off, size, seg.address())
        })
        .filter(|&(_, size, _)| size != 0)
        .collect();
    let addrs = offsets
        .iter()
        .map(|&o| {
            segments
                .iter()
                .find(|&&(off, size, _)| off <= o && o - off < size)
                .map_or(0, |&(off, _, addr)| addr.wrapping_add(o - off))
        })
        .collect();
    Some(addrs)
}

/// `name` demangled if it is mangled: Rust's v0 (`_R…`) and legacy
/// (`_ZN…17h<hash>E`) schemes, else Itanium C++ (`_Z…`); any other name as
/// it is, whatever a demangler would make of it (`i`, `St`, `w`).
pub fn demangle(name: &str) -> Cow<'_, str> {
    if !(name.starts_with("_Z") || name.starts_with("_R")) {
        return Cow::Borrowed(name);
    }
    // `{:#}` leaves out a legacy name's hash.
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return Cow::Owned(format!("{rust:#}"));
    }
    name.strip_prefix("_Z")
        .and(cpp_demangle::Symbol::new(name).ok())
        .and_then(|sym| sym.demangle().ok())
        .map_or(Cow::Borrowed(name), Cow::Owned)
}

/// Where debug files are looked for by build id, as gdb does: the
/// system's directory, then `extra` (`--debuginfo-dir`).
pub fn debug_dirs(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("/usr/lib/debug")];
    dirs.extend(extra.iter().cloned());
    dirs
}

/// `DIR/.build-id/xx/rest.debug` for build id `xxrest`, if it exists.
fn debug_file(dir: &Path, build_id: &str) -> Option<PathBuf> {
    let valid = build_id.len() > 2 && build_id.bytes().all(|b| b.is_ascii_hexdigit());
    if !valid {
        return None;
    }
    let (head, rest) = build_id.split_at(2);
    let path = dir
        .join(".build-id")
        .join(head)
        .join(format!("{rest}.debug"));
    path.is_file().then_some(path)
}

/// Function names demangled once each (a function's addresses share its
/// name: node's stacks have ~4 distinct addresses a name).
#[derive(Default)]
struct Names(HashMap<String, std::sync::Arc<str>>);

impl Names {
    fn demangled(&mut self, name: &str) -> std::sync::Arc<str> {
        if let Some(shown) = self.0.get(name) {
            return shown.clone();
        }
        let shown: std::sync::Arc<str> = demangle(name).into();
        self.0.insert(name.to_owned(), shown.clone());
        shown
    }
}

/// The frames of one address: inlined calls innermost first, then the
/// function they were inlined into. `base` is the frame without a function,
/// which stands when `sym` found nothing.
fn frames_of(base: Frame, sym: Option<Symbolized<'_>>, names: &mut Names) -> Vec<Frame> {
    let Some(Symbolized::Sym(sym)) = sym else {
        return vec![base];
    };
    let location = |info: Option<&blazesym::symbolize::CodeInfo<'_>>| {
        info.map(|c| (c.to_path().display().to_string(), c.line))
    };
    let mut frame = |name: &str, loc: Option<(String, Option<u32>)>, inlined: bool| Frame {
        function: Some(names.demangled(name)),
        line: loc.as_ref().and_then(|l| l.1),
        file: loc.map(|l| l.0.into()),
        inlined,
        ..base.clone()
    };
    let mut frames = Vec::with_capacity(1 + sym.inlined.len());
    for inl in sym.inlined.iter().rev() {
        frames.push(frame(&inl.name, location(inl.code_info.as_ref()), true));
    }
    frames.push(frame(&sym.name, location(sym.code_info.as_deref()), false));
    frames
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn demangles_only_mangled_names() {
        for (name, shown) in [
            // C names that are also Itanium type codes stay as they are.
            ("i", "i"),
            ("w", "w"),
            ("x", "x"),
            ("d", "d"),
            ("v", "v"),
            ("St", "St"),
            ("Ss", "Ss"),
            ("Sa", "Sa"),
            ("main", "main"),
            ("__libc_start_main_impl", "__libc_start_main_impl"),
            // C++ (Itanium), a GCC clone included.
            ("_Z11make_widgetv", "make_widget()"),
            ("_ZN3foo3barEi", "foo::bar(int)"),
            ("_Z3foov.cold", "foo() [clone .cold]"),
            ("_Znwm", "operator new(unsigned long)"),
            // Rust, legacy (hash left out) and v0.
            (
                "_ZN10stack_rust11make_buffer17h0123456789abcdefE",
                "stack_rust::make_buffer",
            ),
            ("_RNvCs1234_5mylib3foo", "mylib::foo"),
            // Not mangled after all: as it is.
            ("_Z", "_Z"),
            ("_R", "_R"),
        ] {
            assert_eq!(demangle(name), shown, "{name}");
        }
    }
}

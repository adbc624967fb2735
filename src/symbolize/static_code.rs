//! Functions of the system's static archives found by their code in images
//! without symbols (issue 41).
//!
//! A stripped static binary (Debian's `busybox`, built from the same glibc
//! as the system's) has glibc's `malloc` in it with no name; a program
//! linked with `-static-libstdc++` (the `gcc`/`g++` drivers) has
//! libstdc++'s emergency pool constructor in it, unnamed. The archive the
//! linker took them from (`libc.a`, `libstdc++.a`) still has them with
//! names, sizes and relocations: each wanted function's bytes, with the
//! fields its relocations fill masked (and the opcode bytes a linker may
//! rewrite when it relaxes a GOT or TLS access), are searched for in the
//! image's executable segments. A function is found where its pattern
//! matches exactly once; none at all, or more than once, is not found.
//!
//! Bounded on any image a tracked process maps: patterns come from the
//! system's archives only (root's files), each is searched by its longest
//! run of fixed bytes (memchr's `memmem`), at most [`MAX_CANDIDATES`]
//! places verified per pattern, in at most [`MAX_IMAGE`] bytes of code.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use object::elf;
use object::read::archive::ArchiveFile;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, RelocationFlags};

/// The functions wanted from one static archive.
#[derive(Debug)]
pub struct Reference {
    /// Where the archive may be, first found wins.
    pub archives: &'static [&'static str],
    /// The members that define them.
    pub members: &'static [&'static str],
    /// The functions' symbol names (local ones too), each with the name
    /// it is found under (musl's `__libc_malloc_impl` is its `malloc`,
    /// which only jumps to it).
    pub symbols: &'static [(&'static str, &'static str)],
}

/// glibc's allocator and the syscall wrappers memtrail probes
/// (`attach::api`), from `libc.a` (libc6-dev).
pub const GLIBC: Reference = Reference {
    archives: &[
        "/usr/lib/x86_64-linux-gnu/libc.a",
        "/usr/lib64/libc.a",
        "/usr/lib/libc.a",
    ],
    members: &["malloc.o", "reallocarray.o", "mmap64.o", "sbrk.o"],
    symbols: &[
        ("malloc", "malloc"),
        ("calloc", "calloc"),
        ("realloc", "realloc"),
        ("reallocarray", "reallocarray"),
        ("free", "free"),
        ("memalign", "memalign"),
        ("aligned_alloc", "aligned_alloc"),
        ("posix_memalign", "posix_memalign"),
        ("valloc", "valloc"),
        ("pvalloc", "pvalloc"),
        ("mmap", "mmap"),
        ("mmap64", "mmap64"),
        ("sbrk", "sbrk"),
    ],
};

/// musl's allocator (mallocng) and `mmap`, from musl-dev's `libc.a`. Its
/// `malloc`, `free`, `realloc` and `memalign` only jump to the functions
/// found here. The simple allocator of `lite_malloc.lo` (a program that
/// never frees) is left out: a program with mallocng has its code too,
/// never called.
pub const MUSL: Reference = Reference {
    archives: &[
        "/usr/lib/x86_64-linux-musl/libc.a",
        "/usr/lib/musl/lib/libc.a",
    ],
    members: &[
        "malloc.lo",
        "free.lo",
        "realloc.lo",
        "calloc.lo",
        "aligned_alloc.lo",
        "posix_memalign.lo",
        "mmap.lo",
    ],
    symbols: &[
        ("__libc_malloc_impl", "malloc"),
        ("__libc_free", "free"),
        ("__libc_realloc", "realloc"),
        ("calloc", "calloc"),
        ("aligned_alloc", "aligned_alloc"),
        ("posix_memalign", "posix_memalign"),
        ("mmap", "mmap"),
    ],
};

/// The C libraries whose allocators are looked for in static images.
pub const LIBCS: [&Reference; 2] = [&GLIBC, &MUSL];

/// libstdc++'s emergency exception pool, allocated by a constructor of its
/// own (`eh_alloc.cc`), from the `libstdc++.a` of the installed GCCs.
pub const LIBSTDCXX_POOL: Reference = Reference {
    archives: &[
        "/usr/lib/gcc/x86_64-linux-gnu/12/libstdc++.a",
        "/usr/lib/gcc/x86_64-linux-gnu/13/libstdc++.a",
        "/usr/lib/gcc/x86_64-linux-gnu/14/libstdc++.a",
        "/usr/lib/gcc/x86_64-linux-gnu/11/libstdc++.a",
    ],
    members: &["eh_alloc.o"],
    symbols: &[
        ("_GLOBAL__sub_I_eh_alloc.cc", "_GLOBAL__sub_I_eh_alloc.cc"),
        ("_ZN12_GLOBAL__N_14poolC2Ev", "_ZN12_GLOBAL__N_14poolC2Ev"),
    ],
};

/// The most places a pattern's anchor is verified at in one image.
pub const MAX_CANDIDATES: usize = 4096;
/// The most bytes of executable segments searched in one image: 512 MiB.
pub const MAX_IMAGE: u64 = 512 << 20;
/// Fixed bytes a pattern needs (fewer could match by chance).
const MIN_FIXED: usize = 24;
/// The longest anchor searched for.
const MAX_ANCHOR: usize = 48;
/// The largest function taken from an archive.
const MAX_FUNCTION: u64 = 64 << 10;

/// A function found in an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub name: String,
    pub vaddr: u64,
    pub size: u64,
    /// The file offset of its first byte.
    pub offset: u64,
}

/// One function's code with the bytes a link may change masked.
#[derive(Debug)]
struct Pattern {
    /// Every name at the function's address in its member.
    names: Vec<String>,
    bytes: Vec<u8>,
    /// true where `bytes` is fixed.
    fixed: Vec<bool>,
    /// The longest run of fixed bytes (at most [`MAX_ANCHOR`]): start, length.
    anchor: (usize, usize),
}

/// The patterns of each reference, by its members, built once per
/// process.
fn patterns(reference: &'static Reference) -> Arc<Vec<Pattern>> {
    type Built = HashMap<&'static [&'static str], Arc<Vec<Pattern>>>;
    static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
    let key = reference.members;
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    built
        .entry(key)
        .or_insert_with(|| Arc::new(load(reference).unwrap_or_default()))
        .clone()
}

/// The first of `reference`'s archives present, with its bytes.
fn archive(reference: &Reference) -> Option<(PathBuf, crate::sys::FileData)> {
    reference.archives.iter().find_map(|path| {
        let data = crate::sys::map_file(Path::new(path)).ok()?;
        Some((PathBuf::from(path), data))
    })
}

/// The version of the references and of the matching: a cache of what
/// was found keys it, and a change of either changes it.
pub const REFERENCES_VERSION: u32 = 1;

/// The identity of the archive `reference` reads (path, size, mtime) and
/// [`REFERENCES_VERSION`], for a cache of what was found with it; None
/// without one.
pub fn archive_stamp(reference: &Reference) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    reference.archives.iter().find_map(|path| {
        let md = std::fs::metadata(path).ok()?;
        Some(format!(
            "v{REFERENCES_VERSION}:{path}:{}:{}.{}",
            md.size(),
            md.mtime(),
            md.mtime_nsec()
        ))
    })
}

fn load(reference: &Reference) -> Option<Vec<Pattern>> {
    let (path, data) = archive(reference)?;
    let parsed = std::panic::catch_unwind(|| {
        let ar = ArchiveFile::parse(&*data).ok()?;
        let mut out = Vec::new();
        for member in ar.members().flatten() {
            if !reference
                .members
                .iter()
                .any(|m| m.as_bytes() == member.name())
            {
                continue;
            }
            let Ok(bytes) = member.data(&*data) else {
                continue;
            };
            if let Ok(obj) = object::File::parse(bytes) {
                member_patterns(&obj, reference.symbols, &mut out);
            }
        }
        Some(out)
    });
    let patterns = parsed.ok().flatten();
    tracing::debug!(
        archive = %path.display(),
        patterns = patterns.as_ref().map_or(0, Vec::len),
        "static code patterns"
    );
    patterns
}

/// The patterns of the wanted functions one archive member defines.
fn member_patterns(obj: &object::File<'_>, wanted: &[(&str, &str)], out: &mut Vec<Pattern>) {
    // Every function symbol by (section, address), to name aliases.
    let mut at: HashMap<(usize, u64), Vec<String>> = HashMap::new();
    let mut sizes: HashMap<(usize, u64), u64> = HashMap::new();
    for sym in obj.symbols() {
        let (Some(section), Ok(name)) = (sym.section_index(), sym.name()) else {
            continue;
        };
        if sym.kind() != object::SymbolKind::Text || sym.size() == 0 {
            continue;
        }
        let key = (section.0, sym.address());
        at.entry(key).or_default().push(name.to_owned());
        sizes.insert(key, sym.size());
    }
    for ((section, addr), names) in at {
        if !names.iter().any(|n| wanted.iter().any(|w| w.0 == n)) {
            continue;
        }
        let size = sizes[&(section, addr)];
        let Ok(sec) = obj.section_by_index(object::SectionIndex(section)) else {
            continue;
        };
        if size > MAX_FUNCTION {
            continue;
        }
        if let Some(pattern) = pattern_of(&sec, addr, size, names) {
            out.push(pattern);
        }
    }
}

/// The pattern of the function at `addr`, `size` bytes long, in `sec`.
fn pattern_of(
    sec: &object::Section<'_, '_>,
    addr: u64,
    size: u64,
    names: Vec<String>,
) -> Option<Pattern> {
    let data = sec.data().ok()?;
    let start = usize::try_from(addr).ok()?;
    let bytes = data.get(start..start.checked_add(usize::try_from(size).ok()?)?)?;
    let mut fixed = vec![true; bytes.len()];
    for (offset, reloc) in sec.relocations() {
        let RelocationFlags::Elf { r_type } = reloc.flags() else {
            return None;
        };
        let (before, len) = masked(r_type, reloc.size());
        let Some(into) = offset.checked_sub(addr) else {
            continue;
        };
        let Ok(into) = usize::try_from(into) else {
            continue;
        };
        let from = into.saturating_sub(before);
        let to = into.saturating_add(len).min(fixed.len());
        if from < to {
            fixed[from..to].iter_mut().for_each(|f| *f = false);
        }
    }
    let anchor = longest_run(&fixed);
    let total = fixed.iter().filter(|&&f| f).count();
    (total >= MIN_FIXED && anchor.1 >= 8).then(|| Pattern {
        names,
        bytes: bytes.to_vec(),
        fixed,
        anchor,
    })
}

/// Bytes masked before a relocation's field, and from its start: the
/// field itself, and where a linker may rewrite the instruction (GOT
/// loads relaxed to `lea` or an immediate, initial-exec and dynamic TLS
/// accesses relaxed to local-exec in an executable) its REX, opcode and
/// ModRM bytes, or the whole sequence.
fn masked(r_type: u32, bits: u8) -> (usize, usize) {
    let field = usize::from(bits / 8).max(4);
    match r_type {
        elf::R_X86_64_GOTPCREL
        | elf::R_X86_64_GOTPCRELX
        | elf::R_X86_64_REX_GOTPCRELX
        | elf::R_X86_64_GOTTPOFF
        | elf::R_X86_64_GOTPC32_TLSDESC => (3, field),
        // data16 lea x@tlsgd(%rip),%rdi; data16 data16 rex64 call: 16
        // bytes in all, 4 of them before the field.
        elf::R_X86_64_TLSGD | elf::R_X86_64_TLSLD => (4, 12),
        elf::R_X86_64_TLSDESC_CALL => (0, 2),
        _ => (0, field),
    }
}

/// The longest run of `true` in `fixed`, at most [`MAX_ANCHOR`] long.
fn longest_run(fixed: &[bool]) -> (usize, usize) {
    let (mut best, mut start) = ((0, 0), 0);
    for (i, &f) in fixed.iter().enumerate() {
        if !f {
            start = i + 1;
            continue;
        }
        let len = i + 1 - start;
        if len > best.1 {
            best = (start, len.min(MAX_ANCHOR));
        }
        if len >= MAX_ANCHOR {
            break;
        }
    }
    best
}

/// The functions of `reference` found in the ELF image `data`: each
/// wanted name whose function's code matches once in its executable
/// segments, at the address it has there. Empty when the archive is not
/// installed, the image is not an ELF image or nothing matches.
pub fn find(data: &[u8], reference: &'static Reference) -> Vec<Found> {
    let patterns = patterns(reference);
    if patterns.is_empty() {
        return Vec::new();
    }
    let caught = std::panic::catch_unwind(|| search(data, &patterns, reference.symbols));
    caught.unwrap_or_default()
}

/// The functions of libstdc++'s emergency pool (the runtime pools of
/// `report::reachable`) found in the ELF image `data` when it has no
/// symbol table to name them: a program linked with `-static-libstdc++`
/// and stripped.
pub fn runtime_functions(data: &[u8]) -> Vec<Found> {
    let has_symtab = std::panic::catch_unwind(|| {
        object::File::parse(data).map(|f| f.section_by_name(".symtab").is_some())
    });
    let started = std::time::Instant::now();
    let found = match has_symtab {
        Ok(Ok(false)) => find(data, &LIBSTDCXX_POOL),
        _ => Vec::new(),
    };
    tracing::debug!(
        bytes = data.len(),
        found = found.len(),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "runtime functions looked for by their code"
    );
    found
}

/// The executable segments of `file`: their address, file offset and
/// bytes.
fn code_segments<'d>(file: &object::File<'d>) -> Vec<(u64, u64, &'d [u8])> {
    let mut total = 0u64;
    let mut out = Vec::new();
    for seg in file.segments() {
        let object::SegmentFlags::Elf { p_flags } = seg.flags() else {
            continue;
        };
        if p_flags & elf::PF_X == 0 {
            continue;
        }
        let Ok(bytes) = seg.data() else { continue };
        total = total.saturating_add(bytes.len() as u64);
        if total > MAX_IMAGE {
            break;
        }
        out.push((seg.address(), seg.file_range().0, bytes));
    }
    out
}

fn search(data: &[u8], patterns: &[Pattern], wanted: &[(&str, &str)]) -> Vec<Found> {
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let segments = code_segments(&file);
    let mut found = Vec::new();
    for p in patterns {
        let Some((vaddr, offset)) = unique_match(p, &segments) else {
            continue;
        };
        let names = wanted.iter().filter(|w| p.names.iter().any(|n| n == w.0));
        for &(_, name) in names {
            found.push(Found {
                name: name.to_owned(),
                vaddr,
                size: p.bytes.len() as u64,
                offset,
            });
        }
    }
    found
}

/// The address and file offset where `p` matches, when it matches exactly
/// once.
fn unique_match(p: &Pattern, segments: &[(u64, u64, &[u8])]) -> Option<(u64, u64)> {
    let (a_start, a_len) = p.anchor;
    let finder = memchr::memmem::Finder::new(&p.bytes[a_start..a_start + a_len]);
    let mut hit: Option<(u64, u64)> = None;
    let mut tried = 0usize;
    for &(addr, file_off, bytes) in segments {
        for at in finder.find_iter(bytes) {
            tried += 1;
            if tried > MAX_CANDIDATES {
                return None;
            }
            let Some(start) = at.checked_sub(a_start) else {
                continue;
            };
            let Some(code) = bytes.get(start..start + p.bytes.len()) else {
                continue;
            };
            let same = code
                .iter()
                .zip(&p.bytes)
                .zip(&p.fixed)
                .all(|((c, b), &f)| !f || c == b);
            if !same {
                continue;
            }
            if hit.is_some() {
                return None; // ambiguous
            }
            hit = Some((addr + start as u64, file_off + start as u64));
        }
    }
    hit
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check the anchor is the longest fixed run, capped.
    #[test]
    fn symbolize_static_code_anchor() {
        let f = |s: &str| s.chars().map(|c| c == 'x').collect::<Vec<_>>();
        assert_eq!(longest_run(&f("xx.xxxx.x")), (3, 4));
        assert_eq!(longest_run(&f("....")), (0, 0));
        assert_eq!(longest_run(&[true; 100]), (0, MAX_ANCHOR));
    }

    /// Check masking of relaxable relocations.
    #[test]
    fn symbolize_static_code_masks() {
        assert_eq!(masked(elf::R_X86_64_PLT32, 32), (0, 4));
        assert_eq!(masked(elf::R_X86_64_REX_GOTPCRELX, 32), (3, 4));
        assert_eq!(masked(elf::R_X86_64_64, 64), (0, 8));
        assert_eq!(masked(elf::R_X86_64_TLSGD, 32), (4, 12));
    }

    /// Check that what is no ELF image, or a cut one, finds nothing and
    /// does not panic.
    #[test]
    fn symbolize_static_code_hostile_images() {
        assert!(find(b"garbage", &GLIBC).is_empty());
        let exe = std::fs::read("/proc/self/exe").unwrap();
        for cut in [4, 64, 1000, exe.len() / 2] {
            assert!(find(&exe[..cut], &GLIBC).is_empty());
            assert!(runtime_functions(&exe[..cut]).is_empty());
        }
        let mut zeroed = exe.clone();
        zeroed[0x20..0x40].fill(0xff); // e_phoff, e_shoff
        assert!(find(&zeroed, &GLIBC).is_empty());
    }
}

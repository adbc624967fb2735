//! Images a tracked program maps executable that memtrail cannot or must not
//! probe (issue 28): files that are no ELF image, and malformed ELF images a
//! tracked user can craft. memtrail parses them as root: every parser must
//! be total (no panic, no hang, bounded memory), and the capture goes on
//! with such an image skipped and named in the profile.
//!
//! The fuzz test mutates a small real image (`tests/fixtures/image_lib.c`:
//! allocator entry points, `.eh_frame`, `.note.stapsdt` markers, symbol
//! tables, a build id, DWARF, a debug link) deterministically and feeds the
//! mutants straight to the parsers; `MEMTRAIL_FUZZ_ITERS` and
//! `MEMTRAIL_FUZZ_SEED` run a longer or another campaign.
//!
//! A binary of its own: the fuzz test installs a panic hook and bounds this
//! process's peak memory, which other tests beside it would raise.

mod support;

use std::ffi::OsString;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use object::{Object, ObjectSection};
use serde_json::Value;
use support::{capture, cmd, num, usdt_fixture};

/// The seed image, built once, with a debug link added (to a debug file
/// next to it).
/// The seed image's sites: its bump allocator's four entries, the eleven
/// return sites of its three allocating ones (issue 40), two markers.
const SEED_SITES: usize = 17;

fn seed_image() -> &'static Path {
    static SEED: OnceLock<PathBuf> = OnceLock::new();
    SEED.get_or_init(|| {
        let lib = usdt_fixture("image_lib", &["-shared", "-fPIC", "-O2"]);
        let linked = lib.with_extension("linked");
        if !linked.exists() {
            let debug = lib.with_extension("debug");
            let objcopy = |args: &[&std::ffi::OsStr]| {
                let status = Command::new("objcopy")
                    .args(args)
                    .status()
                    .expect("run objcopy");
                assert!(status.success(), "objcopy {args:?}");
            };
            objcopy(&["--only-keep-debug".as_ref(), lib.as_ref(), debug.as_ref()]);
            let tmp = lib.with_extension(format!("linked.{}", std::process::id()));
            let link_arg = format!("--add-gnu-debuglink={}", debug.display());
            objcopy(&[link_arg.as_ref(), lib.as_ref(), tmp.as_ref()]);
            std::fs::rename(&tmp, &linked).expect("rename the seed image into place");
        }
        linked
    })
}

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The seed image and the parts of it mutations aim at: its ELF header,
/// program and section header tables, and every section in the file.
struct Seed {
    data: Vec<u8>,
    parts: Vec<(String, Range<usize>)>,
}

impl Seed {
    fn new(data: Vec<u8>) -> Self {
        let mut parts = vec![("ehdr".to_owned(), 0..64)];
        let u16_at = |at: usize| u16::from_le_bytes([data[at], data[at + 1]]) as usize;
        let u64_at =
            |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes")) as usize;
        let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
        let (shoff, shentsize, shnum) = (u64_at(40), u16_at(58), u16_at(60));
        parts.push(("phdrs".to_owned(), phoff..phoff + phentsize * phnum));
        parts.push(("shdrs".to_owned(), shoff..shoff + shentsize * shnum));
        let file = object::File::parse(&*data).expect("the seed parses");
        for section in file.sections() {
            let Some((off, size)) = section.file_range() else {
                continue;
            };
            if size > 0 {
                let name = section.name().unwrap_or("?").to_owned();
                parts.push((name, off as usize..(off + size) as usize));
            }
        }
        Self { data, parts }
    }

    /// What the parsers read most: the headers, the symbol tables and
    /// their strings, CFI, notes, the debug link, the code.
    fn hot(&self, rng: &mut Rng) -> Range<usize> {
        const HOT: &[&str] = &[
            "ehdr",
            "phdrs",
            "shdrs",
            ".dynsym",
            ".dynstr",
            ".symtab",
            ".strtab",
            ".eh_frame",
            ".eh_frame_hdr",
            ".note.stapsdt",
            ".note.gnu.build-id",
            ".gnu_debuglink",
            ".shstrtab",
            ".text",
            ".dynamic",
        ];
        let hot: Vec<&Range<usize>> = self
            .parts
            .iter()
            .filter(|(name, _)| HOT.contains(&name.as_str()))
            .map(|(_, range)| range)
            .collect();
        hot[rng.below(hot.len())].clone()
    }

    /// A mutant: one to four mutations of the seed, a quarter of them of
    /// a header's field.
    fn mutant(&self, rng: &mut Rng) -> Vec<u8> {
        let mut data = self.data.clone();
        for _ in 0..1 + rng.below(4) {
            if rng.below(4) == 0 {
                self.mutate_field(&mut data, rng);
            } else {
                mutate(&mut data, self.hot(rng), rng);
            }
        }
        data
    }

    /// Sets a field of the ELF header, a program header or a section
    /// header (offsets, sizes, addresses, counts, types, flags) to a value
    /// that breaks it.
    fn mutate_field(&self, data: &mut [u8], rng: &mut Rng) {
        // (offset, width) of the fields of each header.
        const EHDR: &[(usize, usize)] = &[
            (16, 2),
            (18, 2),
            (24, 8),
            (32, 8),
            (40, 8),
            (54, 2),
            (56, 2),
            (58, 2),
            (60, 2),
            (62, 2),
        ];
        const PHDR: &[(usize, usize)] =
            &[(0, 4), (4, 4), (8, 8), (16, 8), (32, 8), (40, 8), (48, 8)];
        const SHDR: &[(usize, usize)] = &[
            (4, 4),
            (8, 8),
            (16, 8),
            (24, 8),
            (32, 8),
            (40, 4),
            (44, 4),
            (48, 8),
            (56, 8),
        ];
        let (table, entry, fields) = match rng.below(3) {
            0 => ("ehdr", 64, EHDR),
            1 => ("phdrs", 56, PHDR),
            _ => ("shdrs", 64, SHDR),
        };
        let Some((_, range)) = self.parts.iter().find(|(name, _)| name == table) else {
            return;
        };
        let entries = (range.len() / entry).max(1);
        let (field, width) = fields[rng.below(fields.len())];
        let at = range.start + rng.below(entries) * entry + field;
        let value = interesting(rng, data.len()).to_le_bytes();
        if let Some(dst) = data.get_mut(at..at + width) {
            dst.copy_from_slice(&value[..width]);
        }
    }
}

/// Values that break sizes, counts and offsets.
fn interesting(rng: &mut Rng, len: usize) -> u64 {
    let values = [
        0,
        1,
        2,
        3,
        4,
        7,
        8,
        0x7f,
        0x80,
        0xff,
        0xffff,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        1 << 32,
        1 << 40,
        1 << 63,
        (1 << 63) + 0x1000,
        i64::MAX as u64,
        u64::MAX,
        u64::MAX - 7,
        len as u64,
        (len as u64).wrapping_sub(1),
        len as u64 + 1,
        rng.next(),
    ];
    values[rng.below(values.len())]
}

/// One mutation of `data`, most often inside `range`.
fn mutate(data: &mut Vec<u8>, range: Range<usize>, rng: &mut Rng) {
    let len = data.len();
    let range = range.start.min(len)..range.end.min(len);
    if range.is_empty() || len < 16 {
        return;
    }
    let at = range.start + rng.below(range.len());
    match rng.below(16) {
        0..=3 => data[at] ^= 1 << rng.below(8),
        4..=5 => data[at] = rng.next() as u8,
        6..=10 => {
            // An aligned field of 2, 4 or 8 bytes set to a value that
            // breaks it.
            let width = [2, 4, 8][rng.below(3)];
            let at = (at & !(width - 1)).min(len - width);
            let value = interesting(rng, len).to_le_bytes();
            data[at..at + width].copy_from_slice(&value[..width]);
        }
        11 => {
            let n = (1 + rng.below(16)).min(len - at);
            for byte in &mut data[at..at + n] {
                *byte = rng.next() as u8;
            }
        }
        12 => {
            // Copy a chunk of the file over another.
            let n = (1 + rng.below(64)).min(len / 2);
            let from = rng.below(len - n);
            let to = at.min(len - n);
            data.copy_within(from..from + n, to);
        }
        13 => data.truncate(at),
        14 => data.truncate(rng.below(len)),
        _ => {
            let n = 1 + rng.below(8);
            data.splice(at..at, (0..n).map(|_| rng.next() as u8));
        }
    }
}

/// Iterations of the fuzz test: `MEMTRAIL_FUZZ_ITERS`, else 10 000.
fn fuzz_iters() -> u64 {
    std::env::var("MEMTRAIL_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Longer than any mutant takes to parse (milliseconds) by far: only a
/// hang reaches it.
const HANG: Duration = Duration::from_secs(120);

/// Held by every test of this binary: the fuzzing test checks this
/// process's peak memory, and the others, run at once on the test
/// harness's threads (huge images read in this process), raised the peak
/// it measured.
static MEMORY: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`MEMORY`] (a test that panicked holding it does not poison it
/// for the others).
fn memory_alone() -> std::sync::MutexGuard<'static, ()> {
    MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The peak resident memory of this process, in KiB.
fn max_rss_kib() -> i64 {
    // SAFETY: getrusage writes the struct it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage.ru_maxrss
    }
}

/// Feeds `data` to every parser of an image a tracked process maps, and
/// checks what they return where they succeed.
fn parse_all(data: &[u8]) {
    let api = memtrail::internals::attach::api::all();
    let image = Path::new("mutant.so");
    if let Ok(sites) = memtrail::internals::attach::sites_in(image, data, &api) {
        for site in &sites {
            assert!((site.offset as usize) < data.len(), "{site:?}");
        }
    }
    if let Ok(memtrail::internals::unwind::Compiled::Table(table)) =
        memtrail::internals::unwind::table::compile(data)
    {
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        let index = table.page_index(0);
        assert_eq!(index.last().copied(), Some(table.rows.len() as u32));
    }
    let _ = memtrail::internals::unwind::cache::build_id(data);
    static CACHE: OnceLock<(tempfile::TempDir, memtrail::internals::unwind::cache::Cache)> =
        OnceLock::new();
    let (_, cache) = CACHE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let cache = memtrail::internals::unwind::cache::Cache::at(dir.path()).expect("a cache");
        (dir, cache)
    });
    let _ = cache.key(data);
}

/// Symbolizes a few addresses of the image in `data`, written to `path`
/// (owned by root, or by nobody: another user's file is inspected before
/// blazesym reads it), as the frames of a process that mapped it.
fn symbolize_all(path: &Path, data: &[u8], nobody: bool) {
    std::fs::write(path, data).expect("write a mutant");
    if nobody {
        std::os::unix::fs::chown(path, Some(65534), Some(65534)).expect("chown");
    }
    let mut spaces = memtrail::internals::symbolize::AddressSpaces::default();
    let mapping = memtrail::internals::symbolize::Mapping {
        start: 0x10000,
        end: 0x20000,
        pgoff: 0,
        path: path.to_owned(),
        file_id: None,
    };
    spaces.mappings.insert(1, vec![mapping]);
    let ips: Vec<u64> = (0..16).map(|i| 0x11100 + i * 0x20).collect();
    let symbolizer = memtrail::internals::symbolize::StackSymbolizer::new();
    let places = symbolizer.places(&spaces, 1, &ips);
    assert_eq!(places.0.len(), ips.len());
    std::fs::remove_file(path).expect("remove a mutant");
}

/// Check that thousands of mutants of a real image (headers, symbol tables,
/// `.eh_frame`, `.note.stapsdt`, notes, the debug link, code) neither panic
/// nor hang nor blow up memory in memtrail's image parsers: the symbol and
/// marker search with its x86 analysis, the CFI compiler, the build-id
/// reader, and symbolization (issue 28).
#[test]
fn attach_images_fuzz_parsers() {
    let _alone = memory_alone();
    let seed = Seed::new(std::fs::read(seed_image()).expect("read the seed image"));
    let first = std::env::var("MEMTRAIL_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(28u64);
    // The seed itself has sites (see SEED_SITES) and a table.
    let api = memtrail::internals::attach::api::all();
    let sites =
        memtrail::internals::attach::sites_in(Path::new("seed"), &seed.data, &api).expect("seed");
    assert_eq!(sites.len(), SEED_SITES, "{sites:?}");
    // The parsers catch their panics and turn them into errors (a last
    // line in a capture); here every panic of memtrail's counts as a
    // failure. blazesym's (0.2.3: `unwrap`s on a malformed note or debug
    // link section, header arithmetic that overflows) are counted apart:
    // memtrail catches them, the file's frames go without functions. Only
    // this thread's: the other tests of the binary run beside it.
    static PANICS: AtomicU64 = AtomicU64::new(0);
    static BLAZESYM_PANICS: AtomicU64 = AtomicU64::new(0);
    static FUZZER: OnceLock<std::thread::ThreadId> = OnceLock::new();
    FUZZER.get_or_init(|| std::thread::current().id());
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if FUZZER.get() == Some(&std::thread::current().id()) {
            let upstream = info
                .location()
                .is_some_and(|l| l.file().contains("/blazesym-"));
            let count = if upstream { &BLAZESYM_PANICS } else { &PANICS };
            count.fetch_add(1, Ordering::Relaxed);
        }
        default_hook(info);
    }));
    let dir = tempfile::tempdir().expect("temp dir");
    let rss_before = max_rss_kib();
    let mut outcomes = [0u64; 2];
    let mut first_panic = None;
    for n in 0..fuzz_iters() {
        let mut rng = Rng(first.wrapping_mul(0x1_0000_0001).wrapping_add(n));
        let data = seed.mutant(&mut rng);
        let started = Instant::now();
        parse_all(&data);
        // Symbolizing writes a file: one mutant in 8.
        if n % 8 == 0 {
            symbolize_all(&dir.path().join(format!("m{n}.so")), &data, n % 16 == 0);
        }
        let found = memtrail::internals::attach::sites_in(Path::new("m"), &data, &api).is_ok();
        outcomes[usize::from(found)] += 1;
        if first_panic.is_none() && PANICS.load(Ordering::Relaxed) > 0 {
            first_panic = Some(n);
        }
        assert!(
            started.elapsed() < HANG,
            "mutant {n} of seed {first} took {:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        first_panic,
        None,
        "a parser panicked on mutant {first_panic:?} of seed {first} ({} panics)",
        PANICS.load(Ordering::Relaxed)
    );
    // What a campaign found, on the test's stderr (shown on failure, or
    // with --nocapture).
    let _ = writeln!(
        std::io::stderr(),
        "{} mutants: {} with sites, blazesym panicked (caught) {} times",
        fuzz_iters(),
        outcomes[1],
        BLAZESYM_PANICS.load(Ordering::Relaxed)
    );
    // Each parser holds at most a few times its input at once: tens of
    // megabytes would be a size taken from the file.
    let grown = max_rss_kib() - rss_before;
    assert!(grown < 256 * 1024, "peak memory grew by {grown} KiB");
    // Both outcomes happen: the mutants reach past the first checks.
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

/// The fake interpreter (`tests/fixtures/fake_python.c`: an executable
/// exporting `Py_Version`, `_PyRuntime` with 3.13's `_Py_DebugOffsets`):
/// the seed of the Python layouts' fuzz.
fn fake_python() -> PathBuf {
    let flags = ["-O0", "-g", "-fno-builtin", "-Wall", "-Werror", "-pthread"];
    support::fixture_with_flags("fake_python", &[&flags[..], &["-rdynamic"]].concat())
}

/// The file range of the fake interpreter's `_PyRuntime`.
fn runtime_range(data: &[u8]) -> Range<usize> {
    use object::ObjectSymbol;
    let file = object::File::parse(data).expect("the fake interpreter parses");
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("_PyRuntime"))
        .expect("_PyRuntime");
    let section = file
        .section_by_index(sym.section_index().expect("a section"))
        .expect("its section");
    let (off, _) = section.file_range().expect("in the file");
    let at = (off + sym.address() - section.address()) as usize;
    at..at + sym.size() as usize
}

/// A process's memory as the resolver reads it, in this test's process: a
/// code object (the fake interpreter's layout: file at 16, name at 24,
/// table at 32, first line at 48), two strings and a location table, each
/// pointing at the others, then mutated.
struct FakeMemory(Vec<u64>);

impl FakeMemory {
    const WORDS: usize = 512;

    fn new() -> Self {
        let mut m = Self(vec![0; Self::WORDS]);
        let base = m.0.as_ptr() as u64;
        let (file, name, table) = (base + 64 * 8, base + 128 * 8, base + 192 * 8);
        m.0[2] = file;
        m.0[3] = name;
        m.0[4] = table;
        m.0[6] = 7; // first line
        let ascii = 1 << 2 | 1 << 5 | 1 << 6;
        for (at, text) in [(64, b"fake.py\0"), (128, b"function")] {
            m.0[at + 2] = 8;
            m.0[at + 4] = ascii;
            m.0[at + 5] = u64::from_le_bytes(*text);
        }
        m.0[192 + 2] = 8; // the table: 8 bytes at 32
        m.0[192 + 4] = 0x0a01_0a01_0a01_0a81;
        m
    }

    /// One to four words set to values that break them, most often
    /// pointers into the memory itself or lengths.
    fn mutate(&mut self, rng: &mut Rng) {
        let base = self.0.as_ptr() as u64;
        for _ in 0..1 + rng.below(4) {
            let at = [2, 3, 4, 6, 66, 68, 130, 132, 194, 196][rng.below(10)];
            let at = if rng.below(4) == 0 {
                rng.below(Self::WORDS)
            } else {
                at
            };
            self.0[at] = match rng.below(3) {
                0 => base + rng.below(Self::WORDS * 8) as u64,
                1 => interesting(rng, Self::WORDS * 8),
                _ => rng.next(),
            };
        }
    }
}

/// A stack record's words after its native frames: Python frames of code
/// objects at `code` or anywhere, group ends, offsets up to 2^16.
fn python_words(rng: &mut Rng, code: u64) -> Vec<u64> {
    let py = memtrail::internals::python::PY_FRAME;
    (0..rng.below(140))
        .map(|_| match rng.below(5) {
            0 => py,
            1 => py | rng.next() & !py,
            2 => rng.next(),
            _ => py | (rng.next() & 0xffff) << 47 | (code + 8 * rng.below(8) as u64),
        })
        .collect()
}

/// Check that mutants of the Python data memtrail takes from a tracked
/// process are parsed without a panic, a hang or unbounded reads: an
/// interpreter image's layout (a fake python3.13's `_Py_DebugOffsets` and
/// ELF headers: a layout taken is one memtrail's readers can read), code
/// records, location tables, stack records' Python words, and code objects
/// read from a live process's memory (issue 40: a field at offset 4000
/// panicked memtrail).
#[test]
fn attach_images_fuzz_python_parsers() {
    use memtrail::internals::python;
    let _alone = memory_alone();
    let seed = Seed::new(std::fs::read(fake_python()).expect("read the fake interpreter"));
    let runtime = runtime_range(&seed.data);
    let first = std::env::var("MEMTRAIL_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40u64);
    let interp = python::parse_interpreter(&seed.data)
        .expect("the seed's layout is taken")
        .expect("the seed is an interpreter");
    let mut resolver = python::Resolver::default();
    let pid = std::process::id();
    resolver.open_with(pid, &interp);
    let mut memory = FakeMemory::new();
    let mut record =
        vec![0u8; size_of::<memtrail::internals::bpf::skel::memtrail::types::mt_py_code_record>()];
    let (mut taken, mut learned, mut named) = (0, 0, 0);
    for n in 0..fuzz_iters() {
        let mut rng = Rng(first.wrapping_mul(0x1_0000_0001).wrapping_add(n));
        let started = Instant::now();
        let mut data = seed.data.clone();
        for _ in 0..1 + rng.below(4) {
            let range = if rng.below(4) == 0 {
                seed.hot(&mut rng)
            } else {
                runtime.clone()
            };
            mutate(&mut data, range, &mut rng);
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Ok(Some(found)) = python::parse_interpreter(&data) {
                assert_eq!(python::check_layout(&found.walk, &found.code), Ok(()));
                let _ = (python::image_value(&found), python::shim_layout(&found));
                taken += 1;
                // The live process's code objects read with it for a while.
                if rng.below(8) == 0 {
                    resolver.open_with(pid, &found);
                }
            }
            // A code record: its bytes mutated, then learned.
            let code = 0x5000_0000 + 8 * rng.below(4) as u64;
            record.iter_mut().for_each(|b| *b = 0);
            record[8..16].copy_from_slice(&code.to_ne_bytes());
            record[16..20].copy_from_slice(&pid.to_ne_bytes());
            let len = record.len();
            mutate(&mut record, 16..len, &mut rng);
            record.resize(len, 0); // a mutation may cut it
            record[..8].fill(0);
            if let Some(Ok(rec)) = memtrail::internals::bpf::record::decode_py_code(&record) {
                resolver.learn(&rec);
                learned += 1;
            }
            memory.mutate(&mut rng);
            let live = memory.0.as_ptr() as u64;
            let at = if rng.below(2) == 0 { code } else { live };
            let words = python_words(&mut rng, at);
            let (_, groups) = python::split(&words);
            for group in &groups {
                let frames = resolver.frames(pid, group);
                let expect = group
                    .iter()
                    .filter(|&&w| python::decode(w).is_some())
                    .count();
                assert_eq!(frames.len(), expect);
                named += frames.iter().filter(|f| f.file.is_some()).count();
            }
        }));
        assert!(outcome.is_ok(), "mutant {n} of seed {first} panicked");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "mutant {n} of seed {first} took {:?}",
            started.elapsed()
        );
        if n % 64 == 63 {
            // A fresh memory now and then: mutations pile up otherwise.
            memory = FakeMemory::new();
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "{} mutants: {taken} layouts taken, {learned} code records, {named} frames named",
        fuzz_iters()
    );
    // Both outcomes happen: the mutants reach past the first checks.
    assert!(taken > 0 && taken < fuzz_iters(), "{taken} layouts taken");
    assert!(
        learned > 0 && named > 0,
        "{learned} records, {named} frames named"
    );
}

/// The profile's `skipped_images`, as (image, reason).
fn skipped(profile: &Value) -> Vec<(String, String)> {
    profile["skipped_images"]
        .as_array()
        .unwrap_or_else(|| panic!("no skipped_images in {profile}"))
        .iter()
        .map(|s| {
            (
                support::string(s, "image").to_owned(),
                support::string(s, "reason").to_owned(),
            )
        })
        .collect()
}

/// Checks `run`'s counts: map_images' 3 x malloc(4243), 2 of them freed,
/// exactly; returns the fixture's pid.
fn assert_map_images_counts(run: &support::Capture) -> u32 {
    run.expect_code(0);
    let events = run.events();
    let mallocs = support::sized(events, "malloc", 4243);
    assert_eq!(mallocs.len(), 3, "{mallocs:?}");
    let addrs: Vec<u64> = mallocs.iter().map(|e| num(e, "addr")).collect();
    let frees = events
        .iter()
        .filter(|e| e["kind"] == "free" && addrs.contains(&num(e, "addr")))
        .count();
    assert_eq!(frees, 2);
    support::pid(mallocs[0])
}

/// Check that files that are no ELF image, mapped executable by a tracked
/// program (8 KiB of random bytes, as a JIT's code or a PE image under
/// Wine; `/etc/passwd`), are skipped and named in the profile, the program
/// resumed, and the capture goes on with exact counts (issue 28: it exited
/// 75 "cannot parse ELF image ... Unknown file magic"). The blob is
/// writable by others: memtrail reads it rather than mapping it.
#[test]
fn attach_non_elf_images_skipped() {
    let _alone = memory_alone();
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let blob = dir
        .path()
        .canonicalize()
        .expect("canonical")
        .join("blob.bin");
    let mut rng = Rng(28);
    let bytes: Vec<u8> = (0..8192).map(|_| rng.next() as u8).collect();
    std::fs::write(&blob, bytes).expect("write the blob");
    std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let run = capture(&cmd(
        "map_images",
        &[blob.as_os_str(), "/etc/passwd".as_ref()],
    ));
    let pid = assert_map_images_counts(&run);
    let profile = run.profile();
    let blob_name = blob.display().to_string();
    assert_eq!(
        skipped(profile),
        [
            (blob_name.clone(), "not an ELF image".to_owned()),
            ("/etc/passwd".to_owned(), "not an ELF image".to_owned()),
        ]
    );
    assert!(
        profile["skipped_images"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| num(s, "pid") == u64::from(pid))
    );
    // Nothing else was made of them: no probe, no unwind table.
    for part in ["probes", "unwind"] {
        let text = profile[part].to_string();
        assert!(
            !text.contains("blob.bin") && !text.contains("/etc/passwd"),
            "{text}"
        );
    }
}

/// The seed image with int3 at `malloc`'s entry (where its probe then
/// goes), which the kernel refuses to probe.
fn with_trap_at_malloc(seed: &[u8]) -> Vec<u8> {
    let api = memtrail::internals::attach::api::all();
    let sites =
        memtrail::internals::attach::sites_in(Path::new("seed"), seed, &api).expect("seed sites");
    let malloc = sites.iter().find(|s| s.symbol == "malloc").expect("malloc");
    let mut data = seed.to_vec();
    data[(malloc.offset - malloc.skipped) as usize] = 0xcc;
    data
}

/// Check that malformed ELF images mapped executable by a tracked program
/// are skipped and named, each with its reason, while the capture goes on
/// with exact counts (issue 28): a cut one, one for another machine, one
/// whose `malloc` the kernel refuses to probe (int3 there), and mutants of
/// a real image; the unmutated image is probed.
#[test]
fn attach_malformed_images_skipped() {
    let _alone = memory_alone();
    for probes in ["system-wide", "per-process"] {
        malformed_images_skipped(probes);
    }
}

fn malformed_images_skipped(probes: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let dir = dir.path().canonicalize().expect("canonical");
    let seed = std::fs::read(seed_image()).expect("read the seed image");
    let mut aarch64 = seed.clone();
    aarch64[18..20].copy_from_slice(&183u16.to_le_bytes());
    let mut images: Vec<(&str, Vec<u8>)> = vec![
        ("seed.so", seed.clone()),
        ("cut.so", seed[..100].to_vec()),
        ("aarch64.so", aarch64),
        ("trap.so", with_trap_at_malloc(&seed)),
    ];
    let parsed = Seed::new(seed.clone());
    let mutants: Vec<(String, Vec<u8>)> = (0..24)
        .map(|n| (format!("mutant{n}.so"), parsed.mutant(&mut Rng(2800 + n))))
        .collect();
    images.extend(
        mutants
            .iter()
            .map(|(name, data)| (name.as_str(), data.clone())),
    );
    let mut args: Vec<OsString> = Vec::new();
    for (name, data) in &images {
        let path = dir.join(name);
        std::fs::write(&path, data).expect("write an image");
        args.push(path.into());
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(OsString::as_os_str).collect();
    let mut command = vec!["--probes".into(), probes.into(), "--".into()];
    command.extend(cmd("map_images", &args));
    let run = capture_run(&command);
    assert_map_images_counts(&run);
    let profile = run.profile();
    let skipped = skipped(profile);
    let path = |name: &str| dir.join(name).display().to_string();
    let reason_of = |name: &str| {
        skipped
            .iter()
            .find(|(image, _)| *image == path(name))
            .map(|(_, reason)| reason.as_str())
    };
    assert_eq!(reason_of("seed.so"), None, "{skipped:?}");
    assert!(
        reason_of("cut.so").is_some_and(|r| r.starts_with("malformed ELF image")),
        "{skipped:?}"
    );
    assert_eq!(
        reason_of("aarch64.so"),
        Some("malformed ELF image: not an x86-64 image (Aarch64, 64-bit)"),
        "{skipped:?}"
    );
    assert!(
        reason_of("trap.so").is_some_and(|r| {
            r.starts_with("the kernel cannot probe the instruction at one of its sites (")
                && r.contains("malloc")
        }),
        "{skipped:?}"
    );
    // Every image skipped is one of those mapped, once.
    for (image, _) in &skipped {
        assert!(image.starts_with(&dir.display().to_string()), "{image}");
        assert_eq!(skipped.iter().filter(|(i, _)| i == image).count(), 1);
    }
    // The seed's sites are probed; none of a skipped image's.
    let probes_of = |name: &str| {
        profile["probes"]
            .as_array()
            .expect("probes")
            .iter()
            .filter(|p| p["image"] == path(name).as_str())
            .count()
    };
    assert_eq!(probes_of("seed.so"), SEED_SITES);
    for (image, _) in &skipped {
        assert_eq!(probes_of(image.rsplit('/').next().unwrap()), 0, "{image}");
    }
}

/// `memtrail run --output … --events … ARGS` (ARGS: flags, `--`, command).
fn capture_run(args: &[OsString]) -> support::Capture {
    let split = args.iter().position(|a| a == "--").expect("--");
    let flags: Vec<&str> = args[..split]
        .iter()
        .map(|a| a.to_str().expect("UTF-8"))
        .collect();
    support::capture_flags(&flags, &args[split + 1..], b"", &[])
}

/// Check that a stack through code that is no ELF image (a frameless JIT
/// thunk calling malloc) ends honestly there: with `--unwind dwarf` its
/// frame is the blob's, without a function, and the walk ends with
/// `no_table` (issue 28).
#[test]
fn attach_stack_through_blob_ends_there() {
    let _alone = memory_alone();
    let dir = tempfile::tempdir().expect("temp dir");
    let blob = dir
        .path()
        .canonicalize()
        .expect("canonical")
        .join("thunk.bin");
    let run = support::capture_flags(
        &["--unwind", "dwarf"],
        &cmd("blob_call", &[blob.as_os_str()]),
        b"",
        &[],
    );
    run.expect_code(0);
    let profile = run.profile();
    assert_eq!(
        skipped(profile),
        [(blob.display().to_string(), "not an ELF image".to_owned())]
    );
    let stacks = support::allocation_sites(profile);
    let stack = stacks
        .iter()
        .find(|s| s["bytes"] == 5555)
        .unwrap_or_else(|| panic!("no stack of 5555 bytes in {stacks:?}"));
    let frames = stack["frames"].as_array().expect("frames");
    assert_eq!(frames.len(), 1, "{stack}");
    // Its path, or its name alone when the process had exited before the
    // mappings pipeline could ask /proc for the path.
    let module = frames[0]["module"].as_str().unwrap_or_default();
    assert!(
        module == blob.display().to_string() || module == "thunk.bin",
        "{stack}"
    );
    assert!(frames[0]["function"].is_null(), "{stack}");
    assert_eq!(stack["end"], "no_table", "{stack}");
}

/// Check that an image another user can write is read, not mapped:
/// truncated right after memtrail took its contents (as a tracked user can
/// do to their own file while memtrail examines it), it is still examined
/// whole, where reading a mapping past the file's new end killed memtrail
/// with SIGBUS (issue 28).
#[test]
fn attach_image_truncated_while_examined() {
    let _alone = memory_alone();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("user.so");
    std::fs::copy(seed_image(), &path).expect("copy the seed image");
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).expect("chown to nobody");
    let data = memtrail::internals::sys::map_file(&path).expect("read the image");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(0))
        .expect("truncate the image");
    let api = memtrail::internals::attach::api::all();
    let sites = memtrail::internals::attach::sites_in(&path, &data, &api).expect("sites");
    assert_eq!(sites.len(), SEED_SITES, "{sites:?}");
    assert!(matches!(
        memtrail::internals::unwind::table::compile(&data),
        Ok(memtrail::internals::unwind::Compiled::Table(_))
    ));
}

/// Check that a path naming something other than a regular file (a FIFO
/// put where a mapped image was: `memtrail attach` reads the images of the
/// process by their paths) is refused at once, not opened: opening a FIFO
/// waited forever for a writer (issue 28).
#[test]
fn attach_image_path_not_a_file_refused() {
    let _alone = memory_alone();
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("image.so");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("C path");
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let sites = memtrail::internals::attach::find_sites(
            &fifo,
            &memtrail::internals::attach::api::all(),
        );
        let _ = done.send(sites.map_err(|err| err.skip_reason()));
    });
    // Only a hang (the old open) reaches the limit.
    let sites = result.recv_timeout(HANG).expect("find_sites returned");
    assert_eq!(sites, Err(Some("not a regular file".to_owned())));
}

/// Symbolizes `malloc`'s entry in the image at `path` (mapped whole at
/// 0x10000), on a thread: None if that does not return before [`HANG`].
fn malloc_frame(path: &Path) -> Option<Value> {
    let seed = std::fs::read(seed_image()).expect("read the seed image");
    let api = memtrail::internals::attach::api::all();
    let sites =
        memtrail::internals::attach::sites_in(Path::new("seed"), &seed, &api).expect("seed sites");
    let malloc = sites.iter().find(|s| s.symbol == "malloc").expect("malloc");
    // An address one past the entry: symbolized as `addr - 1`.
    let ip = 0x10000 + malloc.offset - malloc.skipped + 1;
    let mut spaces = memtrail::internals::symbolize::AddressSpaces::default();
    let mapping = memtrail::internals::symbolize::Mapping {
        start: 0x10000,
        end: 0x30000,
        pgoff: 0,
        path: path.to_owned(),
        file_id: None,
    };
    spaces.mappings.insert(1, vec![mapping]);
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let symbolizer = memtrail::internals::symbolize::StackSymbolizer::new();
        let places = symbolizer.places(&spaces, 1, &[ip]);
        let frames = places.of(ip).expect("the address's frames");
        let frame = serde_json::to_value(&frames[0]).expect("a frame as JSON");
        let _ = done.send(frame);
    });
    result.recv_timeout(HANG).ok()
}

/// Check that an image whose debug link names a FIFO in its directory is
/// symbolized from its own symbols, without opening the FIFO: blazesym
/// opened it and waited forever for a writer (issue 28).
#[test]
fn symbolize_debug_link_to_fifo_not_opened() {
    let _alone = memory_alone();
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("lib.so");
    std::fs::copy(seed_image(), &image).expect("copy the seed image");
    let data = std::fs::read(&image).expect("read");
    let file = object::File::parse(&*data).expect("parse");
    let (name, _) = file.gnu_debuglink().expect("read").expect("a debug link");
    let fifo = dir.path().join(std::str::from_utf8(name).expect("UTF-8"));
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("C path");
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let frame = malloc_frame(&image).expect("symbolization returned");
    assert_eq!(frame["function"], "malloc", "{frame}");
}

/// The seed image with its debug sections compressed (zlib), and each
/// compressed `.debug_info`'s claimed size set to `claim(actual)`.
fn compressed_seed(dir: &Path, claim: impl Fn(u64) -> u64) -> PathBuf {
    let image = dir.join("compressed.so");
    let status = Command::new("objcopy")
        .arg("--compress-debug-sections=zlib")
        .arg(seed_image())
        .arg(&image)
        .status()
        .expect("run objcopy");
    assert!(status.success());
    let mut data = std::fs::read(&image).expect("read");
    let file = object::File::parse(&*data).expect("parse");
    let section = file.section_by_name(".debug_info").expect(".debug_info");
    let range = section.compressed_file_range().expect("compressed");
    assert_eq!(range.format, object::CompressionFormat::Zlib);
    // The data follows its Elf64_Chdr (ch_type, ch_reserved, ch_size,
    // ch_addralign: 24 bytes).
    let at = range.offset as usize - 24 + 8;
    let claimed = claim(range.uncompressed_size);
    drop(file);
    data[at..at + 8].copy_from_slice(&claimed.to_le_bytes());
    std::fs::write(&image, &data).expect("write");
    std::os::unix::fs::chown(&image, Some(65534), Some(65534)).expect("chown to nobody");
    image
}

/// Check that an image another user can write whose compressed debug
/// section holds more than it claims (the way to a zlib bomb, which
/// blazesym decompressed whole whatever the claim), or claims more than
/// memtrail lets blazesym decompress, is not handed to blazesym: the frame
/// keeps its module and offset, without a function, and nothing panics
/// (blazesym's length check did, in a debug build) (issue 28). The image
/// as objcopy wrote it is symbolized.
#[test]
fn symbolize_compressed_section_bounded() {
    let _alone = memory_alone();
    let dir = tempfile::tempdir().expect("temp dir");
    let honest = compressed_seed(dir.path(), |size| size);
    let frame = malloc_frame(&honest).expect("symbolized");
    assert_eq!(frame["function"], "malloc", "{frame}");
    for claim in [|size: u64| size - 1, |_| 1 << 40] {
        let dir = tempfile::tempdir().expect("temp dir");
        let image = compressed_seed(dir.path(), claim);
        let frame = malloc_frame(&image).expect("symbolization returned");
        assert!(frame["function"].is_null(), "{frame}");
        assert_eq!(frame["module"], image.display().to_string().as_str());
    }
}

/// Check that an image claiming another's build id with call frame
/// information of its own neither takes nor leaves its table for the
/// other in the unwind table cache: cached first, the forged table was
/// every later capture's for the real image (issue 28).
#[test]
fn unwind_cache_not_poisoned_by_build_id() {
    let _alone = memory_alone();
    let dir = tempfile::tempdir().expect("temp dir");
    let cache =
        memtrail::internals::unwind::cache::Cache::at(&dir.path().join("unwind")).expect("cache");
    let seed = std::fs::read(seed_image()).expect("read the seed image");
    let file = object::File::parse(&*seed).expect("parse");
    let (off, size) = file
        .section_by_name(".eh_frame")
        .and_then(|s| s.file_range())
        .expect(".eh_frame");
    drop(file);
    // DW_CFA_def_cfa_offset 16 becomes 32 in the forged image.
    let frame = &seed[off as usize..(off + size) as usize];
    let at = off as usize
        + frame
            .windows(2)
            .position(|w| w == [0x0e, 0x10])
            .expect("a def_cfa_offset 16");
    let mut forged = seed.clone();
    forged[at + 1] = 0x20;
    let (real_path, forged_path) = (dir.path().join("real.so"), dir.path().join("forged.so"));
    std::fs::write(&real_path, &seed).expect("write");
    std::fs::write(&forged_path, &forged).expect("write");
    let table = |path: &Path| {
        let (table, cached) =
            memtrail::internals::unwind::prepare(path, Some(&cache)).expect("a table");
        let memtrail::internals::unwind::Compiled::Table(table) = table else {
            panic!("{} has CFI", path.display());
        };
        (table.rows, cached)
    };
    let (forged_rows, cached) = table(&forged_path);
    assert!(!cached);
    let (real_rows, cached) = table(&real_path);
    assert!(
        !cached,
        "the real image got the forged image's cached table"
    );
    assert_ne!(real_rows, forged_rows);
    // Each gets its own table back from the cache.
    assert_eq!(table(&real_path), (real_rows, true));
    assert_eq!(table(&forged_path), (forged_rows, true));
}

/// Check that a session on a running process (as `memtrail attach`) skips
/// and names the images it had mapped that are no ELF image or whose code
/// the kernel refuses to probe, and that a fork and a second mapping of
/// them afterwards go on: the capture counts the window exactly (issue 28:
/// the refused image stayed among the per-process probes, and mapping it
/// again failed the capture).
#[test]
fn attach_running_process_skips_mapped_images() {
    let _alone = memory_alone();
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("temp dir");
    let dir = dir.path().canonicalize().expect("canonical");
    let seed = std::fs::read(seed_image()).expect("read the seed image");
    let (trap, blob) = (dir.join("trap.so"), dir.join("blob.bin"));
    std::fs::write(&trap, with_trap_at_malloc(&seed)).expect("write");
    std::fs::write(&blob, b"no ELF image, some JIT's code").expect("write");
    let mut target = Command::new(support::fixture("map_images"))
        .arg("--hold")
        .args([&trap, &blob])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start map_images");
    let mut lines = BufReader::new(target.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("a line").expect("read"), "mapped");
    let session = memtrail::Session::start(
        &memtrail::SessionOptions::default(),
        memtrail::Target::Pid(target.id()),
    );
    // Let it go on whatever happened, so that it never waits forever.
    let mut stdin = target.stdin.take().expect("stdin");
    stdin.write_all(b"g").expect("write");
    drop(stdin);
    let mut session = session.expect("session on the running process");
    session.wait().expect("wait for the process");
    assert!(target.wait().expect("wait").success());
    let profile = session.finish().expect("the capture succeeds").profile;
    let skipped: Vec<(&str, &str)> = profile
        .skipped_images
        .iter()
        .map(|s| (s.image.as_str(), s.reason.as_str()))
        .collect();
    let (trap, blob) = (trap.display().to_string(), blob.display().to_string());
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(
        skipped.contains(&(blob.as_str(), "not an ELF image")),
        "{skipped:?}"
    );
    assert!(
        skipped.iter().any(|(image, reason)| *image == trap
            && reason.starts_with("the kernel cannot probe the instruction")),
        "{skipped:?}"
    );
    // The window: the child's malloc(777) and free, the parent's 3 x
    // malloc(4243) and 2 frees.
    assert_eq!(profile.totals.allocations, 4, "{:?}", profile.totals);
    assert_eq!(profile.totals.frees, 3, "{:?}", profile.totals);
    assert_eq!(profile.totals.allocated_bytes, 777 + 3 * 4243);
    assert_eq!(profile.processes.len(), 2);
}

/// Check that an image another user can write, larger than the 1 GiB
/// memtrail reads of one but mostly DWARF (a debug build), is examined all
/// the same: its DWARF, which no image parser reads, is left unread (issue
/// 28: it was refused as too large, its allocators unprobed).
#[test]
fn attach_huge_user_image_read_without_its_dwarf() {
    let _alone = memory_alone();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("huge.so");
    let mut data = std::fs::read(seed_image()).expect("read the seed image");
    let file = object::File::parse(&*data).expect("parse");
    let index = file
        .section_by_name(".debug_info")
        .expect(".debug_info")
        .index()
        .0;
    drop(file);
    // .debug_info moves past the end, 1.25 GiB long: a hole in the file.
    let shoff = u64::from_le_bytes(data[40..48].try_into().expect("8 bytes")) as usize;
    let header = shoff + index * 64;
    let (offset, size) = (data.len() as u64, 5u64 << 28);
    data[header + 0x18..header + 0x20].copy_from_slice(&offset.to_le_bytes());
    data[header + 0x20..header + 0x28].copy_from_slice(&size.to_le_bytes());
    std::fs::write(&path, &data).expect("write");
    let file = std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open");
    file.set_len(offset + size).expect("extend");
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).expect("chown to nobody");
    let read = memtrail::internals::sys::map_file(&path).expect("read the image");
    assert!(matches!(
        read,
        memtrail::internals::sys::FileData::Sparse(_)
    ));
    assert_eq!(read.len() as u64, offset + size);
    let api = memtrail::internals::attach::api::all();
    let sites = memtrail::internals::attach::sites_in(&path, &read, &api).expect("sites");
    assert_eq!(sites.len(), SEED_SITES, "{sites:?}");
    assert!(matches!(
        memtrail::internals::unwind::table::compile(&read),
        Ok(memtrail::internals::unwind::Compiled::Table(_))
    ));
}

/// Check that an image another user can write, larger than 1 GiB, with
/// compressed DWARF that memtrail does not read into memory, is still
/// symbolized with its DWARF (its compressed sections are checked from the
/// file) (issue 28).
#[test]
fn symbolize_huge_user_image_with_compressed_dwarf() {
    let _alone = memory_alone();
    let dir = tempfile::tempdir().expect("temp dir");
    let compressed = compressed_seed(dir.path(), |size| size);
    // An uncompressed DWARF section to stretch over a 1.25 GiB hole.
    let (one, image) = (dir.path().join("one"), dir.path().join("huge.so"));
    std::fs::write(&one, b"x").expect("write");
    let status = Command::new("objcopy")
        .arg(format!("--add-section=.debug_zz={}", one.display()))
        .arg(&compressed)
        .arg(&image)
        .status()
        .expect("run objcopy");
    assert!(status.success());
    let mut data = std::fs::read(&image).expect("read");
    let file = object::File::parse(&*data).expect("parse");
    let header_of = |name: &str| {
        let section = file.section_by_name(name).expect(name);
        let shoff = u64::from_le_bytes(data[40..48].try_into().expect("8 bytes")) as usize;
        (
            shoff + section.index().0 * 64,
            section.file_range().expect("in the file"),
        )
    };
    let (info_header, (start, len)) = header_of(".debug_info");
    let (zz_header, _) = header_of(".debug_zz");
    drop(file);
    // .debug_zz covers the hole; .debug_info, compressed, comes after it.
    let hole = (data.len() as u64, 5u64 << 28);
    let moved = hole.0 + hole.1;
    let content = data[start as usize..(start + len) as usize].to_vec();
    data[zz_header + 0x18..zz_header + 0x20].copy_from_slice(&hole.0.to_le_bytes());
    data[zz_header + 0x20..zz_header + 0x28].copy_from_slice(&hole.1.to_le_bytes());
    data[info_header + 0x18..info_header + 0x20].copy_from_slice(&moved.to_le_bytes());
    std::fs::write(&image, &data).expect("write");
    let file = std::fs::File::options()
        .write(true)
        .open(&image)
        .expect("open");
    std::os::unix::fs::FileExt::write_all_at(&file, &content, moved).expect("write the section");
    std::os::unix::fs::chown(&image, Some(65534), Some(65534)).expect("chown to nobody");
    let frame = malloc_frame(&image).expect("symbolized");
    assert_eq!(frame["function"], "malloc", "{frame}");
    assert!(
        frame["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("image_lib.c")),
        "{frame}"
    );
}

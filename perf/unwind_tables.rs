//! Unwind table preparation (issue 12): for libc, libstdc++, libpython and
//! the python3.11 executable, the time and the peak heap memory to compile
//! the table from the image's CFI (cold: an empty cache, so the table is
//! also written to it) and to get it again from the cache (cached: read
//! the image for its build id, read the cached rows), as memtrail does for
//! each image it meets. Medians of ROUNDS runs (default 5), side by side in
//! one process. Heap memory is counted by a global allocator wrapper.
//!
//! Run: `cargo bench --bench unwind_tables [ROUNDS]`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use memtrail::internals::unwind::{cache::Cache, prepare};

/// Counts live and peak heap bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only
// counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(live, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const IMAGES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
    "/usr/bin/python3.11",
    // clang-19's (issue 23): 2.9 M rows between them.
    "/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1",
    "/usr/lib/x86_64-linux-gnu/libclang-cpp.so.19.1",
    "/usr/lib/x86_64-linux-gnu/libz3.so.4",
];

/// One preparation: time, peak heap above the start, rows, from cache.
fn measure(image: &Path, cache: &Cache) -> (Duration, usize, usize, bool) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let start = Instant::now();
    let (table, cached) = prepare(black_box(image), Some(cache)).expect("prepares");
    let took = start.elapsed();
    let peak = PEAK.load(Relaxed) - base;
    let memtrail::internals::unwind::Compiled::Table(table) = table else {
        panic!("{} has no CFI", image.display());
    };
    let rows = table.rows.len();
    (took, peak, rows, cached)
}

fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<48} {:>8} {:>9} {:>10} {:>9} {:>10} {:>7} {:>11} {:>13}",
        "image",
        "rows",
        "cold ms",
        "cold heap",
        "cached ms",
        "cached heap",
        "ratio",
        "cold ns/row",
        "cached ns/row"
    )
    .unwrap();
    for image in IMAGES {
        let path = Path::new(image);
        if !path.exists() {
            writeln!(out, "{image:<48} (not installed)").unwrap();
            continue;
        }
        let (mut cold_t, mut cold_m, mut hot_t, mut hot_m) = (vec![], vec![], vec![], vec![]);
        let mut rows = 0;
        for _ in 0..rounds {
            let dir = tempfile::tempdir().unwrap();
            let cache = Cache::at(dir.path()).unwrap();
            let (t, m, r, cached) = measure(path, &cache);
            assert!(!cached);
            cold_t.push(t);
            cold_m.push(m);
            let (t2, m2, r2, cached) = measure(path, &cache);
            assert!(cached);
            assert_eq!(r, r2, "the cached table has the compiled one's rows");
            hot_t.push(t2);
            hot_m.push(m2);
            rows = r;
        }
        let (ct, cm, ht, hm) = (median(cold_t), median(cold_m), median(hot_t), median(hot_m));
        writeln!(
            out,
            "{image:<48} {rows:>8} {:>9.1} {:>8.1}Mi {:>9.2} {:>8.1}Mi {:>6.1}x {:>11.0} {:>13.0}",
            ct.as_secs_f64() * 1e3,
            cm as f64 / (1 << 20) as f64,
            ht.as_secs_f64() * 1e3,
            hm as f64 / (1 << 20) as f64,
            ct.as_secs_f64() / ht.as_secs_f64(),
            ct.as_secs_f64() * 1e9 / rows as f64,
            ht.as_secs_f64() * 1e9 / rows as f64
        )
        .unwrap();
    }
}

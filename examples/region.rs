//! Exact allocation counts of a piece of Rust code, through the memtrail
//! library: the process tracks itself, and a region counts the heap events
//! of the calling thread between its begin and its end (regions nest; other
//! threads' events are not counted).
//!
//! Run as root (or with memtrail's capabilities):
//! `cargo run --release --example region`. It checks that `parse` does not
//! allocate and that `collect` makes exactly one allocation, then prints
//! the second region's counts. `tests/examples.rs` runs it.

use std::error::Error;
use std::hint::black_box;
use std::io::Write;

use memtrail::{Session, SessionOptions, Target};

/// The code under test: splits a request line without allocating.
fn parse(line: &[u8]) -> usize {
    line.split(|&b| b == b' ').filter(|w| !w.is_empty()).count()
}

/// Code that allocates: one block of `n` bytes, returned to the caller.
fn collect(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    v.extend((0..n).map(|i| i as u8));
    v
}

fn main() -> Result<(), Box<dyn Error>> {
    // Tracking its own process: the pressure timeout stays 0 (the default;
    // a process cannot pause itself).
    let session = Session::start(&SessionOptions::default(), Target::SelfProcess)?;

    // "This function must not allocate": a region around it, then its counts.
    let region = session.region("parse")?;
    let words = parse(black_box(b"GET /index.html HTTP/1.1"));
    let counts = region.end()?;
    assert_eq!(words, 3);
    assert_eq!(counts.allocations, 0, "parse allocated: {counts:?}");

    // A region that allocates: exactly one block of 1000 bytes, still live
    // at the region's end (the vector is returned).
    let region = session.region("collect")?;
    let kept = black_box(collect(1000));
    let counts = region.end()?;
    assert_eq!((counts.allocations, counts.allocated_bytes), (1, 1000));
    drop(kept);

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "allocations={} frees={} allocated_bytes={} live_allocations={} live_bytes={}",
        counts.allocations,
        counts.frees,
        counts.allocated_bytes,
        counts.live_allocations,
        counts.live_bytes
    )?;
    Ok(())
}

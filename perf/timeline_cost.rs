//! What the timeline (issue 15) costs the aggregator, which folds every
//! record on the events poller: the same 4 M records (malloc/free pairs
//! from 4 threads of one process over 200 stacks, 1 µs apart: a 4 s run, so
//! the timeline coarsens 3 times) folded by an aggregator with the timeline
//! and one without, alternately, 7 rounds each; the median of each and
//! their ratio. Target: at most 2 % over no timeline.
//!
//! `cargo bench --bench timeline_cost` runs it in full; without `--bench`
//! (as `cargo test --benches` runs it) a smoke run of 40,000 records.

use std::hint::black_box;
use std::io::Write;
use std::time::Instant;

use memtrail::internals::aggregate::Aggregator;
use memtrail::internals::bpf::record::{Body, Header, Kind, Mem, Record};

fn records(n: u64) -> Vec<Record<'static>> {
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n / 2 {
        let tid = 100 + (i % 4) as u32;
        let addr = 0x1000_0000 + (i % 1024) * 64;
        let hdr = |kind, ts| Header {
            ts_ns: 1_000_000_000 + ts,
            pid: 100,
            tid,
            kind,
            in_allocator: false,
        };
        let mem = Mem {
            addr,
            size: 32 + i % 512,
            old_addr: 0,
            old_size: 0,
            stack_id: 1 + i % 200,
        };
        out.push(Record {
            hdr: hdr(Kind::Malloc, 2 * i * 1000),
            body: Body::Mem(mem),
        });
        // Free the block allocated 512 pairs ago (a live set of 512), or
        // none yet.
        out.push(Record {
            hdr: hdr(Kind::Free, (2 * i + 1) * 1000),
            body: Body::Mem(Mem {
                addr: if i >= 512 {
                    0x1000_0000 + ((i - 512) % 1024) * 64
                } else {
                    0
                },
                ..mem
            }),
        });
    }
    out
}

fn fold(mut agg: Aggregator, recs: &[Record<'_>]) -> u64 {
    let start = Instant::now();
    for r in recs {
        agg.apply(black_box(r));
    }
    agg.finish(u64::MAX / 2);
    let ns = start.elapsed().as_nanos() as u64;
    assert_eq!(agg.totals().allocations, recs.len() as u64 / 2);
    black_box(agg.timeline(0));
    ns
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (n, rounds) = if full { (4_000_000, 7) } else { (40_000, 1) };
    let recs = records(n);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        without.push(fold(Aggregator::without_timeline(), &recs));
        with.push(fold(Aggregator::new(), &recs));
    }
    let (a, b) = (median(without), median(with));
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "timeline_cost: {n} records, {rounds} rounds: without {:.1} ns/record, with {:.1} ns/record, ratio {:.4}",
        a as f64 / n as f64,
        b as f64 / n as f64,
        b as f64 / a as f64
    );
}

//! Latency of a session's exact points in time (issue 13): `snapshot()` and
//! `region_end()` each raise the pipelines' epoch barrier and wait for the
//! events pipeline to drain it. On an idle session tracking this process,
//! 10,000 calls each, back to back: median, p99 and max, against the 1 ms
//! p99 target. Side by side in the same run: `region_begin()` (the same
//! barrier round trip with no payload back: the floor the others are built
//! on) and `snapshot()` after the events poller has gone to deep sleep (100
//! calls, 30 ms apart: its epoll wakeup is in the path).
//!
//! `cargo bench --bench session_latency` (as root) runs it in full;
//! without `--bench` (as `cargo test --benches` runs it) a smoke run of 100
//! calls.

use std::hint::black_box;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use memtrail::Session;

use memtrail::SessionOptions;

use memtrail::Target;

fn percentiles(mut ns: Vec<u64>) -> (u64, u64, u64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)];
    (at(0.5), at(0.99), ns[ns.len() - 1])
}

fn time(mut f: impl FnMut()) -> u64 {
    let start = Instant::now();
    f();
    start.elapsed().as_nanos() as u64
}

fn report(out: &mut impl Write, name: &str, ns: Vec<u64>) -> u64 {
    let n = ns.len();
    let (p50, p99, max) = percentiles(ns);
    let _ = writeln!(
        out,
        "{name:<44} n={n:>6}  median {:>8.1} us  p99 {:>8.1} us  max {:>8.1} us",
        p50 as f64 / 1e3,
        p99 as f64 / 1e3,
        max as f64 / 1e3
    );
    p99
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let calls = if full { 10_000 } else { 100 };
    let idle_calls = if full { 100 } else { 5 };
    let session = Session::start(&SessionOptions::default(), Target::SelfProcess)
        .expect("a session on this process (run as root)");

    // Warm up: the first calls fault in the control structures.
    for _ in 0..10 {
        black_box(session.snapshot().expect("snapshot"));
    }
    let mut snap = Vec::with_capacity(calls);
    for _ in 0..calls {
        snap.push(time(|| {
            black_box(session.snapshot().expect("snapshot"));
        }));
    }
    let mut totals = Vec::with_capacity(calls);
    for _ in 0..calls {
        totals.push(time(|| {
            black_box(session.totals().expect("totals"));
        }));
    }
    let mut begin = Vec::with_capacity(calls);
    let mut end = Vec::with_capacity(calls);
    for _ in 0..calls {
        begin.push(time(|| session.region_begin("bench").expect("begin")));
        end.push(time(|| {
            black_box(session.region_end().expect("end"));
        }));
    }
    let mut idle = Vec::with_capacity(idle_calls);
    for _ in 0..idle_calls {
        // Long enough for the events poller to nap five times and sleep on
        // the ring's epoll (engine::idle).
        std::thread::sleep(Duration::from_millis(30));
        idle.push(time(|| {
            black_box(session.snapshot().expect("snapshot"));
        }));
    }
    let out = &mut io::stdout().lock();
    let _ = writeln!(
        out,
        "session latency (issue 13), calls back to back on an idle session:"
    );
    let p99_snap = report(out, "snapshot()", snap);
    report(out, "totals()", totals);
    report(out, "region_begin()", begin);
    let p99_end = report(out, "region_end()", end);
    report(out, "snapshot() after 30 ms idle (deep sleep)", idle);
    let _ = writeln!(
        out,
        "target p99 <= 1 ms: snapshot {} / region_end {}",
        if p99_snap <= 1_000_000 {
            "met"
        } else {
            "MISSED"
        },
        if p99_end <= 1_000_000 {
            "met"
        } else {
            "MISSED"
        }
    );
    session.finish().expect("finish");
}

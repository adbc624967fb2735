//! Producers contending for one ring (issue 17, part 1), side by side in
//! one run: BPF's `produce` program (`bpf/ringtest.bpf.c`, run with
//! `BPF_PROG_TEST_RUN`) reserves, fills and submits records
//! - on one CPU alone;
//! - on both CPUs at once into one shared ring (every reserve takes the
//!   ring's spinlock and writes its producer position: the line moves
//!   between the CPUs);
//! - on both CPUs at once, each into a ring of its own (per-CPU rings).
//!
//! Nothing consumes: the rings are large enough to hold every record. The
//! time per record of each producer, and the records per second of both
//! together, give what sharing costs (perf/RESULTS.md, "Per-CPU events
//! rings"); perf/HISTORY.md models larger machines from it (same heading).
//!
//! `cargo bench --bench ring_contention` (as root). Without `--bench` (as
//! `cargo test --benches` runs it) it does a short smoke run.

#[path = "../tests/support/ringtest.rs"]
#[allow(
    dead_code,
    reason = "shared with tests/capture/ring_consumer.rs, which uses other parts"
)]
mod ringtest;

use std::mem::MaybeUninit;
use std::sync::Barrier;
use std::time::Instant;

use ringtest::{RECORD_HEADER, RingTest, Run};

const RING: u32 = 128 << 20;

fn pin(core: usize) {
    let ids = core_affinity::get_core_ids().expect("list the cores");
    assert!(
        core_affinity::set_for_current(ids[core % ids.len()]),
        "pin to core {core}"
    );
}

/// Runs `produce` on core 0 into `rings[0]` and, if `two`, on core 1 into
/// `rings[1 % rings.len()]` at the same time. Returns ns per record of
/// each producer.
fn produce(rings: &[RingTest<'_>], two: bool, records: u32, size: u32) -> Vec<f64> {
    let producers = if two { 2 } else { 1 };
    let start = Barrier::new(producers);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..producers)
            .map(|p| {
                let ring = &rings[p % rings.len()];
                let start = &start;
                s.spawn(move || {
                    pin(p);
                    start.wait();
                    let t = Instant::now();
                    let out = ring.produce(Run::new(0, records, size));
                    let ns = t.elapsed().as_nanos() as f64;
                    assert_eq!(out.dropped, 0, "the ring was too small");
                    ns / f64::from(records)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("producer"))
            .collect()
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, records) = if full { (9, 400_000) } else { (1, 10_000) };
    if core_affinity::get_core_ids().is_none_or(|c| c.len() < 2) {
        tracing::warn!("ring_contention needs two cores");
        return;
    }
    let out = std::io::stdout();
    let mut out = out.lock();
    use std::io::Write;
    writeln!(
        out,
        "| record body | one producer | two producers, one shared ring | two producers, a ring each | shared / own |"
    )
    .expect("stdout");
    writeln!(out, "|---|---:|---:|---:|---:|").expect("stdout");
    for size in [RECORD_HEADER, 56] {
        let (mut one, mut shared, mut own) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (mut sa, mut sb) = (MaybeUninit::uninit(), MaybeUninit::uninit());
            let rings = [RingTest::load(&mut sa, RING), RingTest::load(&mut sb, RING)];
            one.extend(produce(&rings[..1], false, records, size));
            drop(rings);
            let (mut sa, mut sb) = (MaybeUninit::uninit(), MaybeUninit::uninit());
            let rings = [RingTest::load(&mut sa, RING), RingTest::load(&mut sb, RING)];
            shared.extend(produce(&rings[..1], true, records, size));
            drop(rings);
            let (mut sa, mut sb) = (MaybeUninit::uninit(), MaybeUninit::uninit());
            let rings = [RingTest::load(&mut sa, RING), RingTest::load(&mut sb, RING)];
            own.extend(produce(&rings, true, records, size));
        }
        let (one, shared, own) = (median(&mut one), median(&mut shared), median(&mut own));
        writeln!(
            out,
            "| {size} B | {one:.1} ns | {shared:.1} ns | {own:.1} ns | {:.2}x |",
            shared / own
        )
        .expect("stdout");
    }
}

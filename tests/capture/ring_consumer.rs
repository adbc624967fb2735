//! memtrail's ring consumer against a real BPF ring on the running kernel.
//!
//! Records come from `bpf/ringtest.bpf.c`, run synchronously with
//! `BPF_PROG_TEST_RUN` on the test's thread, so every record a run submits
//! is in the ring when the run returns: no test waits or sleeps. Needs root
//! (or CAP_BPF and CAP_PERFMON).

use std::mem::MaybeUninit;

use crate::support::ringtest::{
    self, RECORD_HEADER, RingTest, Run, capacity, check_record, slot_len,
};
use memtrail::internals::ring::HEADER_LEN;

/// One page: the smallest ring the kernel makes.
const SMALL_RING: u32 = 4096;

/// Collects the bodies `f` is handed.
fn bodies(f: impl FnOnce(&mut dyn FnMut(&[u8])) -> usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let handed = f(&mut |body: &[u8]| out.push(body.to_vec()));
    assert_eq!(handed, out.len(), "returned count vs records handed");
    out
}

/// Check that a consumer of a ring nothing was written to finds nothing and
/// stays at position 0.
#[test]
fn ring_empty() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    assert_eq!(ring.size(), SMALL_RING as usize);
    assert_eq!(ring.producer_pos(), 0);
    assert_eq!(ring.pending(), 0);
    assert_eq!(ring.poll(|_| panic!("record in an empty ring")), 0);
    assert_eq!(ring.drain_to(0, |_| panic!("record in an empty ring")), 0);
    assert_eq!(ring.position(), 0);
    assert_eq!(rt.drops(), 0);
}

/// Check that one submitted record is handed out once, whole, and moves
/// the position by its padded length.
#[test]
fn ring_one_record() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let out = rt.produce(Run::new(7, 1, RECORD_HEADER));
    assert_eq!((out.submitted, out.dropped), (1, 0));
    assert_eq!(ring.pending(), slot_len(RECORD_HEADER));

    let got = bodies(|f| ring.poll(f));
    assert_eq!(got.len(), 1);
    check_record(&got[0], 7, RECORD_HEADER);
    assert_eq!(ring.position(), slot_len(RECORD_HEADER));
    assert_eq!(ring.pending(), 0);
    assert_eq!(ring.poll(|_| panic!("record handed twice")), 0);
}

/// Check that records of every padding class come out in order with their
/// exact bytes.
#[test]
fn ring_exact_contents_in_order() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, 1 << 16);
    let mut ring = rt.consumer();
    // Every remainder mod 8, a record of exactly the header, and a large one.
    let sizes = [24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 57, 100, 1000, 4096];
    let mut seq = 0;
    let mut expected = Vec::new();
    for size in sizes {
        let out = rt.produce(Run::new(seq, 3, size));
        assert_eq!((out.submitted, out.dropped), (3, 0));
        expected.extend((seq..seq + 3).map(|s| (s, size)));
        seq += 3;
    }
    let bytes: u64 = expected.iter().map(|&(_, size)| slot_len(size)).sum();
    assert_eq!(ring.pending(), bytes);

    let got = bodies(|f| ring.poll(f));
    assert_eq!(got.len(), expected.len());
    let mut last_ts = 0;
    for (body, &(seq, size)) in got.iter().zip(&expected) {
        let ts = check_record(body, seq, size);
        assert!(ts >= last_ts, "timestamps go back at record {seq}");
        last_ts = ts;
    }
    assert_eq!(ring.position(), bytes);
}

/// Check that runs of one length, the consumer's fast path (it takes a
/// group of records at a time while their headers repeat), hand out every
/// record when the length changes at any offset within a group, and when
/// discarded records break a run.
#[test]
fn ring_runs_of_one_length_any_break() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, 1 << 16);
    let mut ring = rt.consumer();
    let mut seq = 0;
    let mut expected = Vec::new();
    // Run lengths 1..=19 cover every break offset within groups of up to
    // 16; two sizes with different padded lengths alternate, then the same
    // runs again with every fifth record discarded.
    for discard_every in [0, 5] {
        for run_len in 1..=19u32 {
            let size = if run_len % 2 == 0 { 40 } else { 51 };
            let out = rt.produce(Run {
                discard_every,
                ..Run::new(seq, run_len, size)
            });
            assert_eq!(out.dropped, 0);
            let kept = (seq..seq + u64::from(run_len))
                .filter(|s| discard_every == 0 || s % u64::from(discard_every) != 4);
            expected.extend(kept.map(|s| (s, size)));
            seq += u64::from(run_len);
        }
    }
    let got = bodies(|f| ring.poll(f));
    assert_eq!(got.len(), expected.len());
    for (body, &(seq, size)) in got.iter().zip(&expected) {
        check_record(body, seq, size);
    }
    assert_eq!(ring.pending(), 0);
}

/// Check that records straddling the end of the data area come out
/// contiguous and byte-exact, lap after lap.
#[test]
fn ring_wrap_around() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let ring_size = u64::from(SMALL_RING);
    // 101 body bytes take 112: 4096 is not a multiple, so records land at
    // every offset class relative to the end of the ring.
    let size = 101;
    let slot = slot_len(size);
    let per_batch = 9;
    let mut seq = 0;
    let mut straddled = 0;
    while ring.position() < 5 * ring_size {
        let start = ring.position();
        let out = rt.produce(Run::new(seq, per_batch, size));
        assert_eq!((out.submitted, out.dropped), (per_batch, 0));
        let got = bodies(|f| ring.poll(f));
        assert_eq!(got.len(), per_batch as usize);
        for (i, body) in got.iter().enumerate() {
            check_record(body, seq + i as u64, size);
            // The body starts after the header; it straddles when it
            // begins in one lap and ends in the next.
            let body_start = start + i as u64 * slot + HEADER_LEN as u64;
            let body_end = body_start + u64::from(size);
            if body_start / ring_size != (body_end - 1) / ring_size {
                straddled += 1;
            }
        }
        seq += u64::from(per_batch);
        assert_eq!(ring.position(), start + u64::from(per_batch) * slot);
    }
    assert!(straddled >= 4, "only {straddled} records straddled the end");
    assert_eq!(rt.drops(), 0);
}

/// Check that discarded records are skipped, yet their space is consumed.
#[test]
fn ring_discarded_records_skipped() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let size = 40;
    let run = Run {
        discard_every: 3,
        ..Run::new(0, 20, size)
    };
    let out = rt.produce(run);
    // Sequence numbers 2, 5, 8, 11, 14 and 17 are discarded.
    assert_eq!((out.submitted, out.discarded, out.dropped), (14, 6, 0));

    let got = bodies(|f| ring.poll(f));
    let kept: Vec<u64> = (0..20).filter(|s| s % 3 != 2).collect();
    assert_eq!(got.len(), kept.len());
    for (body, &seq) in got.iter().zip(&kept) {
        check_record(body, seq, size);
    }
    assert_eq!(ring.position(), 20 * slot_len(size));
    assert_eq!(ring.pending(), 0);
}

/// Check that a ring of only discarded records hands nothing out and still
/// returns all their space.
#[test]
fn ring_only_discarded_records() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let run = Run {
        discard_every: 1,
        ..Run::new(0, 10, RECORD_HEADER)
    };
    assert_eq!(rt.produce(run).discarded, 10);
    assert_eq!(ring.poll(|_| panic!("discarded record handed out")), 0);
    assert_eq!(ring.position(), 10 * slot_len(RECORD_HEADER));
}

/// Check that a full ring drops exactly the records past its capacity,
/// counts each drop once, and still hands out every record it took.
#[test]
fn ring_full_drops_counted_exactly() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let size = RECORD_HEADER;
    let cap = capacity(SMALL_RING, size);
    let extra = 5;
    let out = rt.produce(Run::new(0, cap as u32 + extra, size));
    assert_eq!(u64::from(out.submitted), cap);
    assert_eq!(out.dropped, extra);
    assert_eq!(rt.drops(), u64::from(extra));

    let got = bodies(|f| ring.poll(f));
    assert_eq!(got.len() as u64, cap);
    for (seq, body) in got.iter().enumerate() {
        check_record(body, seq as u64, size);
    }
    assert_eq!(rt.drops(), u64::from(extra));
}

/// Check that capacity-1 records fit, the capacity-th fits, and only the
/// one after it drops.
#[test]
fn ring_capacity_minus_one() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let size = 56;
    let cap = capacity(SMALL_RING, size) as u32;
    assert_eq!(rt.produce(Run::new(0, cap - 1, size)).dropped, 0);
    assert_eq!(rt.produce(Run::new(u64::from(cap) - 1, 1, size)).dropped, 0);
    assert_eq!(rt.produce(Run::new(u64::from(cap), 1, size)).dropped, 1);
    assert_eq!(rt.drops(), 1);

    let got = bodies(|f| ring.poll(f));
    assert_eq!(got.len(), cap as usize);
    for (seq, body) in got.iter().enumerate() {
        check_record(body, seq as u64, size);
    }
}

/// Check that drain_to hands out exactly the records below its target,
/// skipping discarded ones, and leaves the rest for the next poll.
#[test]
fn ring_drain_to_stops_at_target() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let size = 48;
    let run = Run {
        discard_every: 4,
        ..Run::new(0, 10, size)
    };
    rt.produce(run);
    let target = ring.producer_pos();
    assert_eq!(target, 10 * slot_len(size));
    rt.produce(Run::new(10, 5, size));

    // Sequence numbers 3 and 7 were discarded.
    let got = bodies(|f| ring.drain_to(target, f));
    assert_eq!(got.len(), 8);
    for (body, seq) in got.iter().zip((0..10).filter(|s| s % 4 != 3)) {
        check_record(body, seq, size);
    }
    assert_eq!(ring.position(), target);
    assert_eq!(ring.drain_to(target, |_| panic!("drained past target")), 0);

    let got = bodies(|f| ring.poll(f));
    assert_eq!(got.len(), 5);
    for (body, seq) in got.iter().zip(10..) {
        check_record(body, seq, size);
    }
}

/// Check that poll publishes the consumer position: a second consumer
/// starts there, and the producer gets the whole ring back.
#[test]
fn ring_consumer_pos_published() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let size = RECORD_HEADER;
    let cap = capacity(SMALL_RING, size) as u32;
    for lap in 0..3 {
        let seq = u64::from(lap * cap);
        let out = rt.produce(Run::new(seq, cap, size));
        assert_eq!((out.submitted, out.dropped), (cap, 0), "lap {lap}");
        let got = bodies(|f| ring.poll(f));
        assert_eq!(got.len(), cap as usize);
        check_record(&got[0], seq, size);
        // `new` reads the consumer position the kernel sees.
        assert_eq!(rt.consumer().position(), ring.position());
    }
    assert_eq!(rt.drops(), 0);
}

/// Check that a long poll gives space back before it ends, so a producer
/// running during the batch finds room in a ring that was full.
#[test]
fn ring_space_returned_within_long_poll() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, 1 << 16);
    let mut ring = rt.consumer();
    let size = RECORD_HEADER;
    let cap = capacity(rt.ring_size(), size) as u32;
    assert_eq!(rt.produce(Run::new(0, cap, size)).dropped, 0);
    assert_eq!(rt.produce(Run::new(u64::from(cap), 1, size)).dropped, 1);

    // Halfway through the batch, more than an eighth of the ring has been
    // consumed: the consumer must have published some of it.
    let halfway = cap / 2;
    let extra = 4;
    let mut seen = Vec::new();
    let handed = ring.poll(|body| {
        seen.push(ringtest::header(body).seq);
        if seen.len() == halfway as usize {
            let out = rt.produce(Run::new(u64::from(cap), extra, size));
            assert_eq!(out.dropped, 0, "no space given back mid-batch");
        }
    });
    // The records made mid-batch come out in the same poll, in order.
    assert_eq!(handed, (cap + extra) as usize);
    let want: Vec<u64> = (0..u64::from(cap + extra)).collect();
    assert_eq!(seen, want);
    assert_eq!(rt.drops(), 1);
}

/// Check that the high-water mark is the largest fill the consumer found:
/// three records, then (after they were consumed) a full ring, then one.
#[test]
fn ring_high_water_is_largest_fill_seen() {
    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    let mut ring = rt.consumer();
    let size = RECORD_HEADER;
    assert_eq!(ring.high_water(), 0);
    rt.produce(Run::new(0, 3, size));
    assert_eq!(ring.poll(|_| {}), 3);
    assert_eq!(ring.high_water(), 3 * slot_len(size));

    let cap = capacity(SMALL_RING, size);
    assert_eq!(rt.produce(Run::new(3, cap as u32, size)).dropped, 0);
    let target = ring.producer_pos();
    assert_eq!(ring.drain_to(target, |_| {}) as u64, cap);
    assert_eq!(ring.high_water(), cap * slot_len(size));

    rt.produce(Run::new(3 + cap, 1, size));
    assert_eq!(ring.poll(|_| {}), 1);
    assert_eq!(
        ring.high_water(),
        cap * slot_len(size),
        "a later, lower fill"
    );
}

//! Clock readings of allocator events: a thread reads the clock for its
//! first 16 allocator events in each kernel tick and every 16th after; an
//! event that skips it takes the latest reading before it in the ring.
//! (Neither rule can make sparse events skip: a thread past its first 16
//! events of a tick still reads the clock in the next tick.)

use crate::support::{self, capture, cmd, kind, num, of_pid, stream_root};
use serde_json::Value;

const SPARSE: usize = 4;
const SPARSE_SIZE: u64 = 33331;
const DENSE: usize = 1000;
const DENSE_SIZE: u64 = 33337;
/// The fixture sleeps at least this long before each sparse call.
const SLEEP_NS: u64 = 5_000_000;

/// Check that sparse calls each carry their own reading (at least the
/// fixture's sleep apart), that no event is left without a stamp, and that
/// the stamps of a thread never go back in stream order, through the dense
/// loop's skipped readings too. (With the preload shim a thread's frees
/// are recorded together with its next call, or at its end: the sparse
/// frees, the last calls, share one reading, not before the last malloc's.)
#[test]
fn track_clock_sparse_events_read_it_dense_ones_stay_ordered() {
    let run = capture(&cmd("clock", &[]));
    run.expect_code(0);
    let events = run.events();
    let root = stream_root(events);
    let ours = of_pid(events, root);

    let sparse_addrs: Vec<u64> = ours
        .iter()
        .filter(|e| kind(e) == "malloc" && num(e, "size") == SPARSE_SIZE)
        .map(|e| num(e, "addr"))
        .collect();
    assert_eq!(sparse_addrs.len(), SPARSE, "sparse mallocs");
    // The sparse blocks may reuse the dense loop's addresses: the sparse
    // frees are those after the first sparse malloc.
    let sparse_start = ours
        .iter()
        .position(|e| kind(e) == "malloc" && num(e, "size") == SPARSE_SIZE)
        .expect("the sparse mallocs");
    let sparse: Vec<&&Value> = ours[sparse_start..]
        .iter()
        .filter(|e| {
            (kind(e) == "malloc" && num(e, "size") == SPARSE_SIZE)
                || (kind(e) == "free" && sparse_addrs.contains(&num(e, "addr")))
        })
        .collect();
    assert_eq!(sparse.len(), 2 * SPARSE, "sparse mallocs and frees");
    let spaced = if support::preload() {
        &sparse[..=SPARSE]
    } else {
        &sparse[..]
    };
    for pair in spaced.windows(2) {
        let (a, b) = (num(pair[0], "ts_ns"), num(pair[1], "ts_ns"));
        assert!(
            b >= a + SLEEP_NS,
            "sparse events {a} and {b} are less than the sleep apart: {pair:?}"
        );
    }

    let dense = ours
        .iter()
        .filter(|e| kind(e) == "malloc" && num(e, "size") == DENSE_SIZE)
        .count();
    assert_eq!(dense, DENSE, "dense mallocs");

    let mut last = 0;
    for e in &ours {
        let ts = num(e, "ts_ns");
        assert_ne!(ts, 0, "event without a stamp: {e}");
        assert!(ts >= last, "stamp went back from {last}: {e}");
        last = ts;
    }
}

//! Tracking starts at the command's first instruction: allocations made by a
//! constructor before main are seen.

use crate::support::{Counters, allocator_events, capture, cmd, field, kind, num, stream_root};

/// Check that allocations in an `__attribute__((constructor))` function,
/// before main, are recorded and counted like main's.
#[test]
fn track_constructor_allocations_before_main() {
    let run = capture(&cmd("ctor", &[]));
    run.expect_code(0);
    let events = run.events();
    let seq = allocator_events(events, stream_root(events));
    let got: Vec<(&str, u64)> = seq
        .iter()
        .map(|e| (kind(e), if kind(e) == "free" { 0 } else { num(e, "size") }))
        .collect();
    assert_eq!(
        got,
        [
            ("malloc", 300007),
            ("malloc", 300017),
            ("free", 0),
            ("malloc", 300029),
            ("free", 0),
        ]
    );
    assert_eq!(num(seq[2], "addr"), num(seq[1], "addr"));
    assert_eq!(num(seq[4], "addr"), num(seq[3], "addr"));

    let totals = Counters::of(field(run.profile(), "totals"));
    assert_eq!(
        totals,
        Counters {
            allocations: 3,
            frees: 2,
            reallocs: 0,
            allocated_bytes: 300007 + 300017 + 300029,
            freed_bytes: 300017 + 300029,
            peak_live_bytes: 300007 + 300029,
            live_bytes_at_exit: 300007,
            live_allocations_at_exit: 1,
            unmatched_frees: 0,
        }
    );
}

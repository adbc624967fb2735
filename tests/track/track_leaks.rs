//! Leaks and peaks: live bytes at exit and the highest live total, exactly.

use crate::support::{Counters, capture, cmd, field, kind, num, of_pid, process, stream_root};

/// Check that blocks never freed are exactly `live_bytes_at_exit` and
/// `live_allocations_at_exit`, including a realloc'd block and a
/// posix_memalign block.
#[test]
fn track_leaks_live_at_exit_exact() {
    let run = capture(&cmd("leaks", &[]));
    run.expect_code(0);
    let big_leaks: u64 = 800011 + 2 * 400009 + 800051 + 800057;
    let small_leaks: u64 = 100 * 811;
    let expected = Counters {
        allocations: 6 + 100,
        frees: 1,
        reallocs: 1,
        allocated_bytes: 800011 + 800023 + 2 * 400009 + 800029 + 800051 + 800057 + small_leaks,
        freed_bytes: 800023 + 800029,
        // Live only grows at the end, so the peak is what leaks.
        peak_live_bytes: big_leaks + small_leaks,
        live_bytes_at_exit: big_leaks + small_leaks,
        live_allocations_at_exit: 4 + 100,
        unmatched_frees: 0,
    };
    let profile = run.profile();
    assert_eq!(Counters::of(field(profile, "totals")), expected);
    let events = run.events();
    let root = stream_root(events);
    assert_eq!(Counters::of(process(profile, root)), expected);

    let grown: Vec<_> = of_pid(events, root)
        .into_iter()
        .filter(|e| kind(e) == "realloc")
        .collect();
    assert_eq!(grown.len(), 1, "{grown:?}");
    assert_eq!(num(grown[0], "size"), 800051);

    // Without pressure, the pollers keep the high-water marks: the events
    // poller read every record from the ring, so it saw at least one
    // (8-byte header, 56-byte body) in it.
    let events_high = num(&profile["pressure"]["high_water"], "events");
    assert!((64..=64 << 20).contains(&events_high), "{events_high}");
}

/// Check that `peak_live_bytes` is the highest live total (B + C, after A was
/// freed), not the sum of everything, and that a realloc moves live bytes
/// from the old size to the new one.
#[test]
fn track_peak_live_bytes_exact() {
    let run = capture(&cmd("peak", &[]));
    run.expect_code(0);
    let expected = Counters {
        allocations: 5,
        frees: 3,
        reallocs: 1,
        allocated_bytes: 1000003 + 2000003 + 1500007 + 2500009 + 10007,
        freed_bytes: 1000003 + 2000003 + 1500007 + 2500009,
        peak_live_bytes: 2000003 + 1500007,
        live_bytes_at_exit: 10007,
        live_allocations_at_exit: 1,
        unmatched_frees: 0,
    };
    let profile = run.profile();
    let totals = field(profile, "totals");
    assert_eq!(Counters::of(totals), expected);
    let root = stream_root(run.events());
    let entry = process(profile, root);
    assert_eq!(Counters::of(entry), expected);
    // The peak was reached while the process ran.
    let at = num(entry, "peak_live_at_ns");
    assert!(
        num(entry, "start_ns") <= at && at <= num(entry, "end_ns"),
        "{entry}"
    );
    assert_eq!(num(totals, "peak_live_at_ns"), at);
}

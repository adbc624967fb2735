//! C++ operator new/delete: libstdc++ forwards them to malloc/free, so they
//! are malloc and free events of the sizes asked, each counted once.

use crate::support::{
    self, Counters, allocator_events, capture, cmd, field, kind, num, stream_root,
};

/// libstdc++'s emergency exception pool, malloc'd at load time and never
/// freed: measured by running `cxx_baseline`, which links the same
/// libraries and does nothing.
fn runtime_counters() -> Counters {
    let run = capture(&cmd("cxx_baseline", &[]));
    run.expect_code(0);
    Counters::of(field(run.profile(), "totals"))
}

/// Check that new, delete, new[], delete[], operator new and nothrow new[]
/// are malloc and free events with the sizes asked, in program order.
#[test]
fn track_cxx_new_delete_are_malloc_free() {
    let run = capture(&cmd("cxx", &[]));
    run.expect_code(0);
    main_calls_are_malloc_free(run.events());
}

/// The same without stacks (`--stack-depth 0`), where libstdc++'s operator
/// new gets no probe (issue 22: it only counted its own hits; the malloc it
/// calls makes the record): every call still one malloc or free, and the
/// profile lists no libstdc++ probe.
#[test]
fn track_cxx_no_stacks_new_unprobed() {
    let run = support::capture_flags(&["--stack-depth", "0"], &cmd("cxx", &[]), b"", &[]);
    run.expect_code(0);
    main_calls_are_malloc_free(run.events());
    let probes = field(run.profile(), "probes").as_array().expect("probes");
    let cxx: Vec<_> = probes
        .iter()
        .filter(|p| p["image"].as_str().is_some_and(|i| i.contains("libstdc++")))
        .collect();
    assert!(cxx.is_empty(), "libstdc++ probed: {cxx:?}");
    // With the preload shim, malloc comes through it, not a probe.
    if !support::preload() {
        assert!(
            probes.iter().any(|p| p["symbol"] == "malloc"),
            "malloc unprobed: {probes:?}"
        );
    }
}

fn main_calls_are_malloc_free(events: &[serde_json::Value]) {
    let seq = allocator_events(events, stream_root(events));
    // Skip what the C++ runtime allocated before main (see
    // runtime_counters); main's calls come last.
    let main_calls = &seq[seq.len().saturating_sub(6)..];
    let got: Vec<(&str, u64)> = main_calls
        .iter()
        .map(|e| {
            (
                kind(e),
                if kind(e) == "free" {
                    num(e, "addr")
                } else {
                    num(e, "size")
                },
            )
        })
        .collect();
    let new_big = num(main_calls[0], "addr");
    let new_array = num(main_calls[2], "addr");
    assert_eq!(
        got,
        [
            ("malloc", 200009),
            ("free", new_big),
            ("malloc", 200003),
            ("free", new_array),
            ("malloc", 200017),
            ("malloc", 200029),
        ]
    );
    for size in [200009, 200003, 200017, 200029] {
        let n = events
            .iter()
            .filter(|e| kind(e) != "free" && e.get("size").and_then(|s| s.as_u64()) == Some(size))
            .filter(|e| support::ALLOC_KINDS.contains(&kind(e)))
            .count();
        assert_eq!(n, 1, "allocator events of {size} bytes");
    }
}

/// Check that the C++ fixture's profile is the runtime's own allocations
/// plus exactly 4 allocations and 2 frees, with 400046 bytes leaked.
#[test]
fn track_cxx_profile_counters_exact() {
    let base = runtime_counters();
    let run = capture(&cmd("cxx", &[]));
    run.expect_code(0);
    let totals = Counters::of(field(run.profile(), "totals"));
    let expected = Counters {
        allocations: base.allocations + 4,
        frees: base.frees + 2,
        reallocs: base.reallocs,
        allocated_bytes: base.allocated_bytes + 200009 + 200003 + 200017 + 200029,
        freed_bytes: base.freed_bytes + 200009 + 200003,
        // The runtime's blocks stay live; then one block at a time until
        // the two leaks.
        peak_live_bytes: base.live_bytes_at_exit + 200017 + 200029,
        live_bytes_at_exit: base.live_bytes_at_exit + 200017 + 200029,
        live_allocations_at_exit: base.live_allocations_at_exit + 2,
        unmatched_frees: base.unmatched_frees,
    };
    assert_eq!(totals, expected, "runtime alone: {base:?}");
}

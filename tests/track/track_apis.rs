//! Every allocator entry point, counted once each, with exact sizes.
//!
//! `tests/fixtures/apis.c` calls each API once with a distinctive size and
//! frees everything; its run is shared by the tests below, each checking one
//! behaviour. The fixture makes no other allocator call (glibc 2.36 makes
//! none before main or at exit in a stdio-free program: checked with
//! `valgrind --trace-malloc=yes` and ftrace uprobes on libc), so the whole
//! allocator event sequence of the process is known.

use std::sync::OnceLock;

use crate::support::{
    self, Capture, Counters, allocator_events, capture, cmd, kind, num, of_pid, sized,
};
use serde_json::Value;

/// The allocator calls of apis.c in order: (kind, size); `free` has no size.
const SEQUENCE: &[(&str, Option<u64>)] = &[
    ("malloc", Some(100003)),
    ("free", None),
    ("calloc", Some(100041)),
    ("free", None),
    ("realloc", Some(100019)),
    ("realloc", Some(100043)),
    ("free", None),
    ("reallocarray", Some(100059)),
    ("reallocarray", Some(100121)),
    ("free", None),
    // aligned_alloc(64, 100069): glibc < 2.38 exports it as memalign.
    ("memalign", Some(100069)),
    ("free", None),
    ("memalign", Some(100103)),
    ("free", None),
    ("memalign", Some(100109)),
    ("free", None),
    ("posix_memalign", Some(100129)),
    ("free", None),
    ("valloc", Some(100151)),
    ("free", None),
    ("pvalloc", Some(100153)),
    ("free", None),
    ("malloc", Some(0)),
    ("free", None),
];

fn apis() -> &'static Capture {
    static RUN: OnceLock<Capture> = OnceLock::new();
    RUN.get_or_init(|| {
        let run = capture(&cmd("apis", &[]));
        run.expect_code(0);
        run
    })
}

fn root() -> u32 {
    support::stream_root(apis().events())
}

/// The allocator events of the apis fixture.
fn sequence() -> Vec<&'static Value> {
    allocator_events(apis().events(), root())
}

/// The one event of `kind` with `size`.
fn only(kind: &str, size: u64) -> &'static Value {
    let found = sized(apis().events(), kind, size);
    assert_eq!(found.len(), 1, "{kind} events of {size} bytes: {found:?}");
    found[0]
}

/// `events` as (kind, size), `free` without a size.
fn kinds_and_sizes<'a>(events: &[&'a Value]) -> Vec<(&'a str, Option<u64>)> {
    events
        .iter()
        .map(|e| {
            let size = if kind(e) == "free" {
                None
            } else {
                Some(num(e, "size"))
            };
            (kind(e), size)
        })
        .collect()
}

/// Check that the apis fixture's allocator events are exactly its calls, in
/// program order, with their sizes.
#[test]
fn track_api_event_sequence_exact() {
    assert_eq!(kinds_and_sizes(&sequence()), SEQUENCE);
}

/// Check that the split allocator programs (kernels before 6.13 have no
/// uprobe sessions: `alloc_enter`, `alloc_return` and `free_enter`, a link
/// each) record the same calls, as `MEMTRAIL_UPROBE_SESSION=0` makes this
/// kernel use them.
#[test]
fn track_api_split_programs_same_sequence() {
    let run = support::capture_env(&cmd("apis", &[]), b"", &[("MEMTRAIL_UPROBE_SESSION", "0")]);
    run.expect_code(0);
    let root = support::stream_root(run.events());
    assert_eq!(
        kinds_and_sizes(&allocator_events(run.events(), root)),
        SEQUENCE
    );
}

/// Check that every free's address is the block the previous call returned,
/// and every realloc's `old_addr` the block it resized.
#[test]
fn track_api_addresses_link_up() {
    let seq = sequence();
    assert_eq!(seq.len(), SEQUENCE.len(), "{seq:?}");
    let mut live: Option<u64> = None;
    for e in &seq {
        match kind(e) {
            "free" => {
                assert_eq!(Some(num(e, "addr")), live, "free of the live block: {e}");
                live = None;
            }
            "realloc" | "reallocarray" => {
                assert_eq!(num(e, "old_addr"), live.unwrap_or(0), "old_addr: {e}");
                assert_ne!(num(e, "addr"), 0, "{e}");
                live = Some(num(e, "addr"));
            }
            _ => {
                assert_eq!(live, None, "one block at a time: {e}");
                assert_ne!(num(e, "addr"), 0, "{e}");
                live = Some(num(e, "addr"));
            }
        }
    }
    assert_eq!(live, None);
}

/// Check that malloc is recorded with its size and result, and its free.
#[test]
fn track_malloc_and_free_recorded() {
    let m = only("malloc", 100003);
    let frees: Vec<&Value> = of_pid(apis().events(), root())
        .into_iter()
        .filter(|e| kind(e) == "free" && num(e, "addr") == num(m, "addr"))
        .collect();
    assert!(!frees.is_empty(), "no free of {m}");
}

/// Check that calloc is one calloc event of n*m bytes and no malloc.
#[test]
fn track_calloc_counted_once() {
    only("calloc", 100041);
    assert!(sized(apis().events(), "malloc", 100041).is_empty());
}

/// Check that realloc(NULL, n) is one realloc event with `old_addr` 0 and
/// not also the malloc glibc makes inside it.
#[test]
fn track_realloc_null_counted_once() {
    let e = only("realloc", 100019);
    assert_eq!(num(e, "old_addr"), 0, "{e}");
    assert!(sized(apis().events(), "malloc", 100019).is_empty());
}

/// Check that a growing realloc is one realloc event carrying the old block.
#[test]
fn track_realloc_grow_records_old_addr() {
    let first = only("realloc", 100019);
    let grown = only("realloc", 100043);
    assert_eq!(num(grown, "old_addr"), num(first, "addr"));
    assert!(sized(apis().events(), "malloc", 100043).is_empty());
}

/// Check that reallocarray is one reallocarray event of n*m bytes, not also
/// the realloc (and malloc) glibc makes inside it.
#[test]
fn track_reallocarray_counted_once() {
    let first = only("reallocarray", 100059);
    let grown = only("reallocarray", 100121);
    assert_eq!(num(first, "old_addr"), 0);
    assert_eq!(num(grown, "old_addr"), num(first, "addr"));
    for size in [100059, 100121] {
        assert!(sized(apis().events(), "realloc", size).is_empty());
        assert!(sized(apis().events(), "malloc", size).is_empty());
    }
}

/// Check that aligned_alloc is one event, reported as memalign (glibc before
/// 2.38 exports aligned_alloc as an alias of memalign), and aligned.
#[test]
fn track_aligned_alloc_reported_as_memalign() {
    let e = only("memalign", 100069);
    assert_eq!(num(e, "addr") % 64, 0, "{e}");
    assert!(sized(apis().events(), "aligned_alloc", 100069).is_empty());
}

/// Check that memalign with an alignment malloc already gives, which glibc
/// forwards to malloc, is one memalign event.
#[test]
fn track_memalign_small_alignment_counted_once() {
    only("memalign", 100103);
    assert!(sized(apis().events(), "malloc", 100103).is_empty());
}

/// Check that a page-aligned memalign is recorded with its result.
#[test]
fn track_memalign_page_alignment_recorded() {
    let e = only("memalign", 100109);
    assert_eq!(num(e, "addr") % 4096, 0, "{e}");
}

/// Check that posix_memalign records the block it stored through its
/// pointer argument.
#[test]
fn track_posix_memalign_records_result() {
    let e = only("posix_memalign", 100129);
    assert_ne!(num(e, "addr"), 0, "{e}");
    assert_eq!(num(e, "addr") % 256, 0, "{e}");
}

/// Check that valloc and pvalloc record the size asked for (pvalloc rounds
/// the block up to a page, not the recorded size).
#[test]
fn track_valloc_pvalloc_record_asked_size() {
    for (k, size) in [("valloc", 100151), ("pvalloc", 100153)] {
        let e = only(k, size);
        assert_eq!(num(e, "addr") % 4096, 0, "{e}");
    }
}

/// Check that free(NULL) makes no event: exactly one free per freed block.
#[test]
fn track_free_null_not_recorded() {
    let frees = sequence()
        .iter()
        .filter(|e| kind(e) == "free")
        .inspect(|e| assert_ne!(num(e, "addr"), 0, "free(NULL) recorded: {e}"))
        .count();
    assert_eq!(frees, 11);
}

/// Check that malloc(0) returning a pointer counts, with 0 bytes.
#[test]
fn track_malloc_zero_counted() {
    let e = only("malloc", 0);
    assert_ne!(num(e, "addr"), 0, "{e}");
}

/// Check that the profile's totals and process entry for the apis fixture
/// are exact: 13 allocations (4 of them reallocs), 11 frees, everything
/// freed, and the peak is the largest single block (one block is live at a time; a realloc
/// releases the old block before the new one counts).
#[test]
fn track_api_profile_counters_exact() {
    let run = apis();
    let profile = run.profile();
    let sizes: Vec<u64> = SEQUENCE.iter().filter_map(|&(_, s)| s).collect();
    let total: u64 = sizes.iter().sum();
    let expected = Counters {
        allocations: 13,
        frees: 11,
        reallocs: 4,
        allocated_bytes: total,
        freed_bytes: total,
        peak_live_bytes: 100153,
        live_bytes_at_exit: 0,
        live_allocations_at_exit: 0,
        unmatched_frees: 0,
    };
    assert_eq!(Counters::of(support::field(profile, "totals")), expected);
    let procs = support::processes(profile);
    assert_eq!(procs.len(), 1, "{procs:?}");
    let entry = support::process(profile, root());
    assert_eq!(Counters::of(entry), expected);
}

/// Check that the profile's header is right: format, version, command,
/// exit, lost events, and the process's exe, parent and times.
#[test]
fn track_api_profile_header() {
    let run = apis();
    let profile = run.profile();
    let exe = support::fixture("apis");
    assert_eq!(support::string(profile, "format"), "memtrail-profile");
    assert_eq!(num(profile, "version"), 3);
    assert_eq!(
        support::field(profile, "command"),
        &serde_json::json!([support::path_str(&exe)])
    );
    assert_eq!(
        support::field(profile, "exit"),
        &serde_json::json!({ "code": 0, "signal": null })
    );
    let lost = support::field(profile, "lost_events");
    assert_eq!((num(lost, "events"), num(lost, "tracking")), (0, 0));
    let entry = support::process(profile, root());
    assert_eq!(support::string(entry, "exe"), support::path_str(&exe));
    assert_eq!(support::int(entry, "exit_code"), 0);
    assert_eq!(
        num(entry, "ppid"),
        u64::from(run.memtrail_pid),
        "the command is memtrail's child"
    );
    assert!(num(entry, "start_ns") <= num(entry, "end_ns"), "{entry}");
    assert!(
        num(entry, "end_ns") <= num(profile, "duration_ns"),
        "{profile}"
    );
}

/// Check that the profile lists a libc probe for every allocator entry
/// point (with the preload shim: none, and the process preloaded).
#[test]
fn track_profile_lists_libc_probes() {
    let profile = apis().profile();
    let probes = support::field(profile, "probes")
        .as_array()
        .expect("probes is an array");
    if support::preload() {
        let libc_hit = |p: &&serde_json::Value| {
            p["image"].as_str().is_some_and(|i| i.contains("libc.so.6"))
                && p["hits"].as_u64().is_some_and(|h| h > 0)
                && ["malloc", "free"].contains(&p["symbol"].as_str().unwrap_or(""))
        };
        let hit: Vec<_> = probes.iter().filter(libc_hit).collect();
        assert!(
            hit.is_empty(),
            "libc's allocator probed with the shim: {hit:?}"
        );
        assert_eq!(support::root_process(profile)["preloaded"], true);
        return;
    }
    for symbol in [
        "malloc",
        "calloc",
        "realloc",
        "reallocarray",
        "memalign",
        "posix_memalign",
        "valloc",
        "pvalloc",
        "free",
    ] {
        assert!(
            probes.iter().any(|p| support::string(p, "symbol") == symbol
                && support::string(p, "image").contains("libc.so.6")),
            "no libc probe for {symbol}: {probes:?}"
        );
    }
}

/// Check that realloc(p, 0) is one realloc event (result 0, old block p) and
/// no free event, and that it releases the block in the profile.
#[test]
fn track_realloc_zero_frees_once() {
    let run = capture(&cmd("realloc_zero", &[]));
    run.expect_code(0);
    let events = run.events();
    let root = support::stream_root(events);
    let seq = allocator_events(events, root);
    assert_eq!(seq.len(), 2, "{seq:?}");
    assert_eq!((kind(seq[0]), num(seq[0], "size")), ("malloc", 100207));
    assert_eq!(kind(seq[1]), "realloc", "{:?}", seq[1]);
    assert_eq!(num(seq[1], "addr"), 0);
    assert_eq!(num(seq[1], "size"), 0);
    assert_eq!(num(seq[1], "old_addr"), num(seq[0], "addr"));

    let totals = Counters::of(support::field(run.profile(), "totals"));
    // realloc(p, 0) returns no memory: not an allocation, and not a
    // free(p) call either; it releases the block's bytes.
    assert_eq!(totals.allocations, 1, "{totals:?}");
    assert_eq!(totals.frees, 0, "{totals:?}");
    assert_eq!(totals.allocated_bytes, 100207, "{totals:?}");
    assert_eq!(totals.freed_bytes, 100207, "{totals:?}");
    assert_eq!(totals.peak_live_bytes, 100207, "{totals:?}");
    assert_eq!(totals.live_bytes_at_exit, 0, "{totals:?}");
    assert_eq!(totals.live_allocations_at_exit, 0, "{totals:?}");
    assert_eq!(totals.unmatched_frees, 0, "{totals:?}");
}

/// Check that a stdio-free C program makes no allocator call of its own,
/// the premise of the exact counts in the other tests.
#[test]
fn track_baseline_makes_no_allocator_call() {
    let run = capture(&cmd("baseline", &[]));
    run.expect_code(0);
    let events = run.events();
    let root = support::stream_root(events);
    assert!(
        allocator_events(events, root).is_empty(),
        "{:?}",
        allocator_events(events, root)
    );
    let totals = Counters::of(support::field(run.profile(), "totals"));
    assert_eq!(totals, Counters::default());
}

//! Reserved and committed memory (issue 24): anonymous mappings without
//! access rights (`PROT_NONE`) are address space, not memory; mprotect
//! commits them. Allocator arenas (glibc's per-thread heaps) are the
//! allocator's, whichever call of the program made glibc map them.

use serde_json::Value;

use crate::support::{self, Mappings, capture, cmd, field, kind, num, of_pid, stream_root};

const MIB: u64 = 1 << 20;

fn baseline() -> Value {
    let run = capture(&cmd("baseline", &[]));
    run.expect_code(0);
    field(run.profile(), "mappings").clone()
}

/// Check that 256 MiB mapped `PROT_NONE` count as reserved, not mapped;
/// that the 8 MiB mprotect makes read-write count as committed (mapped),
/// at the stack that mapped the reservation; and that the munmap of the
/// whole leaves nothing of either.
#[test]
fn track_reserved_then_committed() {
    let base = baseline();
    let run = capture(&cmd("reserve_commit", &[]));
    run.expect_code(0);
    let profile = run.profile();
    let maps = field(profile, "mappings");
    let b = |k: &str| num(&base, k);
    let expected = Mappings {
        mmaps: b("mmaps") + 1,
        munmaps: b("munmaps") + 1,
        mapped_bytes: b("mapped_bytes") + 8 * MIB,
        unmapped_bytes: b("unmapped_bytes") + 8 * MIB,
        peak_mapped_bytes: b("peak_mapped_bytes") + 8 * MIB,
        mapped_bytes_at_exit: b("mapped_bytes_at_exit"),
        ..Mappings::of(maps)
    };
    assert_eq!(Mappings::of(maps), expected, "baseline: {base}");
    for (key, want) in [
        ("mprotects", b("mprotects") + 1),
        ("reserved_bytes", b("reserved_bytes") + 256 * MIB),
        ("peak_reserved_bytes", b("peak_reserved_bytes") + 256 * MIB),
        ("reserved_bytes_at_exit", b("reserved_bytes_at_exit")),
        ("arena_mmaps", b("arena_mmaps")),
    ] {
        assert_eq!(num(maps, key), want, "{key} in {maps}");
    }
    // The site of the reservation: `main`, 256 MiB reserved, 8 committed.
    let site: Vec<&Value> = field(profile, "stacks")
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| num(s, "reserved_bytes") == 256 * MIB)
        .collect();
    assert_eq!(site.len(), 1, "{site:?}");
    assert_eq!(
        (num(site[0], "mmaps"), num(site[0], "mapped_bytes")),
        (1, 8 * MIB)
    );
    assert_eq!(
        site[0]["frames"][0]["function"].as_str(),
        Some("main"),
        "{}",
        site[0]
    );
    // The stream: the mmap's protection and the mprotect.
    let events = run.events();
    let ours = of_pid(events, stream_root(events));
    let of = |k: &str, size: u64| -> Vec<&Value> {
        ours.iter()
            .copied()
            .filter(|e| kind(e) == k && num(e, "size") == size)
            .collect()
    };
    let mmap = of("mmap", 256 * MIB);
    let mprotect = of("mprotect", 8 * MIB);
    assert_eq!(
        (mmap.len(), mprotect.len()),
        (1, 1),
        "{mmap:?} {mprotect:?}"
    );
    assert_eq!(num(mmap[0], "prot"), 0);
    assert_eq!(num(mprotect[0], "prot"), 3);
    assert_eq!(num(mprotect[0], "addr"), num(mmap[0], "addr") + 64 * MIB);
    // The summary says it apart from the committed mappings.
    let line = run
        .stderr
        .lines()
        .find(|l| l.trim_start().starts_with("reserved "))
        .unwrap_or_else(|| panic!("no reserved line: {}", run.stderr));
    assert!(line.contains("256.0 MiB   peak of PROT_NONE"), "{line}");
}

/// Check that glibc's arenas are the allocator's: the one a thread's first
/// malloc maps, and the one a thread whose first call is a free maps inside
/// that free (its mmap, munmaps and mprotect flagged `in_allocator`), both
/// at the allocator-arena site, 64 MiB each at exit, none at a site of the
/// program; their committed part is glibc's first heap pages.
#[test]
fn track_reserved_arenas_are_the_allocators() {
    let run = capture(&cmd("arena_thread", &[]));
    run.expect_code(0);
    let profile = run.profile();
    let maps = field(profile, "mappings");
    assert_eq!(num(maps, "arena_mmaps"), 2, "{maps}");
    assert_eq!(num(maps, "arena_bytes_at_exit"), 128 * MIB, "{maps}");
    let committed = num(maps, "arena_committed_bytes_at_exit");
    assert!(
        committed > 0 && committed < 2 * MIB,
        "committed arena bytes {committed}"
    );
    let stacks = field(profile, "stacks").as_array().expect("stacks");
    let arena: Vec<&Value> = stacks
        .iter()
        .filter(|s| s["frames"][0]["function"] == "[allocator arena]")
        .collect();
    assert_eq!(arena.len(), 1, "{arena:?}");
    let a = arena[0];
    assert_eq!(num(a, "mmaps"), 2);
    assert_eq!(
        num(a, "reserved_bytes_at_exit") + num(a, "mapped_bytes_at_exit"),
        128 * MIB
    );
    assert_eq!(num(a, "mapped_bytes_at_exit"), committed);
    // No site of the program holds an arena (thread stacks are 8 MiB).
    let program: Vec<&Value> = stacks
        .iter()
        .filter(|s| s["frames"][0]["function"] != "[allocator arena]")
        .filter(|s| num(s, "reserved_bytes") >= 64 * MIB || num(s, "mapped_bytes") >= 64 * MIB)
        .collect();
    assert!(program.is_empty(), "{program:?}");
    // Both threads' arena reservations (128 MiB, trimmed to an aligned
    // 64 MiB) are in_allocator: the second one made inside a free. (When
    // the first one's 128 MiB happened to start aligned, glibc's new_heap
    // keeps the address past it and maps the second heap there at once:
    // 64 MiB.)
    let events = run.events();
    let ours = of_pid(events, stream_root(events));
    let big: Vec<&Value> = ours
        .iter()
        .copied()
        .filter(|e| kind(e) == "mmap" && [64 * MIB, 128 * MIB].contains(&num(e, "size")))
        .collect();
    assert_eq!(big.len(), 2, "{big:?}");
    let tids: std::collections::HashSet<u32> = big.iter().map(|e| support::tid(e)).collect();
    assert_eq!(tids.len(), 2, "{big:?}");
    for e in &big {
        assert_eq!(e["in_allocator"], true, "{e}");
        assert_eq!(num(e, "prot"), 0, "{e}");
        let t = support::tid(e);
        let commits: Vec<&&Value> = ours
            .iter()
            .filter(|x| support::tid(x) == t && kind(x) == "mprotect")
            .collect();
        assert!(
            !commits.is_empty() && commits.iter().all(|x| x["in_allocator"] == true),
            "{commits:?}"
        );
    }
}

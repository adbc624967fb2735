//! The `mappings` section: anonymous mmap/munmap made by the program itself
//! (not by the allocator, not file-backed) and the program break.
//!
//! The dynamic loader maps some anonymous memory before main (on glibc 2.36:
//! 8 KiB, libc's 53072-byte .bss, and 12 KiB of TLS), so mmap counts are
//! checked against the `baseline` fixture, which links the same libraries
//! and does nothing.

use crate::support::{self, Mappings, capture, cmd, field, kind, num, of_pid, stream_root};
use serde_json::Value;

const PAGE: u64 = 4096;

fn baseline() -> Mappings {
    let run = capture(&cmd("baseline", &[]));
    run.expect_code(0);
    Mappings::of(field(run.profile(), "mappings"))
}

fn in_allocator(e: &Value) -> bool {
    support::field(e, "in_allocator")
        .as_bool()
        .unwrap_or_else(|| panic!("in_allocator is not a bool: {e}"))
}

/// Check that the program's own anonymous mmap and munmap calls are counted
/// exactly, and that file-backed mappings and the allocator's own mappings
/// (a 4 MiB malloc) are not.
#[test]
fn track_mappings_user_mmap_exact() {
    let base = baseline();
    let run = capture(&cmd("mmap", &[]));
    run.expect_code(0);
    let events = run.events();
    let root = stream_root(events);
    let ours = of_pid(events, root);
    let with = |k: &str, size: u64| -> Vec<&Value> {
        ours.iter()
            .copied()
            .filter(|e| kind(e) == k && num(e, "size") == size)
            .collect()
    };
    let a = with("mmap", 37 * PAGE);
    let b = with("mmap", 53 * PAGE);
    assert_eq!((a.len(), b.len()), (1, 1), "{a:?} {b:?}");
    assert!(!in_allocator(a[0]) && !in_allocator(b[0]));
    let unmap_a = with("munmap", 37 * PAGE);
    assert_eq!(unmap_a.len(), 1, "{unmap_a:?}");
    assert_eq!(num(unmap_a[0], "addr"), num(a[0], "addr"));
    assert!(!in_allocator(unmap_a[0]));
    assert!(with("mmap", PAGE).is_empty(), "file-backed mmap recorded");
    let big: Vec<&Value> = ours
        .iter()
        .copied()
        .filter(|e| kind(e) == "mmap" && num(e, "size") >= 4 << 20)
        .collect();
    assert_eq!(big.len(), 1, "malloc's mmap: {big:?}");
    assert!(in_allocator(big[0]), "{}", big[0]);

    let a_b = (37 + 53) * PAGE;
    let expected = Mappings {
        mmaps: base.mmaps + 2,
        munmaps: base.munmaps + 1,
        mapped_bytes: base.mapped_bytes + a_b,
        unmapped_bytes: base.unmapped_bytes + 37 * PAGE,
        peak_mapped_bytes: base.peak_mapped_bytes + a_b,
        mapped_bytes_at_exit: base.mapped_bytes_at_exit + 53 * PAGE,
        ..Mappings::of(field(run.profile(), "mappings"))
    };
    let profile = run.profile();
    assert_eq!(
        Mappings::of(field(profile, "mappings")),
        expected,
        "baseline: {base:?}"
    );
    let entry = support::process(profile, root);
    assert_eq!(Mappings::of(field(entry, "mappings")), expected);
}

/// Check that an mremap that grows a mapping is one event with the new
/// address and length and the old ones, and moves the mapped bytes from the
/// old length to the new: 29 pages mapped, grown to 61, unmapped.
#[test]
fn track_mappings_mremap_exact() {
    let base = baseline();
    let run = capture(&cmd("mremap", &[]));
    run.expect_code(0);
    let events = run.events();
    let ours = of_pid(events, stream_root(events));
    let of_kind = |k: &str| -> Vec<&Value> {
        ours.iter()
            .copied()
            .filter(|e| kind(e) == k && !in_allocator(e))
            .collect()
    };
    let mapped: Vec<&Value> = of_kind("mmap")
        .into_iter()
        .filter(|e| num(e, "size") == 29 * PAGE)
        .collect();
    assert_eq!(mapped.len(), 1, "{mapped:?}");
    let remapped = of_kind("mremap");
    assert_eq!(remapped.len(), 1, "{remapped:?}");
    let r = remapped[0];
    assert_eq!(num(r, "old_addr"), num(mapped[0], "addr"), "{r}");
    assert_eq!((num(r, "old_size"), num(r, "size")), (29 * PAGE, 61 * PAGE));
    assert!(r.get("stack_id").is_none(), "{r}");
    let unmapped: Vec<&Value> = of_kind("munmap")
        .into_iter()
        .filter(|e| num(e, "size") == 61 * PAGE)
        .collect();
    assert_eq!(unmapped.len(), 1, "{unmapped:?}");
    assert_eq!(num(unmapped[0], "addr"), num(r, "addr"));

    let expected = Mappings {
        mmaps: base.mmaps + 1,
        munmaps: base.munmaps + 1,
        mapped_bytes: base.mapped_bytes + (29 + 61) * PAGE,
        unmapped_bytes: base.unmapped_bytes + (29 + 61) * PAGE,
        peak_mapped_bytes: base.peak_mapped_bytes + 61 * PAGE,
        mapped_bytes_at_exit: base.mapped_bytes_at_exit,
        ..Mappings::of(field(run.profile(), "mappings"))
    };
    assert_eq!(
        Mappings::of(field(run.profile(), "mappings")),
        expected,
        "baseline: {base:?}"
    );
}

/// Check that moving the program break by hand (+12288, then -4096) is the
/// brk peak and the brk bytes at exit, and that a program that never moves
/// it has none.
#[test]
fn track_mappings_brk_growth_exact() {
    let base = baseline();
    assert_eq!(
        (base.brk_peak_bytes, base.brk_bytes_at_exit),
        (0, 0),
        "{base:?}"
    );

    let run = capture(&cmd("brk", &[]));
    run.expect_code(0);
    let events = run.events();
    let root = stream_root(events);
    let brks: Vec<&Value> = of_pid(events, root)
        .into_iter()
        .filter(|e| kind(e) == "brk")
        .collect();
    // The loader's query, sbrk's query, then the two moves.
    assert!(brks.len() >= 3, "{brks:?}");
    let start = num(brks[0], "addr");
    let moves: Vec<u64> = brks
        .iter()
        .filter(|e| num(e, "size") != 0)
        .map(|e| num(e, "addr"))
        .collect();
    assert_eq!(moves, [start + 12288, start + 8192]);

    let profile = run.profile();
    let m = Mappings::of(field(profile, "mappings"));
    assert_eq!(
        (m.brk_peak_bytes, m.brk_bytes_at_exit),
        (12288, 8192),
        "{m:?}"
    );
    assert_eq!(
        Mappings::of(field(support::process(profile, root), "mappings")),
        m
    );
}

/// Check that thread stacks, mapped by pthread_create outside any allocator
/// call, count as the program's mappings, while each thread's malloc arena
/// (mapped inside malloc) does not. glibc maps a stack `PROT_NONE` and
/// makes all but its guard page read-write: the stack is committed, its
/// guard page stays reserved (issue 24).
#[test]
fn track_mappings_thread_stacks_counted() {
    let base = baseline();
    let run = capture(&cmd("threads", &[]));
    run.expect_code(0);
    let events = run.events();
    let root = stream_root(events);
    let user_mmaps: Vec<u64> = of_pid(events, root)
        .into_iter()
        .filter(|e| kind(e) == "mmap" && !in_allocator(e))
        .map(|e| num(e, "size"))
        .collect();
    let m = Mappings::of(field(run.profile(), "mappings"));
    assert_eq!(m.mmaps, base.mmaps + 4, "user mmaps: {user_mmaps:?}");
    assert_eq!(user_mmaps.len() as u64, m.mmaps, "{user_mmaps:?}");
    // glibc's default stack: 8 MiB plus a guard page.
    let stack = 8 << 20;
    assert_eq!(m.mapped_bytes, base.mapped_bytes + 4 * stack, "{m:?}");
    assert_eq!(
        m.mapped_bytes_at_exit,
        base.mapped_bytes_at_exit + 4 * stack,
        "{m:?}"
    );
    let maps = field(run.profile(), "mappings");
    let reserved = num(maps, "reserved_bytes_at_exit");
    assert_eq!(reserved, 4 * PAGE, "{maps}");
    assert_eq!(num(maps, "reserved_bytes"), 4 * (stack + PAGE), "{maps}");
    assert_eq!(num(maps, "mprotects"), 4, "{maps}");
}

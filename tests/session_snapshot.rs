//! Snapshots of a session tracking its own process (issue 13). One test in
//! this binary, so that no other test thread allocates meanwhile.

use memtrail::session::{Session, SessionOptions, Target};

/// Check that a snapshot includes every allocation made before the call:
/// 5 blocks allocated between two snapshots are exactly 5 more allocations,
/// their bytes and live blocks, and freeing them 5 more frees.
#[test]
fn session_snapshot_exact_after_five_allocations() {
    let session = Session::start(&SessionOptions::default(), Target::SelfProcess)
        .expect("a session on this process");
    let pid = std::process::id();
    let first = session.snapshot().expect("snapshot");
    let mut blocks = [std::ptr::null_mut(); 5];
    for (i, b) in blocks.iter_mut().enumerate() {
        // SAFETY: plain malloc; freed below.
        *b = std::hint::black_box(unsafe { libc::malloc(1000 + i) });
    }
    let second = session.snapshot().expect("snapshot");
    for b in blocks {
        // SAFETY: allocated above, freed once.
        unsafe { libc::free(std::hint::black_box(b)) };
    }
    let third = session.snapshot().expect("snapshot");
    let (a, b, c) = (first.totals, second.totals, third.totals);
    assert_eq!(b.allocations - a.allocations, 5, "{a:?} {b:?}");
    assert_eq!(b.allocated_bytes - a.allocated_bytes, 5 * 1000 + 10);
    assert_eq!(b.live_allocations - a.live_allocations, 5);
    assert_eq!(c.frees - b.frees, 5, "{b:?} {c:?}");
    assert_eq!(c.freed_bytes - b.freed_bytes, 5 * 1000 + 10);
    assert_eq!(c.allocations, b.allocations);
    assert_eq!(second.processes.len(), 1);
    assert_eq!(second.processes[0].pid, pid);
    assert_eq!(second.processes[0].totals, b);
    // The totals alone agree with the last snapshot (nothing allocated or
    // freed since, but the snapshots' own drops: unmatched frees).
    drop((first, second));
    assert_eq!(session.totals().expect("totals"), c);
    drop(third);
    session.finish().expect("finish");
}

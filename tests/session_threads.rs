//! A session owns its threads: whatever way it ends, none outlives it
//! (issue 13). One test in this binary: it counts the process's threads.

use memtrail::session::{CaptureError, Faults};
use memtrail::session::{Session, SessionOptions, Target};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

/// The thread count once it has come back to `want`, or what it is after
/// 5 s. A joined thread leaves /proc/self/task a moment after the join
/// returns (the kernel wakes the joiner before it releases the task), so
/// the count is read until it settles; a thread that still runs never
/// leaves, and fails the test.
fn settled(want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let n = threads();
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::yield_now();
    }
}

fn names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .collect()
}

/// Check that a session failing after its pollers and coordinator started,
/// a session dropped while tracking, and one unwound by a panic join every
/// thread they started before returning (issue 13: detached pollers read
/// the unmapped .bss).
#[test]
fn session_threads_joined_on_error_and_drop() {
    let before = threads();
    let opts = SessionOptions {
        faults: Faults {
            fail_after_start: true,
            ..Faults::default()
        },
        ..SessionOptions::default()
    };
    let err = Session::start(&opts, Target::Command(vec!["true".into()]))
        .expect_err("the injected failure");
    assert!(matches!(err, CaptureError::Injected), "{err}");
    assert_eq!(settled(before), before, "{:?}", names());

    let session = Session::start(&SessionOptions::default(), Target::SelfProcess)
        .expect("a session on this process");
    // Four pollers and the pressure coordinator.
    assert_eq!(threads(), before + 5);
    drop(session);
    assert_eq!(settled(before), before, "{:?}", names());

    let unwound = std::panic::catch_unwind(|| {
        let _session = Session::start(&SessionOptions::default(), Target::SelfProcess)
            .expect("a session on this process");
        panic!("injected panic while a session runs");
    });
    assert!(unwound.is_err());
    assert_eq!(settled(before), before, "{:?}", names());
}

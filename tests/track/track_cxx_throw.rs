//! C++ exceptions thrown out of a probed operator new.

use crate::support::{capture, cmd, id, sized};

/// Check that std::bad_alloc thrown out of operator new under memtrail is
/// caught by the program (exit 0, not std::terminate), and that the
/// allocations made after it are each counted once, with their stack.
#[test]
fn track_cxx_exception_from_new_is_caught() {
    let run = capture(&cmd("cxx_throw", &[]));
    run.expect_code(0);
    let events = run.events();
    let after = sized(events, "malloc", 66666);
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(after.iter().all(|e| id(e, "stack_id") != 0), "{after:?}");
}

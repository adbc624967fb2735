//! Session handles: the values `memtrail_session *` takes.
//!
//! A handle is a number handed out once per process (a counter from 1),
//! never an address: the session behind it is looked up in [`REGISTRY`].
//! So a freed handle stays dead even when a new session's memory lands
//! where the old one's was (issue 27: handles were the sessions'
//! addresses, and a stale one reached the next session allocated there).
//! C never dereferences a handle: `struct memtrail_session` is opaque.
//!
//! The registry owns one reference to each live session; a call holds
//! another for its duration, so a session is dropped (its threads joined)
//! by whichever of `memtrail_session_free` and the calls in progress ends
//! last.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::errors::fail;
use super::memtrail_error::{self, *};
use super::memtrail_session;

/// Live sessions by handle, and the next handle.
struct Registry {
    /// The next handle to give out; never 0 (NULL) and never given twice.
    next: usize,
    live: BTreeMap<usize, Arc<memtrail_session>>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 1,
    live: BTreeMap::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // A panic never leaves the registry half-changed: its updates are
    // single map operations.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers `session`: its new handle.
pub(super) fn insert(session: memtrail_session) -> *mut memtrail_session {
    let mut reg = registry();
    let id = reg.next;
    // 2^64 sessions are never made: an overflow would be a bug.
    reg.next = id
        .checked_add(1)
        .expect("memtrail session handles exhausted");
    reg.live.insert(id, Arc::new(session));
    // A handle is an opaque number that C passes back, never dereferenced.
    std::ptr::without_provenance_mut(id)
}

fn dead() -> memtrail_error {
    fail(
        MEMTRAIL_E_HANDLE,
        "not a live memtrail session (freed already, or never one)",
    )
}

/// The live session behind `ptr`, made by this process.
pub(super) fn get(ptr: *const memtrail_session) -> Result<Arc<memtrail_session>, memtrail_error> {
    if ptr.is_null() {
        return Err(fail(MEMTRAIL_E_NULL, "session is NULL"));
    }
    let session = registry().live.get(&ptr.addr()).cloned().ok_or_else(dead)?;
    own(&session)?;
    Ok(session)
}

/// Unregisters the session behind `ptr` (NULL: nothing). One made by
/// another process (a child of fork calling it on its parent's handle)
/// stays: dropping it would join threads this process does not have.
pub(super) fn remove(ptr: *mut memtrail_session) -> Result<(), memtrail_error> {
    if ptr.is_null() {
        return Ok(());
    }
    let mut reg = registry();
    own(reg.live.get(&ptr.addr()).ok_or_else(dead)?)?;
    let session = reg.live.remove(&ptr.addr());
    // Dropped (threads joined) without the registry locked.
    drop(reg);
    drop(session);
    Ok(())
}

/// `MEMTRAIL_E_HANDLE` unless `session` was made by the calling process: a
/// child of fork has a copy of its parent's session but none of its
/// threads, and a call waiting for them would wait forever.
fn own(session: &memtrail_session) -> Result<(), memtrail_error> {
    let me = std::process::id();
    if session.pid == me {
        return Ok(());
    }
    Err(fail(
        MEMTRAIL_E_HANDLE,
        &format!(
            "this session belongs to process {}, not to process {me} (a child of fork): \
             only the process that made it can use or free it",
            session.pid
        ),
    ))
}

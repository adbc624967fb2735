//! The C ABI's session handles from Rust (issue 27), in a binary of its
//! own: its sessions track this process (a self-tracking session sees the
//! forks of every test thread), and its global allocator reuses freed
//! memory at once.
/// A global allocator that hands the last freed block of one size back to
/// the next allocation of exactly that size (LIFO), so that a session
/// started after another was freed lands where the freed one was.
mod reuse {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The size recycled (0: none).
    static SIZE: AtomicUsize = AtomicUsize::new(0);
    /// Blocks recycled so far.
    pub static RECYCLED: AtomicUsize = AtomicUsize::new(0);
    /// Freed blocks of `SIZE`, at most the capacity reserved up front (a
    /// push never allocates).
    static FREED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

    pub struct Reuse;

    fn recycled(layout: Layout) -> bool {
        layout.size() == SIZE.load(Ordering::Relaxed) && layout.align() <= 16
    }

    // SAFETY: every block comes from `System` (16-aligned), and a freed one
    // is handed out again only for a layout of the same size and an
    // alignment it has.
    unsafe impl GlobalAlloc for Reuse {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if recycled(layout)
                && let Ok(mut freed) = FREED.try_lock()
                && let Some(p) = freed.pop()
            {
                RECYCLED.fetch_add(1, Ordering::Relaxed);
                return std::ptr::with_exposed_provenance_mut(p);
            }
            // SAFETY: forwarded.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if recycled(layout)
                && let Ok(mut freed) = FREED.try_lock()
                && freed.len() < freed.capacity()
            {
                freed.push(ptr.expose_provenance());
                return;
            }
            // SAFETY: forwarded.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// Recycles blocks of `size` bytes from now on.
    pub fn arm(size: usize) {
        FREED.lock().expect("freed blocks").reserve(64);
        SIZE.store(size, Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: reuse::Reuse = reuse::Reuse;

/// Check that a freed session's handle gets `MEMTRAIL_E_HANDLE` when a new
/// session's memory is where the freed one's was (an allocator that reuses
/// it at once), and that the new session works (issue 27: handles were
/// addresses, and the stale one reached the new session).
#[test]
fn ffi_handles_stale_after_memory_reuse() {
    use memtrail::internals::ffi::{
        memtrail_error::*, memtrail_session, memtrail_session_free, memtrail_snapshot,
        memtrail_totals, memtrail_track_self,
    };
    use std::sync::atomic::Ordering;
    let start = || {
        let mut s = std::ptr::null_mut();
        // SAFETY: NULL options, `s` writable.
        let code = unsafe { memtrail_track_self(std::ptr::null(), &mut s) };
        assert_eq!(code, MEMTRAIL_OK);
        s
    };
    let snapshot = |s: *mut memtrail_session| {
        let mut t = memtrail_totals {
            size: std::mem::size_of::<memtrail_totals>(),
            ..Default::default()
        };
        // SAFETY: `t` is a writable memtrail_totals with its size.
        unsafe { memtrail_snapshot(s, &mut t) }
    };
    // A session is an `Arc` of a `memtrail_session`: two counts before it.
    reuse::arm(2 * std::mem::size_of::<usize>() + std::mem::size_of::<memtrail_session>());
    let old = start();
    // SAFETY: a live handle.
    assert_eq!(unsafe { memtrail_session_free(old) }, MEMTRAIL_OK);
    let recycled = reuse::RECYCLED.load(Ordering::Relaxed);
    let new = start();
    assert!(
        reuse::RECYCLED.load(Ordering::Relaxed) > recycled,
        "the allocator reused no block: the test proves nothing"
    );
    assert_eq!(snapshot(old), MEMTRAIL_E_HANDLE);
    // SAFETY: a stale handle: refused, nothing freed.
    assert_eq!(unsafe { memtrail_session_free(old) }, MEMTRAIL_E_HANDLE);
    assert_eq!(snapshot(new), MEMTRAIL_OK);
    // SAFETY: a live handle.
    assert_eq!(unsafe { memtrail_session_free(new) }, MEMTRAIL_OK);
}

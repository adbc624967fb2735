//! Regions of a session tracking its own process: exact counts of a piece
//! of code, per thread (issue 13).

use std::sync::{Arc, Barrier, Mutex};

use memtrail::internals::profile::regions::RegionCounts;

use memtrail::session::{Session, SessionOptions, Target};

/// One session at a time: two would each count the other's threads' work.
static ONE: Mutex<()> = Mutex::new(());

fn malloc(n: usize) -> *mut libc::c_void {
    // SAFETY: plain malloc; the tests free what they mean to.
    std::hint::black_box(unsafe { libc::malloc(n) })
}

fn free(p: *mut libc::c_void) {
    // SAFETY: a block from `malloc`, freed once.
    unsafe { libc::free(std::hint::black_box(p)) }
}

/// Check that a region with 3 mallocs and 1 free reports exactly 3 and 1,
/// their bytes, the peak of its blocks and what is left live at its end.
#[test]
fn session_region_counts_exact() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let session = Session::start(&SessionOptions::default(), Target::SelfProcess)
        .expect("a session on this process");
    let region = session.region("three").expect("region");
    let a = malloc(100);
    let b = malloc(200);
    free(b);
    let c = malloc(300);
    let counts = region.end().expect("region end");
    assert_eq!(
        counts,
        RegionCounts {
            allocations: 3,
            frees: 1,
            allocated_bytes: 600,
            freed_bytes: 200,
            peak_live_bytes: 400,
            live_allocations: 2,
            live_bytes: 400,
        }
    );
    free(a);
    free(c);
    // An empty region.
    session.region_begin("empty").expect("begin");
    assert_eq!(session.region_end().expect("end"), RegionCounts::default());
    // No region open.
    assert!(session.region_end().is_err());
}

/// Check that regions nest: the inner region's events count in the outer
/// one, a block born outside the inner region and freed in it is a free of
/// both, and the inner region's live blocks are the outer one's at its end.
#[test]
fn session_region_nested_exact() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let session = Session::start(&SessionOptions::default(), Target::SelfProcess)
        .expect("a session on this process");
    session.region_begin("outer").expect("begin");
    let a = malloc(1000);
    session.region_begin("inner").expect("begin");
    let b = malloc(50);
    free(a);
    let inner = session.region_end().expect("end");
    let outer = session.region_end().expect("end");
    assert_eq!(
        inner,
        RegionCounts {
            allocations: 1,
            frees: 1,
            allocated_bytes: 50,
            freed_bytes: 1000,
            peak_live_bytes: 50,
            live_allocations: 1,
            live_bytes: 50,
        }
    );
    assert_eq!(
        outer,
        RegionCounts {
            allocations: 2,
            frees: 1,
            allocated_bytes: 1050,
            freed_bytes: 1000,
            peak_live_bytes: 1050,
            live_allocations: 1,
            live_bytes: 50,
        }
    );
    free(b);
}

/// Check that a region counts only its own thread: another thread's
/// allocations while it is open are left out, and the block that thread
/// frees of the region's is no longer live at its end.
#[test]
fn session_region_per_thread() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let session = Session::start(&SessionOptions::default(), Target::SelfProcess)
        .expect("a session on this process");
    let go = Arc::new(Barrier::new(2));
    let done = Arc::new(Barrier::new(2));
    let shared = Arc::new(Mutex::new(0usize));
    let (g, d, s) = (go.clone(), done.clone(), shared.clone());
    let other = std::thread::spawn(move || {
        g.wait();
        let blocks: Vec<_> = (0..10).map(|_| malloc(64)).collect();
        blocks.into_iter().for_each(free);
        let p = *s.lock().unwrap_or_else(|e| e.into_inner());
        free(p as *mut libc::c_void);
        d.wait();
    });
    let region = session.region("mine").expect("region");
    let p = malloc(777);
    *shared.lock().unwrap_or_else(|e| e.into_inner()) = p as usize;
    go.wait();
    done.wait();
    let counts = region.end().expect("end");
    other.join().expect("thread");
    assert_eq!(
        counts,
        RegionCounts {
            allocations: 1,
            frees: 0,
            allocated_bytes: 777,
            freed_bytes: 0,
            peak_live_bytes: 777,
            live_allocations: 0,
            live_bytes: 0,
        }
    );
}

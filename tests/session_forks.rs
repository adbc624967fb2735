//! Sessions on this very process while its threads spawn children: however
//! a session ends, no child is left held at fork (per-process probes hold a
//! new process until its probes are made). One test in this binary: its
//! sessions see the forks of every thread of the process.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use memtrail::internals::attach::per_process::Probes;
use memtrail::session::{Session, SessionOptions, Target};

/// A thread spawning `true` and waiting for it, over and over, until told
/// to stop.
struct Spawner {
    stop: Arc<AtomicBool>,
    spawned: Arc<AtomicUsize>,
    done: mpsc::Receiver<()>,
}

impl Spawner {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let spawned = Arc::new(AtomicUsize::new(0));
        let (tx, done) = mpsc::channel();
        let (s, n) = (stop.clone(), spawned.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let status = Command::new("true")
                    .status()
                    .expect("spawn and wait for true");
                assert!(status.success());
                n.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tx.send(());
        });
        Self {
            stop,
            spawned,
            done,
        }
    }

    /// Returns once `count` more children have run.
    fn wait_for(&self, count: usize) {
        let want = self.spawned.load(Ordering::Relaxed) + count;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.spawned.load(Ordering::Relaxed) < want {
            assert!(
                std::time::Instant::now() < deadline,
                "no child ran in 30 s while the session lived: {:?}",
                children()
            );
            std::thread::yield_now();
        }
    }

    /// Stops the loop; fails, naming the children and their states, if its
    /// spawn does not come back within 10 s (a child held stopped never
    /// execs, and `vfork` never returns to its parent).
    fn finish(self, what: &str) {
        self.stop.store(true, Ordering::Relaxed);
        if self.done.recv_timeout(Duration::from_secs(10)).is_ok() {
            return;
        }
        let stuck = children();
        // Let the test process exit: resume whatever the session left.
        for (pid, _) in &stuck {
            // SAFETY: kill(2) with a pid and a signal number.
            unsafe { libc::kill(*pid, libc::SIGCONT) };
        }
        panic!("after {what}, the spawn hung; children (pid, state): {stuck:?}");
    }
}

/// This process's children and their states (`/proc/PID/stat`'s third
/// field: `T` for stopped).
fn children() -> Vec<(i32, char)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("a task").path().join("children");
        let Ok(list) = std::fs::read_to_string(path) else {
            continue;
        };
        for pid in list.split_whitespace() {
            let pid: i32 = pid.parse().expect("a pid");
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .unwrap_or('?');
            out.push((pid, state));
        }
    }
    out
}

/// Check that sessions on this process, dropped, finished or freed through
/// the C ABI while another thread spawns children, leave none of those
/// children stopped: a child held at fork for its per-process probes is
/// resumed whatever ends the session (a child left held hung its parent's
/// `vfork` in `Command::spawn`).
#[test]
fn session_self_end_leaves_no_child_held() {
    const ROUNDS: usize = 8;
    for probes in [Probes::Auto, Probes::PerProcess] {
        let opts = SessionOptions {
            probes,
            ..SessionOptions::default()
        };
        for round in 0..ROUNDS {
            let session = Session::start(&opts, Target::SelfProcess).expect("a session");
            let spawner = Spawner::start();
            spawner.wait_for(3);
            if round % 2 == 0 {
                drop(session);
            } else {
                let _ = session.finish();
            }
            spawner.finish(&format!("{probes:?} session end, round {round}"));
        }
    }
    for round in 0..ROUNDS {
        use memtrail::internals::ffi::{
            memtrail_error::MEMTRAIL_OK, memtrail_session_free, memtrail_track_self,
        };
        let mut s = std::ptr::null_mut();
        // SAFETY: NULL options, `s` writable.
        let code = unsafe { memtrail_track_self(std::ptr::null(), &mut s) };
        assert_eq!(code, MEMTRAIL_OK);
        let spawner = Spawner::start();
        spawner.wait_for(3);
        // SAFETY: a live handle.
        assert_eq!(unsafe { memtrail_session_free(s) }, MEMTRAIL_OK);
        spawner.finish(&format!("memtrail_session_free, round {round}"));
    }
}

//! Stop ownership on real processes: `cat` children that echo a byte back
//! when they run, and a vfork fixture.
//!
//! Stopped or not is read from `/proc/PID/stat`, independently of the
//! module's own reading; running is shown by an echo. Waits are for a state
//! that must come, bounded by [`GUARD`] only so that a broken build fails
//! instead of hanging; no assertion depends on timing. Runs as any user
//! (it only signals its own children), but for the foreign-stop tests,
//! which make a BPF map or run `memtrail attach` (root).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::support;
use crossbeam_utils::Backoff;
use libbpf_rs::MapCore;
use memtrail::internals::proctree::stops::{Owner, Owners, Released, StopState, Stops, Taken};
use memtrail::internals::sys::{self, Pid, Signal};

/// Bound on every wait for something that must happen.
const GUARD: Duration = Duration::from_secs(10);

/// A stop timeout no test reaches.
const FOREVER: Duration = Duration::from_secs(3600);

/// Rounds of the tests that race two threads.
const ROUNDS: usize = 20;

/// A `cat` child: it runs if it echoes a byte back. Killed on drop.
struct Cat {
    child: Child,
    stdin: ChildStdin,
    echo: Receiver<u8>,
}

impl Cat {
    fn spawn() -> Self {
        let mut child = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn cat");
        let stdin = child.stdin.take().expect("cat's stdin");
        let stdout = child.stdout.take().expect("cat's stdout");
        let (tx, echo) = mpsc::channel();
        std::thread::spawn(move || {
            for byte in BufReader::new(stdout).bytes() {
                let Ok(byte) = byte else { break };
                if tx.send(byte).is_err() {
                    break;
                }
            }
        });
        Self { child, stdin, echo }
    }

    fn pid(&self) -> Pid {
        Pid::new(self.child.id())
    }

    /// Asserts that cat runs: it echoes a byte (a stopped cat never does).
    fn assert_runs(&mut self) {
        self.stdin.write_all(b"x").expect("write to cat");
        self.stdin.flush().expect("flush cat's stdin");
        match self.echo.recv_timeout(GUARD) {
            Ok(b'x') => {}
            other => panic!(
                "cat {} did not echo: {other:?}, state {}",
                self.pid(),
                proc_state(self.pid())
            ),
        }
        assert_ne!(proc_state(self.pid()), 'T', "cat runs");
    }

    /// Kills cat with SIGKILL and reaps it.
    fn kill_and_reap(&mut self) {
        self.child.kill().expect("kill cat");
        self.child.wait().expect("reap cat");
    }
}

impl Drop for Cat {
    fn drop(&mut self) {
        // Already reaped by some tests: errors are expected then.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills the process behind a pidfd on drop, so that a failed test leaves
/// no stopped process behind (the pidfd cannot reach a reused pid).
struct KillOnDrop(OwnedFd);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // ESRCH when it already exited.
        let _ = sys::pidfd_send_signal(self.0.as_fd(), Signal::KILL);
    }
}

/// The state letter of process `pid` (its main thread) in /proc.
fn proc_state(pid: Pid) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/stat: {e}"));
    let (_, after_comm) = stat.rsplit_once(')').expect("stat has (comm)");
    after_comm
        .trim_start()
        .chars()
        .next()
        .expect("state letter")
}

/// Waits until process `pid`'s state is one of `want`; returns it.
fn wait_state(pid: Pid, want: &[char]) -> char {
    let deadline = Instant::now() + GUARD;
    let backoff = Backoff::new();
    loop {
        let state = proc_state(pid);
        if want.contains(&state) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} never reached {want:?}: state {state}"
        );
        if backoff.is_completed() {
            std::thread::sleep(Duration::from_micros(200));
        } else {
            backoff.snooze();
        }
    }
}

/// Waits until `cond` holds.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + GUARD;
    let backoff = Backoff::new();
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        if backoff.is_completed() {
            std::thread::sleep(Duration::from_micros(200));
        } else {
            backoff.snooze();
        }
    }
}

fn owners(list: &[Owner]) -> Owners {
    list.iter().copied().collect()
}

/// Check that a process held by two owners stays stopped after the first
/// release and runs after the second, which alone sends SIGCONT.
#[test]
fn stops_two_owners_resume_after_both_release() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD);
    assert_eq!(
        stops.stop(pid, Owner::Pressure).expect("stop"),
        Taken::Held(Owner::Pressure.into())
    );
    assert_eq!(
        stops.hold_stopped(pid, Owner::Attach).expect("hold"),
        Taken::Held(owners(&[Owner::Pressure, Owner::Attach]))
    );
    assert_eq!(
        stops.wait_stopped(pid).expect("wait"),
        Some(StopState::Stopped)
    );
    assert_eq!(proc_state(pid), 'T');

    assert_eq!(
        stops.release(pid, Owner::Pressure).expect("first release"),
        Released::Held(Owner::Attach.into())
    );
    assert_eq!(
        proc_state(pid),
        'T',
        "still stopped after the first release"
    );
    assert_eq!(stops.held(pid), Owner::Attach.into());

    assert_eq!(
        stops.release(pid, Owner::Attach).expect("second release"),
        Released::Resumed
    );
    assert_eq!(stops.held(pid), Owners::NONE);
    cat.assert_runs();
    assert_eq!(
        stops.release(pid, Owner::Attach).expect("third release"),
        Released::NotHeld
    );
}

/// Check that an owner holding a process twice lets go with one release:
/// ownership is a set.
#[test]
fn stops_ownership_is_a_set() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD);
    stops.stop(pid, Owner::Pressure).expect("stop");
    assert_eq!(
        stops.stop(pid, Owner::Pressure).expect("stop again"),
        Taken::Held(Owner::Pressure.into())
    );
    assert_eq!(
        stops.release(pid, Owner::Pressure).expect("release"),
        Released::Resumed
    );
    cat.assert_runs();
}

/// Check that releasing a process that was killed and reaped while held
/// reports it exited, at once (not after the stop wait times out), and
/// leaves no entry.
#[test]
fn stops_release_after_exit_while_held() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD);
    stops.stop(pid, Owner::Pressure).expect("stop");
    stops.hold_stopped(pid, Owner::Attach).expect("hold");
    wait_state(pid, &['T']);
    cat.kill_and_reap();

    assert_eq!(
        stops.release(pid, Owner::Attach).expect("first release"),
        Released::Held(Owner::Pressure.into())
    );
    assert_eq!(
        stops.release(pid, Owner::Pressure).expect("last release"),
        Released::Exited
    );
    assert_eq!(stops.held(pid), Owners::NONE);
}

/// Check that releasing a held process that was killed but not reaped yet
/// (a zombie) reports it exited.
#[test]
fn stops_release_of_zombie() {
    let cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD);
    stops.stop(pid, Owner::Startup).expect("stop");
    wait_state(pid, &['T']);
    sys::kill(pid, Signal::KILL).expect("kill cat");
    wait_state(pid, &['Z']);
    assert_eq!(stops.state(pid).expect("state"), Some(StopState::Exited));
    assert_eq!(
        stops.release(pid, Owner::Startup).expect("release"),
        Released::Exited
    );
}

/// Check that a signal to a held process that has been reaped fails with
/// ESRCH through its pidfd and drops the entry, instead of reaching whoever
/// reuses the pid.
#[test]
fn stops_stop_after_reap_drops_entry() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD);
    stops.hold_stopped(pid, Owner::Attach).expect("hold");
    cat.kill_and_reap();
    assert_eq!(
        stops.stop(pid, Owner::Pressure).expect("stop"),
        Taken::Exited
    );
    assert_eq!(stops.held(pid), Owners::NONE);
    assert_eq!(
        stops.release(pid, Owner::Attach).expect("release"),
        Released::NotHeld
    );
}

/// Check that forgetting a process that exited while held drops every
/// owner without a signal, and that a release waiting for its stop then
/// ends, reporting it exited.
#[test]
fn stops_forget_ends_a_waiting_release() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD * 10);
    stops.stop(pid, Owner::Pressure).expect("stop");
    stops.hold_stopped(pid, Owner::Attach).expect("hold");
    wait_state(pid, &['T']);
    cat.kill_and_reap();
    assert_eq!(stops.forget(pid), owners(&[Owner::Pressure, Owner::Attach]));
    assert_eq!(stops.held(pid), Owners::NONE);
    assert_eq!(stops.forget(pid), Owners::NONE);

    // A release waiting on a process that never stops, until forgotten.
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    stops.hold_stopped(pid, Owner::Attach).expect("hold");
    std::thread::scope(|s| {
        let release = s.spawn(|| stops.release(pid, Owner::Attach));
        wait_until("the release waits for the stop", || stops.is_resuming(pid));
        assert_eq!(stops.forget(pid), Owners::NONE);
        assert_eq!(
            release.join().expect("release thread").expect("release"),
            Released::Exited
        );
    });
    cat.assert_runs();
}

/// Check that two owners releasing at the same time from two threads
/// resume the process exactly once: one release resumes it, the other
/// reports the owner left, and it runs afterwards.
#[test]
fn stops_concurrent_release_resumes_once() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD);
    for round in 0..ROUNDS {
        stops.stop(pid, Owner::Pressure).expect("stop");
        stops.hold_stopped(pid, Owner::Attach).expect("hold");
        wait_state(pid, &['T']);
        let barrier = Barrier::new(2);
        let (a, b) = std::thread::scope(|s| {
            let release = |owner| {
                let barrier = &barrier;
                let stops = &stops;
                s.spawn(move || {
                    barrier.wait();
                    stops.release(pid, owner).expect("release")
                })
            };
            let a = release(Owner::Pressure);
            let b = release(Owner::Attach);
            (a.join().expect("thread a"), b.join().expect("thread b"))
        });
        let resumed = [a, b].iter().filter(|&&r| r == Released::Resumed).count();
        assert_eq!(resumed, 1, "round {round}: {a:?} and {b:?}");
        assert!(
            a == Released::Held(Owner::Attach.into())
                || b == Released::Held(Owner::Pressure.into()),
            "round {round}: the other release leaves its peer holding: {a:?}, {b:?}"
        );
        assert_eq!(stops.held(pid), Owners::NONE);
        cat.assert_runs();
    }
}

/// Check that a hold taken before BPF's SIGSTOP lands, followed at once by
/// a release, ends with the process running: the release waits for the
/// late SIGSTOP (sent from another thread after a barrier) before its
/// SIGCONT, instead of resuming first and leaving the process stopped.
#[test]
fn stops_late_sigstop_after_hold_ends_running() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD);
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(2));
        let late = {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                sys::kill(pid, Signal::STOP).expect("late SIGSTOP");
            })
        };
        assert_eq!(
            stops.hold_stopped(pid, Owner::Attach).expect("hold"),
            Taken::Held(Owner::Attach.into())
        );
        barrier.wait();
        assert_eq!(
            stops.release(pid, Owner::Attach).expect("release"),
            Released::Resumed,
            "round {round}"
        );
        late.join().expect("late SIGSTOP thread");
        cat.assert_runs();
    }
}

/// Check that a release that waits for the stop stands down when a new
/// owner takes the process meanwhile: no SIGCONT, the process stays
/// stopped until the new owner releases.
#[test]
fn stops_new_owner_during_resume_keeps_process_stopped() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(GUARD * 10);
    stops.hold_stopped(pid, Owner::Attach).expect("hold");
    let released = std::thread::scope(|s| {
        // Nothing stops cat yet: the release waits.
        let release = s.spawn(|| stops.release(pid, Owner::Attach));
        wait_until("the release waits for the stop", || stops.is_resuming(pid));
        assert_eq!(
            stops.stop(pid, Owner::Pressure).expect("stop"),
            Taken::Held(Owner::Pressure.into())
        );
        release.join().expect("release thread").expect("release")
    });
    assert_eq!(released, Released::Held(Owner::Pressure.into()));
    assert_eq!(
        stops.wait_stopped(pid).expect("wait"),
        Some(StopState::Stopped)
    );
    assert_eq!(proc_state(pid), 'T');
    assert_eq!(
        stops.release(pid, Owner::Pressure).expect("release"),
        Released::Resumed
    );
    cat.assert_runs();
}

/// Check that a held process that is never stopped is still resumed when
/// its stop does not show within the timeout, and that the release says so.
#[test]
fn stops_release_without_stop_is_unconfirmed() {
    let mut cat = Cat::spawn();
    let pid = cat.pid();
    let stops = Stops::with_timeout(Duration::from_millis(10));
    stops.hold_stopped(pid, Owner::Startup).expect("hold");
    assert_eq!(stops.state(pid).expect("state"), Some(StopState::Running));
    assert_eq!(
        stops.release(pid, Owner::Startup).expect("release"),
        Released::ResumedUnconfirmed
    );
    cat.assert_runs();
}

/// Check that a vfork parent with a SIGSTOP pending, asleep until its held
/// child is resumed, counts as stopping: releasing it resumes it at once
/// (the SIGCONT discards the pending SIGSTOP) instead of waiting for a stop
/// that cannot happen first.
#[test]
fn stops_vfork_parent_with_pending_stop_resumes() {
    let mut parent = Command::new(support::fixture("vfork_stop"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn vfork_stop");
    let ppid = Pid::new(parent.id());
    let mut out = BufReader::new(parent.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read child line");
    let child = line
        .trim()
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .map(Pid::new)
        .unwrap_or_else(|| panic!("fixture line: {line:?}"));
    let _child_guard = KillOnDrop(sys::pidfd_open(child).expect("pidfd of the child"));
    wait_state(child, &['T']);
    assert_eq!(wait_state(ppid, &['D']), 'D', "parent waits in vfork");

    // A release that waited for every thread to stop would wait until the
    // child runs, which is after the release: in effect forever.
    let stops = Arc::new(Stops::with_timeout(FOREVER));
    sys::kill(ppid, Signal::STOP).expect("SIGSTOP the parent");
    stops
        .hold_stopped(ppid, Owner::Attach)
        .expect("hold parent");
    assert_eq!(stops.state(ppid).expect("state"), Some(StopState::Stopping));
    let (tx, rx) = mpsc::channel();
    {
        let stops = Arc::clone(&stops);
        std::thread::spawn(move || {
            let _ = tx.send(stops.release(ppid, Owner::Attach).expect("release parent"));
        });
    }
    assert_eq!(
        rx.recv_timeout(GUARD).unwrap_or_else(|_| {
            let _ = parent.kill();
            panic!("the release of the parent waits for a stop that cannot come first")
        }),
        Released::Resumed
    );

    stops
        .hold_stopped(child, Owner::Attach)
        .expect("hold child");
    assert_eq!(
        stops.release(child, Owner::Attach).expect("release child"),
        Released::Resumed
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);
        let _ = tx.send(rest);
    });
    let rest = rx.recv_timeout(GUARD).unwrap_or_else(|_| {
        let _ = parent.kill();
        panic!("the parent did not finish: state {}", proc_state(ppid))
    });
    assert_eq!(rest, "done\n");
    assert!(parent.wait().expect("wait parent").success());
}

/// Check that dropping the table resumes every process it holds, whatever
/// its owners, and copes with one that exited while held.
#[test]
fn stops_drop_resumes_everything() {
    let mut a = Cat::spawn();
    let mut b = Cat::spawn();
    let mut gone = Cat::spawn();
    let stops = Stops::with_timeout(GUARD);
    stops.stop(a.pid(), Owner::Pressure).expect("stop a");
    sys::kill(b.pid(), Signal::STOP).expect("SIGSTOP b");
    stops.hold_stopped(b.pid(), Owner::Startup).expect("hold b");
    stops.stop(b.pid(), Owner::Pressure).expect("stop b");
    stops.stop(gone.pid(), Owner::Attach).expect("stop gone");
    for cat in [&a, &b, &gone] {
        wait_state(cat.pid(), &['T']);
    }
    gone.kill_and_reap();
    drop(stops);
    a.assert_runs();
    b.assert_runs();
}

/// Check that releasing every hold of one owner resumes the processes only
/// it held and leaves the others with their remaining owners.
#[test]
fn stops_release_all_of_one_owner() {
    let mut a = Cat::spawn();
    let b = Cat::spawn();
    let stops = Stops::with_timeout(GUARD);
    stops.stop(a.pid(), Owner::Pressure).expect("stop a");
    stops.stop(b.pid(), Owner::Pressure).expect("stop b");
    stops.hold_stopped(b.pid(), Owner::Attach).expect("hold b");
    wait_state(a.pid(), &['T']);
    wait_state(b.pid(), &['T']);
    let mut want = vec![
        (a.pid(), Released::Resumed),
        (b.pid(), Released::Held(Owner::Attach.into())),
    ];
    want.sort_by_key(|&(pid, _)| pid);
    let got: Vec<(Pid, Released)> = stops
        .release_all(Owner::Pressure)
        .into_iter()
        .map(|(pid, r)| (pid, r.expect("release")))
        .collect();
    assert_eq!(got, want);
    a.assert_runs();
    assert_eq!(proc_state(b.pid()), 'T');
    assert_eq!(stops.held(b.pid()), Owner::Attach.into());
}

/// A BPF hash map standing for BPF's `foreign_stops` (u32 pid -> u8), as
/// the session gives it to its [`Stops`]. Needs root (CAP_BPF).
fn foreign_stops_map() -> libbpf_rs::MapHandle {
    libbpf_rs::MapHandle::create(
        libbpf_rs::MapType::Hash,
        Some("foreign_stops"),
        4,
        1,
        64,
        &libbpf_rs::libbpf_sys::bpf_map_create_opts {
            sz: size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        },
    )
    .expect("create a BPF hash map (needs root)")
}

/// Check that a process someone else stopped stays stopped when its last
/// owner lets go (issue 28: `attach --pressure-timeout inf` resumed a
/// process stopped with `kill -STOP`): with the process in the
/// foreign-stops map, held and released by the pressure owner, the release
/// reports `LeftStopped`, sends no SIGCONT, and cat stays stopped; once out
/// of the map (its stopper resumed it), a hold and release resumes it.
#[test]
fn stops_foreign_stop_left_stopped() {
    let mut cat = Cat::spawn();
    let map = foreign_stops_map();
    let stops = Stops::with_timeout(GUARD);
    stops.set_foreign_stops(
        std::os::fd::AsFd::as_fd(&map)
            .try_clone_to_owned()
            .expect("dup the map"),
    );
    let key = cat.pid().get().to_ne_bytes();
    // Stopped by someone else, then held by a pause.
    sys::kill(cat.pid(), Signal::STOP).expect("kill -STOP");
    wait_state(cat.pid(), &['T']);
    map.update(&key, &[1], libbpf_rs::MapFlags::ANY)
        .expect("mark it");
    stops.stop(cat.pid(), Owner::Pressure).expect("stop");
    assert_eq!(
        stops.release(cat.pid(), Owner::Pressure).expect("release"),
        Released::LeftStopped
    );
    assert_eq!(stops.held(cat.pid()), Owners::NONE);
    assert_eq!(proc_state(cat.pid()), 'T');
    // Its stopper resumes it (BPF clears the mark); a pause then holds
    // and resumes it as usual.
    map.delete(&key).expect("unmark it");
    sys::kill(cat.pid(), Signal::CONT).expect("kill -CONT");
    cat.assert_runs();
    stops.stop(cat.pid(), Owner::Pressure).expect("stop");
    wait_state(cat.pid(), &['T']);
    assert_eq!(
        stops.release(cat.pid(), Owner::Pressure).expect("release"),
        Released::Resumed
    );
    cat.assert_runs();
}

/// `memtrail attach PID --pressure-timeout inf` until memtrail says it is
/// attached; `during` runs then; SIGTERM detaches it. Returns memtrail's
/// exit code.
fn attach_then_detach(pid: Pid, during: impl FnOnce()) -> Option<i32> {
    let mut memtrail = Command::new(support::memtrail_bin())
        .args(["attach", &pid.to_string(), "-o", "/dev/null"])
        .args(["--pressure-timeout", "inf"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrail attach");
    let mut stderr = BufReader::new(memtrail.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.contains("attached to process") {
        line.clear();
        let n = stderr.read_line(&mut line).expect("read memtrail's stderr");
        assert!(n > 0, "memtrail ended before attaching");
    }
    during();
    sys::kill(Pid::new(memtrail.id()), Signal::TERM).expect("SIGTERM memtrail");
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    memtrail.wait().expect("reap memtrail").code()
}

/// Check that `memtrail attach --pressure-timeout inf` leaves a process
/// someone else stopped stopped when it detaches (issue 28: after detach it
/// ran), whether the stop came before the attach or during it; a process
/// nobody stopped runs on after the detach.
#[test]
fn stops_attach_leaves_foreign_stop() {
    // Stopped before the attach.
    let mut before = Cat::spawn();
    sys::kill(before.pid(), Signal::STOP).expect("kill -STOP");
    wait_state(before.pid(), &['T']);
    assert_eq!(attach_then_detach(before.pid(), || {}), Some(0));
    assert_eq!(proc_state(before.pid()), 'T', "resumed after detach");
    sys::kill(before.pid(), Signal::CONT).expect("kill -CONT");
    before.assert_runs();
    // Stopped while memtrail is attached.
    let during = Cat::spawn();
    let pid = during.pid();
    let code = attach_then_detach(pid, || {
        sys::kill(pid, Signal::STOP).expect("kill -STOP");
        wait_state(pid, &['T']);
    });
    assert_eq!(code, Some(0));
    assert_eq!(proc_state(pid), 'T', "resumed after detach");
    // Nobody stopped it.
    let mut free = Cat::spawn();
    assert_eq!(attach_then_detach(free.pid(), || {}), Some(0));
    free.assert_runs();
}

//! The guardian: the process that resumes the tree when memtrail dies
//! (issue 11). It must be invisible to memtrail's parent, survive a kill of
//! memtrail's process group, and not stand in the way when memtrail is PID 1
//! of a PID namespace.
//!
//! Parents are played by the `parent_wait` fixture, so that a `wait()` for
//! any child cannot reap a child of another test of this binary. Waits are
//! for states that must come (read from `/proc` or a pidfd), bounded by
//! [`GUARD`] only so that a broken build fails instead of hanging.

mod common;

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{MEMTRAIL, cgroup_frozen, fixture};
use memtrail::sys;

/// Bound on every wait for something that must happen.
const GUARD: Duration = Duration::from_secs(60);

/// Runs `parent_wait MODE RUNS memtrail run -q -- COMMAND` in a process
/// group of its own, killed whole if it does not finish within [`GUARD`];
/// returns its output lines.
fn parent_wait(mode: &str, runs: u32, command: &[OsString]) -> Vec<String> {
    let child = Command::new(fixture("parent_wait"))
        .arg(mode)
        .arg(runs.to_string())
        .args([MEMTRAIL, "run", "-q", "--"])
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn parent_wait");
    let group = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out: Output = match rx.recv_timeout(GUARD) {
        Ok(out) => out.expect("wait for parent_wait"),
        Err(_) => {
            // SAFETY: kill takes plain integers; the group is parent_wait's.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            panic!("parent_wait {mode} {runs} did not finish");
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "parent_wait: {stderr}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Check that a parent's first `wait()` after starting memtrail reaps
/// memtrail with its own exit status, and that no other child (the
/// guardian) is left to it (issue 11).
#[test]
fn guardian_parent_first_wait_reaps_memtrail() {
    let command = common::cmd("exit_with", &["code".as_ref(), "3".as_ref()]);
    assert_eq!(parent_wait("any", 1, &command), ["spawned 3", "left none"]);
}

/// Check that a parent that runs memtrail five times, reaping each by its
/// pid as Python's `subprocess.run` does, is left with no child and no
/// zombie: `waitpid(-1, WNOHANG)` fails with ECHILD (issue 11).
#[test]
fn guardian_leaves_no_child_to_parent() {
    let lines = parent_wait("pid", 5, &["/bin/true".into()]);
    let mut want = vec!["spawned 0"; 5];
    want.push("left none");
    assert_eq!(lines, want);
}

/// Check that memtrail exec'd as a child subreaper (as by a supervisor that
/// sets the flag before exec) does not adopt its own guardian: it does not
/// wait for it forever, and exits with the command's status (issue 11).
#[test]
fn guardian_memtrail_started_as_subreaper() {
    let command = common::cmd("exit_with", &["code".as_ref(), "4".as_ref()]);
    assert_eq!(
        parent_wait("subreaper", 1, &command),
        ["spawned 4", "left none"]
    );
}

/// Check that memtrail runs as PID 1 of a new PID namespace (a container's
/// entrypoint), where it cannot create a sibling, and exits with the
/// command's status: `unshare -pf --mount-proc memtrail run -- touch F`
/// exits 0 and F exists (issue 11).
#[test]
fn guardian_pid_namespace_init_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("ran");
    let out = Command::new("unshare")
        .args(["-pf", "--mount-proc", MEMTRAIL, "run", "-q", "--"])
        .arg("/usr/bin/touch")
        .arg(&marker)
        .stdin(Stdio::null())
        .output()
        .expect("run unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        marker.exists(),
        "the command did not run; stderr:\n{stderr}"
    );
}

/// The scheduler state letters of every thread of `pid`; empty once it is
/// gone.
fn thread_states(pid: i32) -> Vec<char> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.trim_start().chars().next()
        })
        .collect()
}

/// The session id of process `pid`, from `/proc/PID/stat`.
fn session(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/stat: {e}"));
    let (_, rest) = stat.rsplit_once(')').expect("stat has (comm)");
    // state, ppid, pgrp, session
    rest.split_whitespace()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .expect("session field")
}

/// Kills the process behind a pidfd on drop, so that a failed test leaves
/// no stopped process behind.
struct KillOnDrop(OwnedFd);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // ESRCH when it already exited.
        let _ = sys::pidfd_send_signal(self.0.as_fd(), sys::Signal::KILL);
    }
}

/// Kills a process group on drop unless disarmed, so that a failed test
/// leaves no wedged memtrail behind.
struct KillGroupOnDrop(Option<i32>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            // SAFETY: kill takes plain integers.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    }
}

/// Whether the process behind `pidfd` exits within `timeout`.
fn exits_within(pidfd: &OwnedFd, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut poll = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a pidfd polls readable once its process
        // has exited.
        let n = unsafe { libc::poll(&mut poll, 1, left.as_millis() as i32) };
        if n > 0 {
            return true;
        }
        if n == 0 || left.is_zero() {
            return false;
        }
        // EINTR: poll again until the deadline.
    }
}

/// Check that `kill -9` of memtrail's whole process group, while a
/// `setsid` grandchild of the command (in a session of its own, so the
/// kill does not reach it) is paused by memtrail, leaves that grandchild
/// running: the guardian, in a session of its own too, survives the kill
/// and resumes it, and it runs to its end (issue 11).
#[test]
fn guardian_survives_process_group_kill() {
    let dir = tempfile::tempdir().expect("temp dir");
    let done = dir.path().join("done");
    // The shell starts the storm with setsid and prints its pid; the events
    // pipeline is wedged, so the first pressure pause never ends while
    // memtrail lives.
    let mut memtrail = Command::new(MEMTRAIL)
        .args([
            "run",
            "-q",
            "--ring-size",
            "1M",
            "--pressure-timeout",
            "inf",
        ])
        .args(["--", "/bin/sh", "-c"])
        .arg(r#"setsid "$0" threads 3000 </dev/null >/dev/null 2>&1 & echo $!; wait"#)
        .arg(fixture("storm"))
        .env("MEMTRAIL_FAULT", "wedge-events")
        .env("STORM_DONE", &done)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn memtrail");
    let group = memtrail.id() as i32;
    let mut group_guard = KillGroupOnDrop(Some(group));
    let mut line = String::new();
    BufReader::new(memtrail.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the storm's pid");
    let storm: i32 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("shell output {line:?}"));
    let pidfd = sys::pidfd_open(sys::Pid::new(storm.unsigned_abs())).expect("pidfd of the storm");
    let _storm_guard = KillOnDrop(pidfd.try_clone().expect("dup the pidfd"));

    // The pressure pause, not the attach hold at its exec (when the storm
    // has one thread): a storm thread has started, and the tree's cgroup is
    // frozen (or, past the hard mark, every thread is stopped). Nothing maps
    // an executable image after that, so this is the pause, which the
    // wedged pipeline never ends.
    let deadline = Instant::now() + GUARD;
    loop {
        let states = thread_states(storm);
        let paused = states.iter().all(|&s| s == 'T') || cgroup_frozen(storm as u32);
        if states.len() > 1 && paused {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the storm was never paused: thread states {states:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        session(storm),
        storm,
        "the storm leads a session of its own"
    );

    // SAFETY: kill takes plain integers; the group is memtrail's own.
    assert_eq!(unsafe { libc::kill(-group, libc::SIGKILL) }, 0, "kill -9");
    group_guard.0 = None;
    let status = memtrail.wait().expect("reap memtrail");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    assert!(
        exits_within(&pidfd, GUARD),
        "the storm did not finish: thread states {:?}",
        thread_states(storm)
    );
    assert!(done.exists(), "the storm was killed before its end");
}

/// Check that inside a PID namespace of its own memtrail tracks its tree
/// exactly, with pids as the namespace numbers them (issue 11: BPF keyed the
/// tree by the kernel's global pids while memtrail inserted the command by
/// its namespace pid, so nothing was tracked and the run still exited 0).
#[test]
fn guardian_pid_namespace_tracks_exactly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let events = dir.path().join("events.jsonl");
    let out = Command::new("unshare")
        .args(["-pf", "--mount-proc", MEMTRAIL, "run", "-q", "--events"])
        .arg(&events)
        .arg("--")
        .arg(fixture("fork"))
        .stdin(Stdio::null())
        .output()
        .expect("run unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    let events = common::read_events(&events).expect("events written");
    let sizes = |size: u64| {
        events
            .iter()
            .filter(|e| common::kind(e) == "malloc" && e["size"].as_u64() == Some(size))
            .map(common::pid)
            .collect::<Vec<_>>()
    };
    let parent = sizes(500009);
    assert_eq!(parent.len(), 1, "{stderr}");
    let child = sizes(500029);
    assert_eq!(child.len(), 1);
    assert_eq!(sizes(300007), parent);
    assert_eq!(sizes(500057), child);
    assert_ne!(parent, child);
    // The namespace's numbers: the fork event names the child as the
    // allocations do, and both live in memtrail's /proc-visible range.
    let fork = events
        .iter()
        .find(|e| common::kind(e) == "fork")
        .expect("fork event");
    assert_eq!(common::pid(fork), parent[0]);
    assert_eq!(fork["child_pid"].as_u64(), Some(u64::from(child[0])));
    assert!(
        parent[0] < 100 && child[0] < 100,
        "not namespace pids: {parent:?} {child:?}"
    );
}

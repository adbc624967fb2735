//! Where the allocator probes go (`--probes`, issue 17): per process, only
//! the tracked tree carries breakpoints, a forked child included; system-
//! wide, every process that maps libc does. A breakpoint shows as a byte of
//! libc's code in a process's memory that differs from the file.
//!
//! A binary of its own: any system-wide capture running beside it (the
//! default of `memtrail run`) would put breakpoints in the bystander too.

mod support;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use support::*;

/// A process outside any capture, blocked on its stdin until dropped.
struct Bystander(Child);

impl Bystander {
    fn start() -> Self {
        let mut child = Command::new(fixture("alloc_on_input"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the bystander");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("bystander ready");
        assert_eq!(line, "ready\n");
        Self(child)
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs fork_wait under `memtrail run --probes PROBES` and returns how many
/// libc bytes are patched in the tracked parent, the tracked child and the
/// bystander while it runs, and the profile.
fn patched_during(probes: &str, bystander: u32) -> ([usize; 3], serde_json::Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile = dir.path().join("profile.json");
    let args: Vec<OsString> = vec![
        "run".into(),
        "--probes".into(),
        probes.into(),
        "--output".into(),
        profile.clone().into(),
        "--".into(),
        fixture("fork_wait").into(),
    ];
    let mut run = Command::new(memtrail_bin())
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let watchdog = Watchdog::new(run.id());
    let mut out = BufReader::new(run.stdout.take().expect("stdout"));
    let (mut parent, mut child) = (0, 0);
    for _ in 0..2 {
        let mut line = String::new();
        out.read_line(&mut line).expect("a pid line");
        let (who, pid) = line.trim().split_once(' ').expect("WHO PID");
        let pid: u32 = pid.parse().expect("pid");
        match who {
            "parent" => parent = pid,
            "child" => child = pid,
            other => panic!("unexpected line {other}"),
        }
    }
    let patched = [
        patched_libc_bytes(parent),
        patched_libc_bytes(child),
        patched_libc_bytes(bystander),
    ];
    run.stdin.take().expect("stdin").flush().expect("flush");
    let output = run.wait_with_output().expect("memtrail");
    watchdog.disarm();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (patched, read_profile(&profile).expect("a profile"))
}

/// Check that with per-process probes the tracked parent and its forked
/// child carry breakpoints in libc and a process outside the capture does
/// not, that the child's allocation is counted exactly all the same, and
/// that the parent keeps none once memtrail has finished; and that with
/// system-wide probes the bystander does carry them (the check can tell).
#[test]
fn probes_per_process_only_in_the_tree() {
    let bystander = Bystander::start();
    let pid = bystander.0.id();
    assert_eq!(patched_libc_bytes(pid), 0, "a tracer is already running");

    let ([parent, child, other], profile) = patched_during("per-process", pid);
    assert!(parent > 0, "the tracked parent has no breakpoint");
    assert!(child > 0, "the tracked child has no breakpoint");
    assert_eq!(other, 0, "a process outside the capture has breakpoints");
    let child_allocs: Vec<_> = processes(&profile)
        .iter()
        .filter(|p| num(p, "allocations") == 1)
        .collect();
    assert_eq!(child_allocs.len(), 1, "the child's one malloc: {profile}");
    assert_eq!(num(child_allocs[0], "live_bytes_at_exit"), 4321);
    assert_eq!(patched_libc_bytes(pid), 0);
    assert_eq!(profile["probe_scope"], "per-process");

    let ([parent, child, other], profile) = patched_during("system-wide", pid);
    assert_eq!(profile["probe_scope"], "system-wide");
    assert!(parent > 0 && child > 0);
    assert!(other > 0, "system-wide probes left the bystander alone");
    assert_eq!(patched_libc_bytes(pid), 0, "breakpoints left behind");
}

//! A session tracking a process that is already running (issue 13).

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use memtrail::Session;

use memtrail::SessionOptions;

use memtrail::Target;

/// Check that a session started on a running process's pid counts exactly
/// what it allocates from then on (7 mallocs, 2 frees), and that `wait`
/// returns once the process has exited.
#[test]
fn session_pid_counts_running_process() {
    let mut child = Command::new(support::fixture("alloc_on_input"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the fixture");
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut stdin = child.stdin.take().expect("stdin");
    assert_eq!(lines.next().expect("a line").expect("ready"), "ready");

    let mut session =
        Session::start(&SessionOptions::default(), Target::Pid(pid)).expect("a session");
    stdin.write_all(b"x").expect("go");
    assert_eq!(lines.next().expect("a line").expect("done"), "done");
    let snap = session.snapshot().expect("snapshot");
    let proc = snap
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("no process {pid} in {snap:?}"));
    assert_eq!(proc.totals.allocations, 7, "{snap:?}");
    assert_eq!(proc.totals.frees, 2, "{snap:?}");
    assert_eq!(proc.totals.allocated_bytes, 7000);
    assert_eq!(proc.totals.live_allocations, 5);

    drop(stdin);
    session.wait().expect("wait");
    assert!(child.wait().expect("reap").success());
    let finish = session.finish().expect("finish");
    assert_eq!(finish.profile.totals.allocations, 7);
}

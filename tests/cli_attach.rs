//! `memtrail attach PID`: tracking a running process for a window, then
//! leaving it exactly as it was (issue 15).
//!
//! The fixture (`attach_target`) reads one-byte commands from a pipe and
//! acknowledges each once done, so a test knows exactly what the process
//! did inside the attached window: memtrail says when it has attached (a
//! line on stderr), the test then sends the commands, waits for their
//! acknowledgements and sends memtrail SIGINT.
//!
//! A binary of its own: its captures are all per process, and it checks
//! that a process outside them carries no breakpoint, which any system-wide
//! capture running beside it (the default of `memtrail run`) would put there.

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use support::{
    MEMTRAIL, fixture, kind, num, of_pid, pid, process, read_events, read_profile, sized,
};

/// Hang detector for one step (not a timing assertion).
const LIMIT: Duration = Duration::from_secs(120);

/// The running fixture and its command pipe.
struct Target {
    child: Child,
    stdin: Option<ChildStdin>,
    acks: std::io::Lines<BufReader<std::process::ChildStdout>>,
    pid: u32,
}

impl Target {
    fn start() -> Self {
        let mut child = Command::new(fixture("attach_target"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start attach_target");
        let pid = child.id();
        let stdin = child.stdin.take().expect("stdin");
        let mut acks = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = acks.next().expect("a line").expect("ready");
        assert_eq!(ready, format!("ready {pid}"));
        Self {
            child,
            stdin: Some(stdin),
            acks,
            pid,
        }
    }

    /// Sends each command byte and waits for its acknowledgement.
    fn run(&mut self, commands: &str) {
        for c in commands.chars() {
            let stdin = self.stdin.as_mut().expect("stdin open");
            stdin.write_all(&[c as u8]).expect("send a command");
            stdin.flush().expect("flush");
            let ack = self.acks.next().expect("an ack").expect("read an ack");
            assert_eq!(ack, c.to_string());
        }
    }

    /// Closes its stdin: it exits 0.
    fn close(&mut self) {
        self.stdin = None;
    }

    /// The process's state letter (`/proc/PID/stat`).
    fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).expect("stat");
        let (_, rest) = stat.rsplit_once(')').expect("stat format");
        rest.trim_start().chars().next().expect("a state")
    }

    /// Whether a SIGSTOP is pending for it or any of its threads.
    fn stop_pending(&self) -> bool {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).expect("status");
        status
            .lines()
            .filter_map(|l| {
                l.strip_prefix("SigPnd:")
                    .or_else(|| l.strip_prefix("ShdPnd:"))
            })
            .any(|m| u64::from_str_radix(m.trim(), 16).expect("hex") & (1 << 18) != 0)
    }

    fn cgroup(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid)).expect("cgroup")
    }

    /// Checks that it runs as before: not stopped, no stop pending, and it
    /// still does what it is told.
    fn assert_running(&mut self) {
        assert!(!matches!(self.state(), 'T' | 't'), "stopped");
        assert!(!self.stop_pending(), "a SIGSTOP is pending");
        self.run("a");
        assert!(!matches!(self.state(), 'T' | 't'), "stopped");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// memtrail attached, and its stderr lines as they come.
struct Attached {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: String,
}

impl Attached {
    /// Starts `memtrail attach ARGS` and waits until it says it attached.
    fn start(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(MEMTRAIL)
            .arg("attach")
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn memtrail");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut me = Self {
            child,
            lines,
            stderr: String::new(),
        };
        while !me.stderr.contains("memtrail: attached to process") {
            let line = me
                .lines
                .recv_timeout(LIMIT)
                .unwrap_or_else(|e| panic!("memtrail did not attach ({e}): {}", me.stderr));
            me.stderr.push_str(&line);
            me.stderr.push('\n');
        }
        me
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGINT (as Ctrl-C would).
    fn interrupt(&self) {
        // SAFETY: kill takes plain integers.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, libc::SIGINT) }, 0);
    }

    /// Waits for memtrail's exit; its code and whole stderr.
    fn wait(mut self) -> (i32, String) {
        let status = support::wait_or_kill(&mut self.child, LIMIT).expect("memtrail hung");
        while let Ok(line) = self.lines.recv_timeout(LIMIT) {
            self.stderr.push_str(&line);
            self.stderr.push('\n');
        }
        (status.code().expect("memtrail exited"), self.stderr)
    }
}

/// The BPF link ids process `pid` holds through its descriptors.
fn link_ids(pid: u32) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).expect("fdinfo") {
        let Ok(info) = std::fs::read_to_string(entry.expect("fd").path()) else {
            continue;
        };
        ids.extend(
            info.lines()
                .filter_map(|l| l.strip_prefix("link_id:"))
                .filter_map(|v| v.trim().parse::<u64>().ok()),
        );
    }
    ids
}

/// Every BPF link the kernel has.
fn kernel_links() -> BTreeSet<u64> {
    let out = Command::new("bpftool")
        .args(["-j", "link", "show"])
        .output()
        .expect("run bpftool");
    assert!(out.status.success());
    let list: Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    list.as_array()
        .expect("an array")
        .iter()
        .filter_map(|l| l["id"].as_u64())
        .collect()
}

fn totals(v: &Value) -> (u64, u64, u64) {
    (
        num(v, "allocations"),
        num(v, "frees"),
        num(v, "unmatched_frees"),
    )
}

/// Check that `memtrail attach` counts exactly what the process did inside
/// the window (5 mallocs and 2 frees of its own, 1 free of a block made
/// before the attach, a child's 2 mallocs and 1 free) and nothing before
/// it, with breakpoints in its memory and none in another process's (per-
/// process probes), and that after SIGINT the process runs on: not stopped,
/// in its own cgroup, with none of memtrail's probe links left in the
/// kernel and no breakpoint left in its memory.
#[test]
fn attach_counts_window_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let events_path = dir.path().join("e.jsonl");
    let mut target = Target::start();
    let bystander = Target::start();
    // Done before the attach: not in the capture.
    target.run("aaf");
    let cgroup = target.cgroup();
    let pid_arg = target.pid.to_string();
    let memtrail = Attached::start(
        &[
            pid_arg.as_ref(),
            "-o".as_ref(),
            profile_path.as_os_str(),
            "--events".as_ref(),
            events_path.as_os_str(),
        ],
        &[],
    );
    let links = link_ids(memtrail.pid());
    assert!(!links.is_empty(), "memtrail holds no probe link");
    // Probes per process: in the target's libc, not in the bystander's
    // (every test of this binary attaches, so no capture here probes
    // system-wide).
    assert!(
        support::patched_libc_bytes(target.pid) > 0,
        "no breakpoint in the target"
    );
    assert_eq!(
        support::patched_libc_bytes(bystander.pid),
        0,
        "attaching put breakpoints in another process"
    );
    // The probes are in: two blocks allocated before stay unknown.
    target.run("aaaaaffpk");
    memtrail.interrupt();
    let (code, stderr) = memtrail.wait();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("detached on SIGINT"), "{stderr}");

    let profile = read_profile(&profile_path).expect("a profile");
    assert_eq!(totals(&profile["totals"]), (7, 3, 1), "{profile:#}");
    assert_eq!(
        num(&profile["totals"], "allocated_bytes"),
        5 * 1000 + 2 * 500
    );
    let root = process(&profile, target.pid);
    assert_eq!(totals(root), (5, 2, 1), "{root:#}");
    let events = read_events(&events_path).expect("events");
    assert_eq!(sized(&events, "malloc", 1000).len(), 5);
    let fork = events
        .iter()
        .find(|e| kind(e) == "fork" && pid(e) == target.pid)
        .expect("the fork");
    let child = num(fork, "child_pid") as u32;
    assert_eq!(totals(process(&profile, child)), (2, 1, 0));
    let child_events = of_pid(&events, child);
    assert_eq!(
        child_events
            .iter()
            .filter(|e| kind(e) == "malloc" && num(e, "size") == 500)
            .count(),
        2
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| kind(e) == "free" && pid(e) == target.pid)
            .count(),
        3
    );

    // Left as it was.
    target.assert_running();
    assert_eq!(target.cgroup(), cgroup);
    assert_eq!(
        support::patched_libc_bytes(target.pid),
        0,
        "breakpoints left"
    );
    let left: Vec<u64> = kernel_links().intersection(&links).copied().collect();
    assert!(left.is_empty(), "links left behind: {left:?}");
}

/// Check that `--duration` detaches on its own (exit 0, nothing counted
/// since nothing happened) and that the process runs on.
#[test]
fn attach_duration_detaches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let mut target = Target::start();
    let pid_arg = target.pid.to_string();
    let memtrail = Attached::start(
        &[
            pid_arg.as_ref(),
            "--duration".as_ref(),
            "300ms".as_ref(),
            "-o".as_ref(),
            profile_path.as_os_str(),
        ],
        &[],
    );
    let (code, stderr) = memtrail.wait();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("detached after --duration"), "{stderr}");
    let profile = read_profile(&profile_path).expect("a profile");
    assert_eq!(totals(&profile["totals"]), (0, 0, 0));
    target.assert_running();
}

/// Check that the process's exit ends the capture (exit 0), with what it
/// did before.
#[test]
fn attach_process_exit_ends_capture() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let mut target = Target::start();
    let pid_arg = target.pid.to_string();
    let memtrail = Attached::start(
        &[pid_arg.as_ref(), "-o".as_ref(), profile_path.as_os_str()],
        &[],
    );
    target.run("aaa");
    target.close();
    let (code, stderr) = memtrail.wait();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("detached when it exited"), "{stderr}");
    let profile = read_profile(&profile_path).expect("a profile");
    assert_eq!(totals(&profile["totals"]), (3, 0, 0));
}

/// Check that a pid that names no process, a kernel thread's and a
/// zombie's are refused with exit 78 and a clear message, and no profile
/// is written.
#[test]
fn attach_bad_pid_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    // A pid that was just freed (reaped).
    let mut gone = Command::new("true").spawn().expect("true");
    let gone_pid = gone.id();
    gone.wait().expect("reap");
    // A zombie: exited, not reaped.
    let mut zombie = Command::new("true").spawn().expect("true");
    let zombie_pid = zombie.id();
    while std::fs::read_to_string(format!("/proc/{zombie_pid}/stat"))
        .is_ok_and(|s| !s.contains(") Z"))
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    for (pid, message) in [
        (gone_pid, format!("no process has pid {gone_pid}")),
        (2, "it is a kernel thread".to_owned()),
        (zombie_pid, "it has exited (a zombie)".to_owned()),
    ] {
        let out = Command::new(MEMTRAIL)
            .args(["attach", &pid.to_string(), "-o"])
            .arg(&profile_path)
            .output()
            .expect("run memtrail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{pid}: {stderr}");
        assert!(stderr.contains(&message), "{stderr}");
        assert!(!profile_path.exists());
    }
    zombie.wait().expect("reap");
}

/// Check that a pressure episode that cannot recover within a finite
/// --pressure-timeout (the events poller wedged) detaches instead of
/// killing: exit 77, no profile, and the process runs on, finishing what
/// it was doing.
#[test]
fn attach_pressure_timeout_detaches_not_kills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let mut target = Target::start();
    let pid_arg = target.pid.to_string();
    let memtrail = Attached::start(
        &[
            pid_arg.as_ref(),
            "--ring-size".as_ref(),
            "64K".as_ref(),
            "--pressure-timeout".as_ref(),
            "250ms".as_ref(),
            "-o".as_ref(),
            profile_path.as_os_str(),
        ],
        &[("MEMTRAIL_FAULT", "wedge-events")],
    );
    // 4000 events overrun a 64 KiB ring: the pause cannot drain.
    target.run("m");
    let (code, stderr) = memtrail.wait();
    assert_eq!(code, 77, "{stderr}");
    assert!(
        stderr.contains("detached, leaving them running"),
        "{stderr}"
    );
    assert!(!profile_path.exists());
    target.assert_running();
    target.run("m");
}

/// Check that an attach window names the blocks still live at the end
/// "live at detach", not "leaked (live at exit)" (issue 15): 3 blocks of
/// 1000 bytes allocated inside the window, 1 freed, 2 still live at detach,
/// in the summary, the profile (`attached`) and the text report by leaked.
#[test]
fn attach_live_at_detach_wording() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let report_path = dir.path().join("r.txt");
    let mut target = Target::start();
    let pid_arg = target.pid.to_string();
    let memtrail = Attached::start(
        &[
            pid_arg.as_ref(),
            "-o".as_ref(),
            profile_path.as_os_str(),
            "--report".as_ref(),
            "text".as_ref(),
            "--report-by".as_ref(),
            "leaked".as_ref(),
            "--report-output".as_ref(),
            report_path.as_os_str(),
        ],
        &[],
    );
    target.run("aaaf");
    memtrail.interrupt();
    let (code, stderr) = memtrail.wait();
    assert_eq!(code, 0, "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("  not freed "))
        .unwrap_or_else(|| panic!("no live-at-detach line: {stderr}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &words[..7],
        ["not", "freed", "2", "2.0", "KiB", "(live", "at"]
    );
    assert!(line.contains("not freed before detach"), "{line}");
    assert!(!stderr.contains("leaked"), "{stderr}");
    assert!(!stderr.contains("live at exit"), "{stderr}");

    let profile = read_profile(&profile_path).expect("a profile");
    assert_eq!(profile["attached"], Value::Bool(true));
    assert_eq!(num(&profile["totals"], "live_allocations_at_exit"), 2);
    assert_eq!(num(&profile["totals"], "live_bytes_at_exit"), 2000);

    let report = std::fs::read_to_string(&report_path).expect("the report");
    assert!(
        report.contains("peak live 2.9 KiB, live at detach 2 blocks (2.0 KiB)"),
        "{report}"
    );
    assert!(report.contains("by bytes live at detach"), "{report}");
    assert!(
        report.contains("2.0 KiB live at detach (100.0%"),
        "{report}"
    );
    assert!(!report.contains("leaked"), "{report}");
    target.assert_running();
}

/// Check that an attach profile names the executables (issue 26: every
/// `exe` was "" and the root's `ppid` 0): the attached process's is its
/// executable and its parent the process that started it, a child it forks
/// inherits the executable, every stack names it, `memtrail report --exe`
/// finds it by file name and the summary's executables column shows it.
#[test]
fn attach_names_executables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let mut target = Target::start();
    let exe = fixture("attach_target");
    let exe_str = exe.to_str().expect("UTF-8 path");
    let pid_arg = target.pid.to_string();
    let memtrail = Attached::start(
        &[pid_arg.as_ref(), "-o".as_ref(), profile_path.as_os_str()],
        &[],
    );
    target.run("aak");
    memtrail.interrupt();
    let (code, stderr) = memtrail.wait();
    assert_eq!(code, 0, "{stderr}");

    let profile = read_profile(&profile_path).expect("a profile");
    let root = process(&profile, target.pid);
    assert_eq!(root["exe"], exe_str, "{root:#}");
    assert_eq!(num(root, "ppid"), u64::from(std::process::id()), "{root:#}");
    let procs = support::processes(&profile);
    assert_eq!(procs.len(), 2, "{procs:#?}");
    for p in procs {
        assert_eq!(p["exe"], exe_str, "{p:#}");
    }
    let stacks = profile["stacks"].as_array().expect("stacks");
    assert!(!stacks.is_empty());
    for s in stacks {
        assert_eq!(s["exe"], exe_str, "{s:#}");
    }
    // The summary's line for the executable: 2 processes, 4 allocations.
    let row = stderr
        .lines()
        .find(|l| l.ends_with(exe_str))
        .unwrap_or_else(|| panic!("no executable row: {stderr}"));
    assert_eq!(
        row.split_whitespace().take(3).collect::<Vec<_>>(),
        ["2", "4", "1"]
    );

    let name = exe
        .file_name()
        .expect("a file name")
        .to_str()
        .expect("UTF-8");
    let out = Command::new(MEMTRAIL)
        .args(["report", "--exe", name, "-f", "folded"])
        .arg(&profile_path)
        .output()
        .expect("run memtrail report");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes: u64 = stdout
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    assert_eq!(bytes, 2 * 1000 + 2 * 500, "{stdout}");
    target.assert_running();
}

/// Check that the summary and the text report say what became of the
/// attached process (issue 26: both said it "ended" while it ran on):
/// after `--duration`, still running when memtrail detached; when it
/// exits while attached, its exit code, in the profile's `exit` too.
#[test]
fn attach_says_whether_process_runs_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let report_path = dir.path().join("r.txt");
    let mut target = Target::start();
    let exe = fixture("attach_target");
    let exe_str = exe.to_str().expect("UTF-8 path");
    let pid_arg = target.pid.to_string();
    let args: [&std::ffi::OsStr; 8] = [
        pid_arg.as_ref(),
        "-o".as_ref(),
        profile_path.as_os_str(),
        "--report".as_ref(),
        "text".as_ref(),
        "--report-output".as_ref(),
        report_path.as_os_str(),
        "--force".as_ref(),
    ];
    let mut with_duration = args.to_vec();
    with_duration.extend::<[&std::ffi::OsStr; 2]>(["--duration".as_ref(), "300ms".as_ref()]);
    let (code, stderr) = Attached::start(&with_duration, &[]).wait();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "memtrail: {exe_str} still running: detached after "
        )),
        "{stderr}"
    );
    let report = std::fs::read_to_string(&report_path).expect("the report");
    let header = report.lines().next().expect("a header");
    assert!(
        header.starts_with(&format!(
            "memtrail report: {exe_str} (still running: detached after "
        )),
        "{report}"
    );
    for text in [&stderr, &report] {
        assert!(!text.contains("ended"), "{text}");
    }
    let profile = read_profile(&profile_path).expect("a profile");
    assert_eq!(profile["exit"]["code"], Value::Null);
    target.assert_running();

    let memtrail = Attached::start(&args, &[]);
    target.run("a");
    target.close();
    let (code, stderr) = memtrail.wait();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("memtrail: {exe_str} exited with code 0 after ")),
        "{stderr}"
    );
    let report = std::fs::read_to_string(&report_path).expect("the report");
    assert!(
        report.starts_with(&format!(
            "memtrail report: {exe_str} (exited with code 0 after "
        )),
        "{report}"
    );
    let profile = read_profile(&profile_path).expect("a profile");
    assert_eq!(profile["exit"]["code"], 0, "{:#}", profile["exit"]);
    assert_eq!(profile["exit"]["signal"], Value::Null);
}

/// Check that every pid naming no process memtrail can attach to exits 78
/// as documented (issue 26: `attach 0` exited 2, a pid past 2^31 and a
/// thread's id 70), each with a message that says why.
#[test]
fn attach_pids_naming_no_process_are_78() {
    // This test's thread, not its process's main thread.
    // SAFETY: gettid takes nothing and cannot fail.
    let tid = unsafe { libc::gettid() } as u32;
    let me = std::process::id();
    assert_ne!(tid, me, "the test runs on the main thread");
    for (pid, message) in [
        ("0".to_owned(), "no process has pid 0".to_owned()),
        (
            "2147483648".to_owned(),
            "no process has pid 2147483648".to_owned(),
        ),
        (
            "4294967295".to_owned(),
            "no process has pid 4294967295".to_owned(),
        ),
        (
            tid.to_string(),
            format!("{tid} is a thread of process {me}, not a process: attach to {me}"),
        ),
    ] {
        let out = Command::new(MEMTRAIL)
            .args(["attach", &pid, "-o", "/dev/null"])
            .output()
            .expect("run memtrail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{pid}: {stderr}");
        assert!(stderr.contains(&message), "{pid}: {stderr}");
    }
}

/// Check that attaching to a program whose threads come and go while others
/// allocate (600 threads in waves of 8, then of 32, then 300 at once; 1,000
/// malloc/free pairs each, all inside the window) leaves it alive, exiting
/// 0, with every call's return handed back at its caller's stack, and
/// counts its pairs exactly (issue 40: attaching to such a program was seen
/// to kill it, SIGABRT from glibc's heap check).
#[test]
fn attach_thread_churn_lives_exact() {
    for (wave, threads) in support::CHURN_WAVES {
        let dir = tempfile::tempdir().expect("tempdir");
        let profile_path = dir.path().join("p.json");
        let mut child = support::KillOnDrop(
            Command::new(fixture("churn"))
                .args([wave, threads, support::CHURN_PAIRS].map(|n| n.to_string()))
                .arg("wait")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start churn"),
        );
        let target = child.0.id();
        let mut stdin = child.0.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.0.stdout.take().expect("stdout")).lines();
        let mut line = || lines.next().expect("a line").expect("read a line");
        assert_eq!(line(), format!("ready {target}"));
        let pid_arg = target.to_string();
        let memtrail = Attached::start(
            &[pid_arg.as_ref(), "-o".as_ref(), profile_path.as_os_str()],
            &[],
        );
        // Attached: the threads start now, and end before it exits.
        stdin.write_all(b"g").expect("start the waves");
        assert_eq!(line(), format!("churn {threads} {}", support::CHURN_PAIRS));
        drop(stdin);
        let status = support::wait_or_kill(&mut child.0, LIMIT).expect("churn hung");
        assert_eq!(status.code(), Some(0), "waves of {wave}: {status}");
        let (code, stderr) = memtrail.wait();
        assert_eq!(code, 0, "{stderr}");
        assert!(stderr.contains("detached when it exited"), "{stderr}");
        assert!(!stderr.contains(support::RETURNS_ELSEWHERE), "{stderr}");
        let profile = read_profile(&profile_path).expect("a profile");
        support::check_churn_totals(&profile["totals"], threads, 17 * 16, 1);
    }
}

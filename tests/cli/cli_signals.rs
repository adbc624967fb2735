//! Signals sent to memtrail (issue 11, parts 6 and 8): SIGTERM and SIGHUP
//! before the command starts end memtrail cleanly (128+N, a message, no
//! file); SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 once it runs reach the
//! command, and memtrail reports what it has; SIGKILL leaves no temporary
//! file next to the outputs.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::{MEMTRAIL, dir_entries, fixture, read_profile};

/// How long a test waits for a line it is owed before failing (instead of
/// hanging when memtrail broke).
const WATCHDOG: Duration = Duration::from_secs(120);

fn spawn(args: &[OsString]) -> Child {
    spawn_env(args, &[])
}

fn spawn_env(args: &[OsString], env: &[(&str, &str)]) -> Child {
    Command::new(MEMTRAIL)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrail")
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: kill takes plain integers.
    let ret = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(ret, 0, "kill({pid}, {sig})");
}

/// Kills the command when the test ends, however it ends.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill takes plain integers; the pid may be gone.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

/// The command's stdout, line by line, read on a thread so that a line
/// that never comes fails the test after [`WATCHDOG`].
struct Lines(mpsc::Receiver<String>);

impl Lines {
    fn new(stdout: ChildStdout) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self(rx)
    }

    fn next(&self) -> String {
        self.0
            .recv_timeout(WATCHDOG)
            .expect("a line from the command")
    }

    /// Reads `ready PID`; returns PID.
    fn ready(&self) -> u32 {
        let line = self.next();
        line.strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("not a ready line: {line:?}"))
    }
}

/// How many files under `dir` `pid` has open (unnamed `O_TMPFILE` files
/// included: they show as `DIR/#INODE (deleted)`), not counting `dir`
/// itself.
fn files_under(pid: u32, dir: &Path) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.starts_with(dir) && t != dir)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// The state letter of /proc/PID/stat.
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    after.chars().next().expect("state")
}

/// memtrail's threads but the two that work ahead during set-up, preparing
/// the up-front images and loading the symbolizer's files (they block the
/// signals memtrail forwards, so they reach the main thread). Such a thread
/// names itself once it runs: until then it has the main thread's name,
/// and is told apart by its tid.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("read task")
        .filter_map(Result::ok)
        .filter(|task| {
            let main = task.file_name().to_str() == Some(&pid.to_string());
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| {
                let comm = comm.trim_end();
                main || !matches!(comm, "memtrail-upfron" | "memtrail-symbol" | "memtrail")
            })
        })
        .count()
}

fn outputs(dir: &Path) -> Vec<OsString> {
    vec![
        "run".into(),
        "--output".into(),
        dir.join("p.json").into(),
        "--events".into(),
        dir.join("e.jsonl").into(),
        "--report".into(),
        "json".into(),
        "--report-output".into(),
        dir.join("r.json").into(),
    ]
}

/// Check that a memtrail killed with SIGKILL while the command runs leaves
/// no temporary file in its outputs' directory (issue 11: it left an empty
/// `.NAME.XXXX.tmp` for each of --output, --events and --report-output).
#[test]
fn cli_sigkill_leaves_no_temp_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = outputs(dir.path());
    args.extend(["--".into(), fixture("wait_stdin").into()]);
    let mut child = spawn(&args);
    let lines = Lines::new(child.stdout.take().expect("stdout"));
    let command = lines.ready();
    let _cleanup = KillOnDrop(command);
    // The three outputs are open, and have been since before the command.
    assert_eq!(files_under(child.id(), dir.path()), 3);
    kill(child.id(), libc::SIGKILL);
    let status = child.wait().expect("wait for memtrail");
    assert_eq!(status.code(), None, "memtrail was not killed");
    // EOF ends the command.
    drop(child.stdin.take());
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

/// Check that SIGTERM or SIGHUP reaching memtrail before it starts the
/// command ends it cleanly: exit 128+N, a message saying so, nothing run,
/// no file left; and that a SIGUSR1 then is ignored, with a note (issue 11:
/// memtrail died of the signal, leaving `.p.json.XXXX.tmp`, with no
/// message).
#[test]
fn cli_sigterm_before_command_abandons() {
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = outputs(dir.path());
        args.extend([
            "--".into(),
            fixture("touch_marker").into(),
            dir.path().join("marker").into(),
        ]);
        // The outputs are opened first thing; the command starts after the
        // BPF programs are loaded and attached. The fault hook stops
        // memtrail right after it opened them (waiting for the files and
        // then stopping it raced its next steps).
        let mut child = spawn_env(&args, &[("MEMTRAIL_FAULT", "stop-after-outputs")]);
        let pid = child.id();
        while state(pid) != 'T' {
            assert!(
                child.try_wait().expect("try_wait").is_none(),
                "memtrail ended early"
            );
            std::thread::yield_now();
        }
        assert_eq!(files_under(pid, dir.path()), 3, "the outputs are open");
        // Still one thread (the pollers start later): the signals sent now
        // are handled by it, as it resumes, before it goes on.
        assert_eq!(threads(pid), 1, "memtrail got further than its set-up");
        kill(pid, sig);
        kill(pid, libc::SIGUSR1);
        kill(pid, libc::SIGCONT);
        let out = child.wait_with_output().expect("wait for memtrail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + sig), "{sig}: {stderr}");
        // libbpf's own notes (a RLIMIT_MEMLOCK bump it could not make while
        // the signal was handled) are not memtrail's messages.
        let stderr: String = stderr
            .lines()
            .filter(|l| !l.starts_with("libbpf: "))
            .map(|l| format!("{l}\n"))
            .collect();
        let name = if sig == libc::SIGTERM {
            "SIGTERM"
        } else {
            "SIGHUP"
        };
        assert_eq!(
            stderr,
            format!(
                "memtrail: received SIGUSR1 before the command started: ignored it\n\
                 memtrail: error: {name} received before the command started: nothing was \
                 run and no output written\n"
            )
        );
        assert_eq!(dir_entries(dir.path()), Vec::<String>::new(), "{name}");
    }
}

/// Check that SIGTERM or SIGHUP sent to memtrail while the command runs is
/// passed on to it, and that memtrail then reports what it captured, says
/// so, and exits as the command did (issue 11).
#[test]
fn cli_sigterm_reaches_command() {
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = spawn(&[
            "run".into(),
            "--output".into(),
            dir.path().join("p.json").into(),
            "--".into(),
            fixture("wait_stdin").into(),
        ]);
        let lines = Lines::new(child.stdout.take().expect("stdout"));
        let _cleanup = KillOnDrop(lines.ready());
        // Held open: only the signal may end the command.
        let stdin = child.stdin.take();
        kill(child.id(), sig);
        let out = child.wait_with_output().expect("wait for memtrail");
        drop(stdin);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + sig), "{sig}: {stderr}");
        // libbpf's own notes (a RLIMIT_MEMLOCK bump it could not make while
        // the signal was handled) are not memtrail's messages.
        let stderr: String = stderr
            .lines()
            .filter(|l| !l.starts_with("libbpf: "))
            .map(|l| format!("{l}\n"))
            .collect();
        let name = if sig == libc::SIGTERM {
            "SIGTERM"
        } else {
            "SIGHUP"
        };
        assert!(
            stderr.starts_with(&format!(
                "memtrail: received {name}: passed it on to the command\n"
            )),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!("was killed by signal {sig} after")),
            "{stderr}"
        );
        let profile = read_profile(&dir.path().join("p.json")).expect("a profile");
        assert_eq!(profile["exit"]["signal"], sig, "{name}");
        assert_eq!(dir_entries(dir.path()), ["p.json"], "{name}");
    }
}

/// Check that SIGUSR1 and SIGUSR2 sent to memtrail while the command runs
/// are passed on to the command, and memtrail keeps tracking it to the end
/// (issue 11: SIGUSR1 killed memtrail, without a summary, and left the
/// command running untracked).
#[test]
fn cli_sigusr_reaches_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = spawn(&[
        "run".into(),
        "--output".into(),
        dir.path().join("p.json").into(),
        "--".into(),
        fixture("wait_usr").into(),
    ]);
    let lines = Lines::new(child.stdout.take().expect("stdout"));
    let _cleanup = KillOnDrop(lines.ready());
    kill(child.id(), libc::SIGUSR1);
    assert_eq!(lines.next(), format!("got {}", libc::SIGUSR1));
    kill(child.id(), libc::SIGUSR2);
    assert_eq!(lines.next(), format!("got {}", libc::SIGUSR2));
    let out = child.wait_with_output().expect("wait for memtrail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.starts_with(
            "memtrail: received SIGUSR1: passed it on to the command\n\
             memtrail: received SIGUSR2: passed it on to the command\n\
             memtrail: "
        ),
        "{stderr}"
    );
    assert!(stderr.contains("exited with code 0"), "{stderr}");
    let profile = read_profile(&dir.path().join("p.json")).expect("a profile");
    assert_eq!(profile["exit"]["code"], 0);
}

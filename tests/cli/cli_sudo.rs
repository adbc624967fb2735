//! memtrail started through sudo (issue 16): the command runs as the
//! invoking user with that user's environment, and the files memtrail
//! writes are that user's.
//!
//! sudo itself is not needed: memtrail knows the invoking user from
//! `SUDO_UID` and `SUDO_GID`, which these tests set as sudo does, leaving
//! root's `HOME`, `USER`, `LOGNAME` and `SHELL` as `sudo` without `-H`
//! leaves them. The user is `nobody`, whom every Debian system has.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::support::{Counters, dir_entries, fixture, memtrail_env, num, processes};

const NOBODY: u32 = 65534;

/// Check that under sudo the command sees the invoking user's `HOME`,
/// `USER`, `LOGNAME` and `SHELL` (from passwd, as `sudo -u` sets them) and
/// runs with the user's ids, that the rest of the environment is passed on,
/// and that the profile, the event stream and the report memtrail writes
/// belong to the user (issue 16: root's HOME was kept, `touch $HOME/x`
/// failed, and the files were root's).
#[test]
fn cli_sudo_command_gets_user_environment_and_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    fs::set_permissions(d, fs::Permissions::from_mode(0o777)).expect("chmod");
    let seen = d.join("env");
    let script = format!(
        "printf '%s\\n' \"$HOME\" \"$USER\" \"$LOGNAME\" \"$SHELL\" \"$KEPT\" \"$(id -u)\" \"$(id -g)\" > {}",
        seen.display()
    );
    let mut args: Vec<OsString> = vec!["run".into(), "-q".into(), "-o".into()];
    args.push(d.join("p.json").into());
    args.push("--events".into());
    args.push(d.join("e.jsonl").into());
    args.extend(["--report", "json", "--report-output"].map(OsString::from));
    args.push(d.join("r.json").into());
    args.extend(["/bin/sh", "-c", &script].map(OsString::from));
    let sudo_env = [
        ("SUDO_UID", "65534"),
        ("SUDO_GID", "65534"),
        ("SUDO_USER", "nobody"),
        ("HOME", "/root"),
        ("USER", "root"),
        ("LOGNAME", "root"),
        ("SHELL", "/bin/bash"),
        ("KEPT", "kept"),
    ];
    let (_, status, _, stderr) = memtrail_env(&args, b"", &sudo_env);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(
        fs::read_to_string(&seen).expect("the command wrote its environment"),
        "/nonexistent\nnobody\nnobody\n/usr/sbin/nologin\nkept\n65534\n65534\n"
    );
    assert_eq!(
        dir_entries(d),
        ["e.jsonl", "env", "p.json", "r.json"],
        "{stderr}"
    );
    for name in ["e.jsonl", "env", "p.json", "r.json"] {
        let meta = fs::metadata(d.join(name)).expect("stat");
        assert_eq!((meta.uid(), meta.gid()), (NOBODY, NOBODY), "{name}");
    }
}

/// Check that without `SUDO_UID` (memtrail run as root itself) the command
/// keeps memtrail's environment and ids, and the files stay root's.
#[test]
fn cli_sudo_root_without_sudo_keeps_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let seen = d.join("env");
    let script = format!(
        "printf '%s\\n' \"$HOME\" \"$USER\" \"$(id -u)\" > {}",
        seen.display()
    );
    let mut args: Vec<OsString> = vec!["run".into(), "-q".into(), "-o".into()];
    args.push(d.join("p.json").into());
    args.extend(["/bin/sh", "-c", &script].map(OsString::from));
    let (_, status, _, stderr) =
        memtrail_env(&args, b"", &[("HOME", "/somewhere"), ("USER", "someone")]);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(
        fs::read_to_string(&seen).expect("read"),
        "/somewhere\nsomeone\n0\n"
    );
    assert_eq!(fs::metadata(d.join("p.json")).expect("stat").uid(), 0);
}

/// Check that under sudo `--preload` reaches the command run as the
/// invoking user (issue 40: its `LD_PRELOAD` named `/proc/<memtrail>/fd/N`,
/// which that user may not open; ld.so printed "cannot be preloaded" on
/// the program's stderr and the capture silently took the probes): the
/// process loads the shim, takes its rings, is counted exactly, and nothing
/// of ld.so's is printed.
#[test]
fn cli_sudo_preload_reaches_the_users_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    fs::set_permissions(d, fs::Permissions::from_mode(0o755)).expect("chmod");
    // A copy nobody can reach: the fixture may sit behind a directory only
    // root can search (a clone under /root, issue 26).
    let pairs = d.join("pairs");
    fs::copy(fixture("pairs"), &pairs).expect("copy the fixture");
    fs::set_permissions(&pairs, fs::Permissions::from_mode(0o755)).expect("chmod");
    let profile = d.join("p.json");
    let mut args: Vec<OsString> = vec!["run".into(), "--preload".into(), "-o".into()];
    args.push(profile.clone().into());
    args.push(pairs.into());
    args.push("1000".into());
    let sudo_env = [
        ("SUDO_UID", "65534"),
        ("SUDO_GID", "65534"),
        ("SUDO_USER", "nobody"),
        ("MEMTRAIL_LOG", "debug"),
    ];
    let (_, status, _, stderr) = memtrail_env(&args, b"", &sudo_env);
    assert_eq!(status.code(), Some(0), "{stderr}");
    for ld_so in ["cannot be preloaded", "ld.so", "LD_PRELOAD"] {
        assert!(!stderr.contains(ld_so), "{ld_so}: {stderr}");
    }
    let profile: serde_json::Value =
        serde_json::from_slice(&fs::read(&profile).expect("read the profile")).expect("json");
    let procs = processes(&profile);
    assert_eq!(procs.len(), 1, "{profile}");
    let pid = num(&procs[0], "pid");
    assert_eq!(procs[0]["preloaded"], true, "{profile}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("preload rings taken") && l.contains(&format!("pid={pid}"))),
        "the process took no rings: {stderr}"
    );
    let bytes: u64 = (0..1000u64).map(|i| 64 + (i & 63)).sum();
    assert_eq!(
        Counters::of(&procs[0]),
        Counters {
            allocations: 1000,
            frees: 1000,
            allocated_bytes: bytes,
            freed_bytes: bytes,
            peak_live_bytes: 127,
            ..Counters::default()
        },
        "{stderr}"
    );
}

/// The `(pid, state)` of each process whose parent is `parent` and whose
/// command name is `comm`.
fn children_named(parent: u32, comm: &str) -> Vec<(u32, char)> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if &stat[open + 1..close] == comm && fields.get(1) == Some(&parent.to_string().as_str()) {
            let pid = stat[..open].trim().parse().expect("pid");
            found.push((pid, fields[0].chars().next().unwrap_or('?')));
        }
    }
    found
}

/// Check that under sudo the process that holds the preload shim for the
/// user (issue 40: `mt-shim-keeper`) is the user's, holds nothing but the
/// shim and memtrail's pidfd, and does not outlive a memtrail killed with
/// SIGKILL: nothing of the capture is left behind.
#[test]
fn cli_sudo_preload_keeper_dies_with_memtrail() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    fs::set_permissions(d, fs::Permissions::from_mode(0o755)).expect("chmod");
    let wait = d.join("wait_stdin");
    fs::copy(fixture("wait_stdin"), &wait).expect("copy the fixture");
    fs::set_permissions(&wait, fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut child = Command::new(crate::support::memtrail_bin())
        .args(["run", "--preload", "-q", "-o", "/dev/null", "--"])
        .arg(&wait)
        .envs([("SUDO_UID", "65534"), ("SUDO_GID", "65534")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn memtrail");
    let memtrail = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the command's ready line");
    let kill = |pid: u32| {
        // SAFETY: kill takes plain integers; the pid may be gone.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    };
    let command: u32 = match line.trim().strip_prefix("ready ") {
        Some(pid) => pid.parse().expect("pid"),
        None => {
            kill(memtrail);
            panic!("the command did not start: {line:?}");
        }
    };
    let keepers = children_named(memtrail, "mt-shim-keeper");
    let ok = keepers.len() == 1;
    let keeper = keepers.first().map_or(0, |k| k.0);
    let (uid, fds) = if ok {
        let uid = fs::metadata(format!("/proc/{keeper}")).expect("stat").uid();
        let mut fds = dir_entries(std::path::Path::new(&format!("/proc/{keeper}/fd")));
        fds.sort();
        (uid, fds)
    } else {
        (0, Vec::new())
    };
    kill(memtrail);
    child.wait().expect("wait for memtrail");
    drop(child.stdin.take());
    kill(command);
    assert!(ok, "keepers: {keepers:?}");
    assert_eq!((uid, fds), (NOBODY, vec!["3".to_owned(), "4".to_owned()]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    // Gone, or a zombie its new parent has not reaped yet.
    while !fs::read_to_string(format!("/proc/{keeper}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the keeper {keeper} outlived memtrail"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

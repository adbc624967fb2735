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

use crate::support::{dir_entries, memtrail_env};

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

//! memtrail's own failures: usage errors (2), a command that cannot be
//! executed (126) or found (127), and an output path that cannot be written
//! (73, found before the command runs). A failure leaves no file behind.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::{dir_entries, fixture, memtrail};

/// `memtrail ARGS... -- touch_marker DIR/marker`.
fn with_marker(args: &[OsString], dir: &Path) -> Vec<OsString> {
    let mut v = args.to_vec();
    v.push("--".into());
    v.push(fixture("touch_marker").into());
    v.push(dir.join("marker").into());
    v
}

fn run_flags(dir: &Path) -> Vec<OsString> {
    vec![
        "run".into(),
        "--output".into(),
        dir.join("profile.json").into(),
        "--events".into(),
        dir.join("events.jsonl").into(),
        "--".into(),
    ]
}

/// Check that a command that does not exist, by path or by name, makes
/// memtrail exit 127 and leaves no output file.
#[test]
fn cli_missing_command_exits_127() {
    for missing in [
        "/nonexistent/memtrail-no-such-command",
        "memtrail-no-such-command",
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = run_flags(dir.path());
        args.push(missing.into());
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(127), "{missing}: {stderr}");
        assert!(dir_entries(dir.path()).is_empty(), "{missing}: files left");
    }
}

/// Check that a command that exists but cannot be executed (no execute
/// permission, or a directory) makes memtrail exit 126 and leaves no output
/// file.
#[test]
fn cli_non_executable_command_exits_126() {
    let bin = tempfile::tempdir().expect("tempdir");
    let script = bin.path().join("not-executable");
    fs::write(&script, "#!/bin/sh\nexit 0\n").expect("write script");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).expect("chmod");
    for target in [script.as_path(), bin.path()] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = run_flags(dir.path());
        args.push(target.into());
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(126), "{}: {stderr}", target.display());
        assert!(dir_entries(dir.path()).is_empty(), "files left");
    }
}

/// Output paths memtrail cannot create, even as root.
fn unwritable(scratch: &Path) -> Vec<(String, OsString)> {
    let file = scratch.join("a-file");
    fs::write(&file, "").expect("write file");
    let existing_dir = scratch.join("a-dir");
    fs::create_dir(&existing_dir).expect("mkdir");
    vec![
        ("missing directory".into(), "/nonexistent/dir/p.json".into()),
        ("parent is a file".into(), file.join("p.json").into()),
        // sysfs refuses to create files, even for root.
        ("sysfs".into(), "/sys/memtrail-test-output.json".into()),
        ("path is a directory".into(), existing_dir.into()),
    ]
}

/// Check that an `--output` path that cannot be written makes memtrail exit
/// 73 before the command runs, leaving no file.
#[test]
fn cli_unwritable_output_exits_73_before_command() {
    let scratch = tempfile::tempdir().expect("tempdir");
    for (what, path) in unwritable(scratch.path()) {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = with_marker(&["run".into(), "--output".into(), path], dir.path());
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(73), "{what}: {stderr}");
        assert!(
            dir_entries(dir.path()).is_empty(),
            "{what}: the command ran"
        );
    }
    assert_eq!(dir_entries(scratch.path()), ["a-dir", "a-file"]);
    assert!(dir_entries(&scratch.path().join("a-dir")).is_empty());
}

/// Check that an `--events` path that cannot be written makes memtrail exit
/// 73 before the command runs, and the valid `--output` is not written.
#[test]
fn cli_unwritable_events_exits_73_before_command() {
    let scratch = tempfile::tempdir().expect("tempdir");
    for (what, path) in unwritable(scratch.path()) {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = with_marker(
            &[
                "run".into(),
                "--output".into(),
                dir.path().join("profile.json").into(),
                "--events".into(),
                path,
            ],
            dir.path(),
        );
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(73), "{what}: {stderr}");
        assert!(dir_entries(dir.path()).is_empty(), "{what}: files left");
    }
    assert!(dir_entries(&scratch.path().join("a-dir")).is_empty());
}

/// Check that usage errors exit 2 without running the command.
#[test]
fn cli_usage_errors_exit_2() {
    let cases: &[&[&str]] = &[
        &[],
        &["no-such-subcommand"],
        &["run"],
        &["run", "--"],
        &["run", "--no-such-flag"],
        &["run", "--output"],
    ];
    for case in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let args: Vec<OsString> = case.iter().map(OsString::from).collect();
        let (_, status, stdout, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(2), "{case:?}: {stderr}");
        assert!(!stderr.trim().is_empty(), "{case:?}: no message");
        assert!(stdout.is_empty(), "{case:?}: usage error on stdout");
        assert!(dir_entries(dir.path()).is_empty(), "{case:?}");
    }
    // An unknown flag before a valid command: the command must not run.
    let dir = tempfile::tempdir().expect("tempdir");
    let args = with_marker(&["run".into(), "--no-such-flag".into()], dir.path());
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(dir_entries(dir.path()).is_empty(), "the command ran");
}

/// Check that a nonzero `--pressure-timeout` below the 1 ms minimum is bad
/// usage (exit 2, saying why) whatever its unit and digits, never a silent
/// 0 (off), and that zero in any unit is off and runs (issue 11:
/// `0.0000000001s` became 0 while `1us` was rejected).
#[test]
fn cli_pressure_timeout_below_minimum_exits_2() {
    for short in ["0.0000000001s", "1us", "999999ns", "0.5ms"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = with_marker(
            &["run".into(), "--pressure-timeout".into(), short.into()],
            dir.path(),
        );
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(2), "{short}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "pressure timeout `{short}` is shorter than the 1ms memtrail can keep"
            )),
            "{short}: {stderr}"
        );
        assert!(
            dir_entries(dir.path()).is_empty(),
            "{short}: the command ran"
        );
    }
    for zero in ["0", "0.000s", "0ns"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = with_marker(
            &[
                "run".into(),
                "-q".into(),
                "--pressure-timeout".into(),
                zero.into(),
            ],
            dir.path(),
        );
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(0), "{zero}: {stderr}");
        assert_eq!(dir_entries(dir.path()), ["marker"], "{zero}");
    }
}

/// Check that a `--debuginfo-dir` that is not a directory is bad usage
/// found before the command runs (exit 2, naming it), not when the capture
/// ends and its profile is symbolized.
#[test]
fn cli_debuginfo_dir_missing_exits_2_before_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-dir");
    let mut flags = run_flags(dir.path());
    flags.pop();
    flags.extend(["--debuginfo-dir".into(), missing.clone().into()]);
    let args = with_marker(&flags, dir.path());
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--debuginfo-dir {}: not a directory",
            missing.display()
        )),
        "{stderr}"
    );
    assert!(
        dir_entries(dir.path()).is_empty(),
        "the command ran or an output was left"
    );
}

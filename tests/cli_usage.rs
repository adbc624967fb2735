//! How `memtrail run` reads its command line as people write it (issue 16,
//! "The CLI"): a trailing command without `--`, sizes and durations in
//! the units people use.

mod common;

use std::ffi::OsString;
use std::fs;
use std::process::{Command, Stdio};

use common::{MEMTRAIL, dir_entries, fixture, memtrail};

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Check that `memtrail run CMD ARGS` runs CMD without `--`, passing it
/// every argument from its name on, flags included, while memtrail's own
/// flags before the command still apply (issue 16: `memtrail run ls` was a
/// usage error).
#[test]
fn cli_usage_trailing_command_without_double_dash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("marker");
    let profile = dir.path().join("p.json");
    let mut args = os(&["run", "-q", "-o"]);
    args.push(profile.clone().into());
    args.push(fixture("touch_marker").into());
    args.push(marker.clone().into());
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(marker.exists(), "the command did not run: {stderr}");
    assert!(profile.exists(), "-o before the command was not memtrail's");

    // Flags after the command's name are the command's, even memtrail's
    // own (-q, -o): sh prints them, and memtrail prints its summary.
    let out = dir.path().join("argv");
    let script = format!("printf '%s\\n' \"$@\" > {}", out.display());
    let kept = dir.path().join("kept.json");
    let args = os(&[
        "run",
        "-o",
        kept.to_str().expect("UTF-8"),
        "sh",
        "-c",
        &script,
        "sh",
        "-q",
        "-o",
        "x",
        "--",
        "-la",
    ]);
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(
        fs::read_to_string(&out).expect("the command wrote its arguments"),
        "-q\n-o\nx\n--\n-la\n"
    );
    assert!(
        stderr.contains("memtrail: sh exited with code 0"),
        "-q after the command silenced memtrail: {stderr}"
    );
    assert!(!dir.path().join("x").exists());
}

/// Check that `--` still separates memtrail's flags from a command, and
/// that an unknown flag before the command is still a usage error that
/// runs nothing (the command does not swallow it).
#[test]
fn cli_usage_double_dash_and_unknown_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("marker");
    let mut args = os(&["run", "-q", "--"]);
    args.push(fixture("touch_marker").into());
    args.push(marker.clone().into());
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(marker.exists());
    fs::remove_file(&marker).expect("remove marker");

    let mut args = os(&["run", "-q", "--no-such-flag"]);
    args.push(fixture("touch_marker").into());
    args.push(marker.clone().into());
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(dir_entries(dir.path()).is_empty(), "the command ran");
}

/// Check that diagnostics written to a file or a pipe carry no ANSI colour
/// codes (issue 16: `--log debug 2> FILE` filled the file with escapes).
#[test]
fn cli_usage_log_without_colours_off_a_terminal() {
    let out = Command::new(MEMTRAIL)
        .args(["--log", "debug", "run", "-q", "--", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run memtrail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(" INFO "), "no diagnostics: {stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "ANSI escapes in a pipe: {stderr:?}"
    );
}

/// Check that ring sizes take the units people write (`64MiB`, `16 MiB`,
/// `1024KiB`, `64MB` as MiB) and a duration such as `1.5s` is a pressure
/// timeout, and that a size that is no power of two says so (issue 16:
/// `--ring-size 64MiB` was not a size).
#[test]
fn cli_usage_sizes_and_durations_in_units() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("marker");
    for (ring, stack_ring, timeout) in [("64MiB", "16 MiB", "1.5s"), ("64MB", "1024KiB", "250ms")] {
        let mut args = os(&[
            "run",
            "-q",
            "--ring-size",
            ring,
            "--stack-ring-size",
            stack_ring,
            "--pressure-timeout",
            timeout,
        ]);
        args.push(fixture("touch_marker").into());
        args.push(marker.clone().into());
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(
            status.code(),
            Some(0),
            "{ring} {stack_ring} {timeout}: {stderr}"
        );
        assert!(marker.exists());
        fs::remove_file(&marker).expect("remove marker");
    }
    let mut args = os(&["run", "-q", "--ring-size", "48MiB"]);
    args.push(fixture("touch_marker").into());
    args.push(marker.clone().into());
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`48MiB` must be a power of two"),
        "{stderr}"
    );
    assert!(!marker.exists(), "the command ran");
}

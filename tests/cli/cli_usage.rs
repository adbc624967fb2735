//! How `memtrail run` reads its command line as people write it (issue 16,
//! "The CLI"): a trailing command without `--`, sizes and durations in
//! the units people use.

use std::ffi::OsString;
use std::fs;
use std::process::{Command, Stdio};

use crate::support::{self, MEMTRAIL, dir_entries, fixture, memtrail};

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
    // DEBUG: a capture of /bin/true may have nothing to say at INFO (its
    // one note was a probe that single-stepped, gone with issue 22).
    assert!(stderr.contains(" DEBUG "), "no diagnostics: {stderr}");
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

/// Check that each duration flag names itself and the units it takes when
/// it refuses a value (issue 26: `attach 1 --duration 5` answered "invalid
/// pressure timeout '5'"): a bare number is no duration (`5s` is), and
/// `--duration`'s bounds are its own.
#[test]
fn cli_usage_duration_errors_name_their_flag() {
    let units = "ns, us, ms, s or m";
    for (args, says) in [
        (
            &["attach", "1", "--duration", "5"][..],
            &["--duration", "`5` has no unit", units, "5s"][..],
        ),
        (
            &["attach", "1", "--duration", "1.5"],
            &["--duration", "`1.5` has no unit", "1.5s"],
        ),
        (
            &["attach", "1", "--duration", "1us"],
            &["--duration", "`1us` is shorter than 1ms"],
        ),
        (
            &["attach", "1", "--duration", "2000m"],
            &["--duration", "`2000m` is longer than a day"],
        ),
        (
            &["attach", "1", "--duration", "0s"],
            &["--duration", "`0s` is no time"],
        ),
        (
            &["attach", "1", "--duration", "soon"],
            &["--duration", "`soon` is not a duration", units],
        ),
        (
            &["run", "--pressure-timeout", "5", "true"],
            &[
                "--pressure-timeout",
                "pressure timeout `5` has no unit",
                units,
                "5s",
            ],
        ),
        (
            &["attach", "1", "--pressure-timeout", "5"],
            &["--pressure-timeout", "pressure timeout `5` has no unit"],
        ),
        (
            &["bench", "--pressure-timeout", "5", "--", "true"],
            &["--pressure-timeout", "pressure timeout `5` has no unit"],
        ),
    ] {
        let (_, status, _, stderr) = memtrail(&os(args), b"");
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        for s in says {
            assert!(stderr.contains(s), "{args:?}: no {s:?} in {stderr}");
        }
        if args.contains(&"--duration") {
            assert!(!stderr.contains("pressure"), "{args:?}: {stderr}");
        }
    }
}

/// Check what `-q` silences (issue 26: `run -q` printed a WARN about an
/// unwind table): the summary and notes about the capture, such as an
/// image without unwind information, which the profile still records;
/// not errors, and not the notes once `--log warn` asks for them.
#[test]
fn cli_usage_quiet_silences_capture_notes() {
    let built = support::fixture_with_flags(
        "stack_unwind",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-fno-builtin",
        ],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = dir.path().join("no_cfi");
    support::strip_unwind_tables(&built, &exe);
    let profile = dir.path().join("p.json");
    let run = |extra: &[&str]| {
        let mut args = os(&["run", "-q", "--force", "-o"]);
        args.push(profile.clone().into());
        args.extend(os(extra));
        args.push(exe.clone().into());
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(0), "{extra:?}: {stderr}");
        stderr
    };
    let stderr = run(&[]);
    assert_eq!(stderr, "", "-q printed");
    let p: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&profile).expect("profile")).expect("JSON");
    let image = p["unwind"]["images"]
        .as_array()
        .expect("images")
        .iter()
        .find(|i| i["image"] == exe.to_str().expect("UTF-8"))
        .expect("the image's entry");
    assert_eq!(image["status"], "no_cfi");

    let stderr = run(&["--log", "warn"]);
    assert!(stderr.contains("no unwind information"), "{stderr}");

    // Errors stay.
    let (_, status, _, stderr) = memtrail(&os(&["run", "-q", "--", "/no/such/command"]), b"");
    assert_eq!(status.code(), Some(127), "{stderr}");
    assert!(stderr.contains("memtrail: error: "), "{stderr}");
}

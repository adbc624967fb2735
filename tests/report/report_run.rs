//! `memtrail run --report`: the report of the profile just captured, the
//! same as `memtrail report` makes from that profile; its flags' usage
//! errors (2), an unwritable `--report-output` (73, before the command
//! runs). The capture tests need root and a kernel memtrail supports, like
//! the `track_*` tests; the usage errors need neither.

use std::fs;
use std::path::Path;

use crate::support::dir_entries;
use crate::support::report::memtrail;

/// `memtrail run ARGS... -- touch DIR/marker`.
fn with_marker(args: &[&str], dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = ["run"].iter().chain(args).map(|a| a.to_string()).collect();
    v.push("--".into());
    v.push("touch".into());
    v.push(dir.join("marker").display().to_string());
    v
}

/// Check that `--report` formats other than text need `--report-output`,
/// that `--report-output` and `--report-by` need `--report`, and that an
/// unknown format is refused: usage errors (2), before the command runs.
#[test]
fn report_run_flag_usage_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("report.out");
    let out = out.to_str().expect("UTF-8");
    for args in [
        vec!["--report", "json"],
        vec!["--report", "flamegraph"],
        vec!["--report", "pprof"],
        vec!["--report", "folded"],
        vec!["--report-output", out],
        vec!["--report-by", "peak"],
        vec!["--report", "text", "--report-by", "time"],
        vec!["--report", "svg", "--report-output", out],
    ] {
        let run = memtrail(&with_marker(&args, dir.path()));
        run.expect_code(2);
        assert!(
            run.stderr.starts_with("error: "),
            "{args:?}: {}",
            run.stderr
        );
        assert!(dir_entries(dir.path()).is_empty(), "{args:?}: files left");
    }
}

/// Check that a `--report-output` that cannot be written makes memtrail
/// exit 73 before the command runs, leaving nothing behind.
#[test]
fn report_run_unwritable_report_output_exits_73() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    fs::write(&file, "").expect("write");
    let below_file = file.join("report.pb.gz");
    for out in [
        "/nonexistent/dir/report.pb.gz",
        below_file.to_str().expect("UTF-8"),
    ] {
        let run = memtrail(&with_marker(
            &["--report", "pprof", "--report-output", out],
            dir.path(),
        ));
        run.expect_code(73);
        assert!(
            run.stderr
                .starts_with(&format!("memtrail: error: cannot write {out}")),
            "{}",
            run.stderr
        );
        assert_eq!(dir_entries(dir.path()), ["a-file"], "marker or files left");
    }
}

/// Check that a capture that fails (the command is not found) leaves no
/// report file.
#[test]
fn report_run_failed_capture_writes_no_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("report.json");
    let run = memtrail(&[
        "run",
        "--report",
        "json",
        "--report-output",
        out.to_str().expect("UTF-8"),
        "--",
        "/nonexistent/memtrail-no-such-command",
    ]);
    run.expect_code(127);
    assert!(dir_entries(dir.path()).is_empty(), "files left");
}

/// `memtrail report PROFILE ARGS...`'s stdout.
fn report_of(profile: &Path, args: &[&str]) -> Vec<u8> {
    let mut all = vec!["report".to_owned(), profile.display().to_string()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let run = memtrail(&all);
    run.expect_code(0);
    run.stdout
}

/// Check that `run --report FORMAT --report-output PATH --report-by METRIC`
/// writes, byte for byte, what `memtrail report` makes of the profile the
/// same run wrote, keeps the command's exit status, and leaves the
/// command's stdout alone.
#[test]
fn report_run_matches_report() {
    for (format, by) in [("json", "count"), ("pprof", "leaked"), ("folded", "bytes")] {
        let dir = tempfile::tempdir().expect("tempdir");
        let profile = dir.path().join("profile.json");
        let out = dir.path().join(format!("report.{format}"));
        let run = memtrail(&[
            "run",
            "-q",
            "--output",
            profile.to_str().expect("UTF-8"),
            "--report",
            format,
            "--report-output",
            out.to_str().expect("UTF-8"),
            "--report-by",
            by,
            "--",
            "/bin/sh",
            "-c",
            "echo out; exit 3",
        ]);
        run.expect_code(3);
        assert_eq!(run.stdout(), "out\n", "{format}");
        let written = fs::read(&out).expect("report written");
        assert_eq!(
            written,
            report_of(&profile, &["--format", format, "--by", by]),
            "{format} --by {by}"
        );
        assert_eq!(
            dir_entries(dir.path()),
            ["profile.json".to_owned(), format!("report.{format}")]
        );
    }
}

/// Check that a text `--report` without `--report-output` goes to stderr:
/// after the summary and a blank line, or alone with `-q`; exactly what
/// `memtrail report` makes of the same run's profile, top 10 by bytes.
#[test]
fn report_run_text_to_stderr() {
    for quiet in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let profile = dir.path().join("profile.json");
        let mut args = vec!["run", "--output", profile.to_str().expect("UTF-8")];
        if quiet {
            args.push("--quiet");
        }
        args.extend(["--report", "text", "--", "/bin/sh", "-c", "echo out"]);
        let run = memtrail(&args);
        run.expect_code(0);
        assert_eq!(run.stdout(), "out\n");
        let text = String::from_utf8(report_of(&profile, &[])).expect("UTF-8");
        assert!(
            text.starts_with("memtrail report: /bin/sh -c echo out (exited with code 0 after ")
        );
        if quiet {
            assert_eq!(run.stderr, text);
        } else {
            assert!(
                run.stderr
                    .starts_with("memtrail: /bin/sh exited with code 0")
            );
            assert!(
                run.stderr.ends_with(&format!("\n\n{text}")),
                "{}",
                run.stderr
            );
        }
    }
}

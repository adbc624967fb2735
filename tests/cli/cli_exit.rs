//! `memtrail run` passes the command's exit status and stdio through, and
//! writes exactly the outputs it was asked for.

use std::ffi::OsString;

use crate::support::{
    self, capture, capture_with, cmd, dir_entries, field, int, memtrail, stream_root,
};
use serde_json::json;

/// Check that memtrail exits with the command's exit code, and records it
/// in the profile and the exit event.
#[test]
fn cli_exit_code_passthrough() {
    let run = capture(&cmd("exit_with", &["code".as_ref(), "3".as_ref()]));
    run.expect_code(3);
    let profile = run.profile();
    assert_eq!(
        field(profile, "exit"),
        &json!({ "code": 3, "signal": null })
    );
    let root = stream_root(run.events());
    assert_eq!(int(support::process(profile, root), "exit_code"), 3);
    let exits: Vec<i64> = support::of_pid(run.events(), root)
        .into_iter()
        .filter(|e| support::kind(e) == "exit")
        .map(|e| int(e, "exit_code"))
        .collect();
    assert_eq!(exits, [3 << 8], "wait status of exit(3)");
}

/// Check that a command killed by signal N makes memtrail exit 128+N, and
/// the profile records the signal.
#[test]
fn cli_killed_command_exits_128_plus_signal() {
    for (signal, code) in [(libc::SIGKILL, 137), (libc::SIGTERM, 143)] {
        let n = signal.to_string();
        let run = capture(&cmd("exit_with", &["signal".as_ref(), n.as_ref()]));
        run.expect_code(code);
        assert_eq!(
            field(run.profile(), "exit"),
            &json!({ "code": null, "signal": signal }),
            "signal {signal}"
        );
        let root = stream_root(run.events());
        let exits: Vec<i64> = support::of_pid(run.events(), root)
            .into_iter()
            .filter(|e| support::kind(e) == "exit")
            .map(|e| int(e, "exit_code"))
            .collect();
        assert_eq!(exits, [i64::from(signal)], "wait status of signal {signal}");
    }
}

/// Check that the command reads memtrail's stdin and writes to memtrail's
/// stdout and stderr untouched, and memtrail itself writes nothing to
/// stdout.
#[test]
fn cli_command_stdio_untouched() {
    let input = b"line one\nline two\0with a NUL\n".repeat(1000);
    let run = capture_with(&cmd("stdio", &[]), &input);
    run.expect_code(0);
    assert!(
        run.stdout == input,
        "stdout differs from the command's output"
    );
    assert!(
        run.stderr.contains("fixture stderr\n"),
        "stderr: {}",
        run.stderr
    );
}

/// Check that the command may run on every CPU memtrail may: memtrail's
/// start-up keeps its BPF loading thread on one CPU and its helpers on the
/// others for a while, and nothing of that reaches the command (with the
/// probes and with the preload shim).
#[test]
fn cli_command_runs_on_memtrails_cpus() {
    let status = std::fs::read_to_string("/proc/self/status").expect("own status");
    let ours = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status");
    let command: Vec<OsString> = ["grep", "Cpus_allowed_list:", "/proc/self/status"]
        .into_iter()
        .map(OsString::from)
        .collect();
    for flags in [&[][..], &["--preload"][..]] {
        let run = support::capture_flags(flags, &command, b"", &[]);
        run.expect_code(0);
        assert_eq!(
            String::from_utf8_lossy(&run.stdout).trim_end(),
            ours,
            "{flags:?}"
        );
    }
}

/// Check that a successful run leaves exactly the two requested files and
/// no temporary file, and prints a summary on stderr.
#[test]
fn cli_success_writes_only_outputs() {
    let run = capture(&cmd("baseline", &[]));
    run.expect_code(0);
    assert_eq!(run.files(), ["events.jsonl", "profile.json"]);
    assert!(run.stdout.is_empty(), "memtrail wrote to stdout");
    assert!(!run.stderr.trim().is_empty(), "no summary on stderr");
}

/// Check that without `--output` or `--events` the command still runs and
/// its status passes through, and with only one of them only that file is
/// written.
#[test]
fn cli_output_flags_optional() {
    let exit4 = cmd("exit_with", &["code".as_ref(), "4".as_ref()]);
    let mut args: Vec<OsString> = vec!["run".into(), "--".into()];
    args.extend(exit4.iter().cloned());
    let (_, status, stdout, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(4), "{stderr}");
    assert!(stdout.is_empty());

    for flag in ["--output", "--events"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args: Vec<OsString> = vec![
            "run".into(),
            flag.into(),
            dir.path().join("out").into(),
            "--".into(),
        ];
        args.extend(exit4.iter().cloned());
        let (_, status, _, stderr) = memtrail(&args, b"");
        assert_eq!(status.code(), Some(4), "{flag}: {stderr}");
        assert_eq!(dir_entries(dir.path()), ["out"], "{flag}");
    }
}

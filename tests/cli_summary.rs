//! What the summary on stderr says (issue 16, "The CLI").

mod common;

use std::ffi::OsString;

use common::{cmd, memtrail};

/// `memtrail run -o DIR/p.json -- CMD`; returns the exit code and stderr.
fn summary_of(command: Vec<OsString>) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args: Vec<OsString> = vec!["run".into(), "-o".into()];
    args.push(dir.path().join("p.json").into());
    args.push("--".into());
    args.extend(command);
    let (_, status, _, stderr) = memtrail(&args, b"");
    (status.code(), stderr)
}

/// Check that the note on probe sites that single-step names only the
/// sites the command went through, with their calls: none for a program
/// that never calls reallocarray (libc's reallocarray single-steps), and
/// `reallocarray (libc.so.6) 2 calls` for one that calls it twice (issue
/// 16: "5 probe sites single-step" on every run).
#[test]
fn cli_summary_slow_probe_note_only_for_sites_hit() {
    let (code, stderr) = summary_of(cmd("touch_marker", &["/dev/null".as_ref()]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("memtrail: "), "no summary: {stderr}");
    assert!(!stderr.contains("single-step"), "{stderr}");

    let (code, stderr) = summary_of(cmd("apis", &[]));
    assert_eq!(code, Some(0), "{stderr}");
    let note = stderr
        .lines()
        .find(|l| l.contains("single-step"))
        .unwrap_or_else(|| panic!("no note: {stderr}"));
    assert!(
        note.ends_with("were hit: reallocarray (libc.so.6) 2 calls"),
        "{note}"
    );
}

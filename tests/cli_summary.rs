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

/// Check that the summary gives one line per executable, largest first,
/// with its number of processes, while the profile keeps every process
/// (issue 16: through a shell wrapper the summary listed 40 processes).
#[test]
fn cli_summary_processes_grouped_by_executable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let once = common::fixture("malloc_once");
    let script = format!(
        "for i in 1 2 3 4 5; do /bin/true; done; {0}; {0}",
        once.display()
    );
    let args: Vec<OsString> = vec![
        "run".into(),
        "-o".into(),
        profile_path.clone().into(),
        "/bin/sh".into(),
        "-c".into(),
        script.into(),
    ];
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let profile = common::read_profile(&profile_path).expect("profile");
    // sh, 5 forks that exec /bin/true, 2 that exec malloc_once.
    assert_eq!(common::processes(&profile).len(), 8, "{stderr}");
    let table: Vec<Vec<&str>> = stderr
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("processes"))
        .skip(1)
        .take_while(|l| !l.contains("note:") && !l.starts_with("memtrail:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let once = once.to_str().expect("UTF-8");
    // Largest first: malloc_once's 879 KiB peak, then sh, then /bin/true.
    let rows: Vec<(&str, &str)> = table.iter().map(|r| (r[0], r[r.len() - 1])).collect();
    assert_eq!(
        rows,
        [("2", once), ("1", "/bin/sh"), ("5", "/bin/true")],
        "{stderr}"
    );
    // The peak of one process (900001 bytes), not of the two together.
    assert_eq!(&table[0][3..5], ["878.9", "KiB"], "{stderr}");
}

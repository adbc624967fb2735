//! Ring loss fails the capture: memtrail never reports numbers built on lost
//! events.

use std::ffi::OsString;
use std::process::{Command, Stdio};

use crate::support::{MEMTRAIL, fixture};

/// Check that events lost on a ring too small for the stalled events
/// pipeline fail the capture with exit 71, name the loss, and leave no
/// output file behind.
#[test]
fn capture_loss_fails_with_exit_71() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("profile.json");
    let events = dir.path().join("events.jsonl");
    let mut args: Vec<OsString> = vec!["run".into(), "--ring-size".into(), "4096".into()];
    // One shared ring of 4 KiB, whatever the CPU count.
    args.extend(["--event-rings".into(), "shared".into()]);
    args.extend(["--output".into(), profile.clone().into_os_string()]);
    args.extend(["--events".into(), events.clone().into_os_string()]);
    args.extend(["--".into(), fixture("threads").into_os_string()]);
    let out = Command::new(MEMTRAIL)
        .args(&args)
        // Test-only fault hook: the events pipeline consumes nothing until
        // the final drain, so 4 KiB (56 records) overflows for sure.
        .env("MEMTRAIL_FAULT", "stall-events")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(71), "stderr: {stderr}");
    assert!(stderr.contains("events were lost"), "stderr: {stderr}");
    assert!(
        stderr.contains("retry with a larger --ring-size, or with --pressure-timeout inf"),
        "stderr: {stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

/// Check that the same workload on a ring large enough for all of its
/// records loses nothing, so the test above fails for the reason it names.
#[test]
fn capture_loss_none_on_a_large_enough_ring() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("profile.json");
    let out = Command::new(MEMTRAIL)
        .args(["run", "--ring-size", "1M", "--output"])
        .arg(&profile)
        .arg("--")
        .arg(fixture("threads"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    assert_eq!(doc["lost_events"]["events"], 0);
    assert_eq!(doc["lost_events"]["tracking"], 0);
}

/// Check that stack records lost on a stalled, small stack ring fail the
/// capture like lost events do: exit 71, the stack ring named, no output.
#[test]
fn capture_loss_of_stacks_fails_with_exit_71() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("profile.json");
    let out = Command::new(MEMTRAIL)
        .args(["run", "--stack-ring-size", "4096", "--output"])
        .arg(&profile)
        .arg("--")
        .arg(fixture("stacks"))
        // 4 KiB holds 3 stack records; the fixture has 4 distinct stacks.
        .env("MEMTRAIL_FAULT", "stall-stacks")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(71), "stderr: {stderr}");
    assert!(stderr.contains("on the stack ring"), "stderr: {stderr}");
    assert!(!stderr.contains(" 0 on the stack ring"), "stderr: {stderr}");
    assert!(
        stderr.contains("retry with a larger --stack-ring-size,"),
        "stderr: {stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

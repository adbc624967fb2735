//! Which profile `memtrail run` keeps, and which files it will not replace
//! (issue 16: without `-o` nothing was kept, and `-o` silently replaced
//! what was there).

use std::ffi::OsString;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::{MEMTRAIL, dir_entries, fixture, memtrail};
use serde_json::Value;

/// Runs `memtrail ARGS` in `cwd`; returns memtrail's pid, exit code and
/// stderr.
fn memtrail_in(cwd: &Path, args: &[OsString]) -> (u32, Option<i32>, String) {
    let child = Command::new(MEMTRAIL)
        .current_dir(cwd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for memtrail");
    (
        pid,
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn profile_at(path: &Path) -> Value {
    let mut v: Value = serde_json::from_slice(&fs::read(path).expect("read profile"))
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    crate::support::expand_stacks(&mut v);
    assert_eq!(v["format"], "memtrail-profile");
    v
}

/// Check that without `-o` the profile is kept as `memtrail.CMD.PID.json`
/// in the working directory (PID memtrail's), that the summary says where,
/// and that with `-q` and no `-o` nothing is kept.
#[test]
fn cli_profile_default_in_working_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = fixture("touch_marker");
    let args: Vec<OsString> = vec!["run".into(), exe.clone().into(), "marker".into()];
    let (pid, code, stderr) = memtrail_in(dir.path(), &args);
    assert_eq!(code, Some(0), "{stderr}");
    let name = format!(
        "memtrail.{}.{pid}.json",
        exe.file_name().expect("name").to_string_lossy()
    );
    assert_eq!(dir_entries(dir.path()), ["marker", name.as_str()]);
    assert!(
        stderr.contains(&format!("memtrail: profile written to {name}")),
        "{stderr}"
    );
    let profile = profile_at(&dir.path().join(&name));
    assert_eq!(profile["command"][0], exe.to_str().expect("UTF-8"));

    let quiet = tempfile::tempdir().expect("tempdir");
    let args: Vec<OsString> = vec!["run".into(), "-q".into(), exe.into(), "marker".into()];
    let (_, code, stderr) = memtrail_in(quiet.path(), &args);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(dir_entries(quiet.path()), ["marker"]);
}

/// Check that `--output`, `--events` and `--report-output` refuse an
/// existing regular file, also through a symlink, before the command runs
/// (exit 73, naming --force) and leave it as it was; and that `--force`
/// replaces it.
#[test]
fn cli_profile_existing_file_needs_force() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    fs::write(d.join("old"), "old\n").expect("write");
    std::os::unix::fs::symlink("old", d.join("link")).expect("symlink");
    let marker = d.join("marker");
    for flags in [
        &["--output"][..],
        &["--events"],
        &["--report", "json", "--report-output"],
    ] {
        for target in ["old", "link"] {
            let mut args: Vec<OsString> = vec!["run".into(), "-q".into()];
            args.extend(flags.iter().map(OsString::from));
            args.push(d.join(target).into());
            args.push(fixture("touch_marker").into());
            args.push(marker.clone().into());
            let (_, status, _, stderr) = memtrail(&args, b"");
            assert_eq!(status.code(), Some(73), "{flags:?} {target}: {stderr}");
            assert!(
                stderr.contains("it exists, and memtrail replaces a file only with --force"),
                "{stderr}"
            );
            assert!(!marker.exists(), "{flags:?} {target}: the command ran");
            assert_eq!(fs::read_to_string(d.join("old")).expect("read"), "old\n");
        }
    }
    let mut args: Vec<OsString> = vec!["run".into(), "-q".into(), "--force".into(), "-o".into()];
    args.push(d.join("link").into());
    args.push(fixture("touch_marker").into());
    args.push(marker.clone().into());
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    profile_at(&d.join("old"));
    assert!(
        fs::symlink_metadata(d.join("link"))
            .expect("lstat")
            .is_symlink()
    );
}

/// Check that a file that appears at the `--output` path while the command
/// runs (here the command writes it) is not replaced either: the capture
/// fails (exit 73) and the file keeps what the command wrote.
#[test]
fn cli_profile_file_appearing_meanwhile_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("p.json");
    let script = format!("echo mine > {}", out.display());
    let args: Vec<OsString> = vec![
        "run".into(),
        "-q".into(),
        "-o".into(),
        out.clone().into(),
        "sh".into(),
        "-c".into(),
        script.into(),
    ];
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(73), "{stderr}");
    assert!(stderr.contains("--force"), "{stderr}");
    assert_eq!(fs::read_to_string(&out).expect("read"), "mine\n");
    assert_eq!(dir_entries(dir.path()), ["p.json"]);
}

/// Check that streams are written without --force: they are not replaced
/// (`/dev/null` stays a device).
#[test]
fn cli_profile_streams_need_no_force() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args: Vec<OsString> = vec![
        "run".into(),
        "-q".into(),
        "-o".into(),
        "/dev/null".into(),
        fixture("touch_marker").into(),
        dir.path().join("marker").into(),
    ];
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(dir_entries(dir.path()), ["marker"]);
}

/// Check that a frame memtrail cannot symbolize (in an executable stripped
/// of its symbols) has `function`, `file` and `line` written as `null`, not
/// left out, with its `module`, as docs/profile.md says (issue 16: the docs
/// and the JSON disagreed).
#[test]
fn cli_profile_unresolved_frame_fields_are_null() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = dir.path().join("stripped");
    fs::copy(fixture("malloc_once"), &exe).expect("copy");
    let strip = Command::new("strip")
        .arg("--strip-all")
        .arg(&exe)
        .status()
        .expect("run strip");
    assert!(strip.success());
    let profile = dir.path().join("p.json");
    let args: Vec<OsString> = vec![
        "run".into(),
        "-q".into(),
        "-o".into(),
        profile.clone().into(),
        exe.clone().into(),
    ];
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let profile = profile_at(&profile);
    let exe = exe.to_str().expect("UTF-8");
    let frames: Vec<&Value> = profile["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .flat_map(|s| s["frames"].as_array().expect("frames"))
        .filter(|f| f["module"] == exe)
        .collect();
    assert!(!frames.is_empty(), "no frame in the stripped executable");
    for frame in frames {
        for key in ["function", "file", "line"] {
            assert_eq!(frame.get(key), Some(&Value::Null), "{key} in {frame}");
        }
    }
}

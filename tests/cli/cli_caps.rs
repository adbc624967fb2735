//! memtrail without root, through file capabilities (issue 16: after
//! `setcap cap_bpf,cap_perfmon,cap_sys_admin+ep` it failed with "kernel
//! lacks tracefs" although tracefs was mounted).
//!
//! A copy of the binary gets capabilities with `setcap` and runs as
//! `nobody` through `setpriv`, with no inheritable capabilities and an
//! empty environment.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::{dir_entries, fixture, memtrail_bin};

/// Runs a copy of memtrail holding the file capabilities `caps` as
/// `nobody`, tracking `touch_marker DIR/marker` (a copy in `dir`: the
/// fixture itself may sit behind a directory only root can search, such as
/// a clone under /root or `mktemp -d`; issue 26); returns its exit code and
/// stderr.
fn run_with_caps(caps: &str, dir: &Path) -> (Option<i32>, String) {
    let touch = dir.join("touch_marker");
    fs::copy(fixture("touch_marker"), &touch).expect("copy the fixture");
    fs::set_permissions(&touch, fs::Permissions::from_mode(0o755)).expect("chmod");
    run_as_nobody(caps, dir, &touch, &[], &[])
}

/// Runs a copy of memtrail holding the file capabilities `caps` as
/// `nobody`, tracking `COMMAND DIR/out/marker`, with `run`'s `flags` and the
/// variables `env`; returns its exit code and stderr.
fn run_as_nobody(
    caps: &str,
    dir: &Path,
    command: &Path,
    flags: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let exe = dir.join(format!("memtrail-{}", caps.replace([',', '+'], "-")));
    fs::copy(memtrail_bin(), &exe).expect("copy memtrail");
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).expect("chmod");
    let setcap = Command::new("setcap")
        .arg(caps)
        .arg(&exe)
        .output()
        .expect("run setcap (apt-get install libcap2-bin)");
    assert!(
        setcap.status.success(),
        "setcap {caps}: {}",
        String::from_utf8_lossy(&setcap.stderr)
    );
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&exe)
        .args(["run", "-o", "/dev/null"])
        .args(flags)
        .arg(command)
        .arg(dir.join("out/marker"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().copied())
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv");
    fs::remove_file(&exe).expect("remove the copy");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A directory `nobody` can search, with an `out/` it can write.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::create_dir(dir.path().join("out")).expect("mkdir");
    fs::set_permissions(dir.path().join("out"), fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// Check that memtrail tracks a command as an unprivileged user holding
/// CAP_BPF, CAP_PERFMON and CAP_CHECKPOINT_RESTORE (the set README
/// documents), or CAP_SYS_ADMIN alone (which stands for all three):
/// nothing needs tracefs, which only root may search.
#[test]
fn cli_caps_documented_sets_suffice() {
    let dir = scratch();
    for caps in [
        "cap_bpf,cap_perfmon,cap_checkpoint_restore+ep",
        "cap_sys_admin+ep",
    ] {
        let (code, stderr) = run_with_caps(caps, dir.path());
        assert_eq!(code, Some(0), "{caps}: {stderr}");
        assert!(stderr.contains("exited with code 0"), "{caps}: {stderr}");
        assert_eq!(dir_entries(&dir.path().join("out")), ["marker"], "{caps}");
        fs::remove_file(dir.path().join("out/marker")).expect("remove marker");
    }
}

/// Check that a missing capability fails before the command runs (exit
/// 72), with a message naming each one missing and what it is for.
#[test]
fn cli_caps_missing_ones_are_named() {
    let dir = scratch();
    let cases: &[(&str, &[&str])] = &[
        (
            "cap_bpf,cap_perfmon+ep",
            &["CAP_CHECKPOINT_RESTORE (to open the files processes map"],
        ),
        (
            "cap_perfmon,cap_checkpoint_restore+ep",
            &["CAP_BPF (to load BPF programs)"],
        ),
        (
            "cap_net_raw+ep",
            &[
                "CAP_BPF (to load BPF programs)",
                "CAP_PERFMON (to attach uprobes and tracepoints)",
                "CAP_CHECKPOINT_RESTORE",
            ],
        ),
    ];
    for (caps, named) in cases {
        let (code, stderr) = run_with_caps(caps, dir.path());
        assert_eq!(code, Some(72), "{caps}: {stderr}");
        assert!(
            stderr.starts_with("memtrail: error: memtrail lacks "),
            "{caps}: {stderr}"
        );
        for name in *named {
            assert!(stderr.contains(name), "{caps}: no {name}: {stderr}");
        }
        assert!(
            stderr.contains("setcap cap_bpf,cap_perfmon,cap_checkpoint_restore+ep"),
            "{caps}: {stderr}"
        );
        assert!(
            dir_entries(&dir.path().join("out")).is_empty(),
            "{caps}: the command ran"
        );
    }
}

/// Check that a command memtrail cannot reach, because a directory on its
/// path denies search permission, is reported as such and not as missing
/// (issue 26: "command not found", exit 127, for a fixture behind a 0700
/// directory): exit 126, a message saying permission denied and naming
/// that directory, and the command not run.
#[test]
fn cli_caps_unreachable_command_is_denied() {
    let dir = scratch();
    let private = dir.path().join("private");
    fs::create_dir(&private).expect("mkdir");
    let touch = private.join("touch_marker");
    fs::copy(fixture("touch_marker"), &touch).expect("copy the fixture");
    fs::set_permissions(&touch, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).expect("chmod");
    let caps = "cap_bpf,cap_perfmon,cap_checkpoint_restore+ep";
    let (code, stderr) = run_as_nobody(caps, dir.path(), &touch, &[], &[]);
    assert_eq!(code, Some(126), "{stderr}");
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(
        stderr.contains(&format!("directory {}", private.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("not found"), "{stderr}");
    assert!(dir_entries(&dir.path().join("out")).is_empty());
}

/// Check that `--preload` reaches the command when memtrail runs with file
/// capabilities (issue 40: memtrail is then undumpable, so its user may not
/// open `/proc/<memtrail>/fd/N`; ld.so printed "cannot be preloaded" on
/// the program's stderr and the capture took the probes): the shim is held
/// by a keeper of the user's, the process takes its rings, nothing of
/// ld.so's is printed.
#[test]
fn cli_caps_preload_reaches_the_command() {
    let dir = scratch();
    let touch = dir.path().join("touch_marker");
    fs::copy(fixture("touch_marker"), &touch).expect("copy the fixture");
    fs::set_permissions(&touch, fs::Permissions::from_mode(0o755)).expect("chmod");
    let caps = "cap_bpf,cap_perfmon,cap_checkpoint_restore+ep";
    let (code, stderr) = run_as_nobody(
        caps,
        dir.path(),
        &touch,
        &["--preload"],
        &[("MEMTRAIL_LOG", "debug")],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("cannot be preloaded"), "{stderr}");
    assert!(stderr.contains("preload rings taken"), "{stderr}");
    assert_eq!(dir_entries(&dir.path().join("out")), ["marker"]);
}

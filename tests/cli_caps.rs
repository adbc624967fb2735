//! memtrail without root, through file capabilities (issue 16: after
//! `setcap cap_bpf,cap_perfmon,cap_sys_admin+ep` it failed with "kernel
//! lacks tracefs" although tracefs was mounted).
//!
//! A copy of the binary gets capabilities with `setcap` and runs as
//! `nobody` through `setpriv`, with no inheritable capabilities and an
//! empty environment.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{MEMTRAIL, dir_entries, fixture};

/// Runs a copy of memtrail holding the file capabilities `caps` as
/// `nobody`, tracking `touch_marker DIR/marker`; returns its exit code and
/// stderr.
fn run_with_caps(caps: &str, dir: &Path) -> (Option<i32>, String) {
    let exe = dir.join(format!("memtrail-{}", caps.replace([',', '+'], "-")));
    fs::copy(MEMTRAIL, &exe).expect("copy memtrail");
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
        .arg(fixture("touch_marker"))
        .arg(dir.join("out/marker"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
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

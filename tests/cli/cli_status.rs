//! The live status line of `memtrail run` (issue 15): on stderr when it is
//! a terminal, never with `-q`, never when stderr is not a terminal, and
//! erased before the summary.

use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

use crate::support::{MEMTRAIL, fixture};

/// A pseudo-terminal: (master, slave).
fn openpty() -> (File, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: two out pointers; no name, termios or window size.
    let ret = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(ret, 0, "openpty");
    // SAFETY: openpty returned two new descriptors that we now own.
    unsafe { (File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// Runs `memtrail run ARGS -- malloc_once` with stderr on a terminal;
/// returns its exit code and what it wrote there.
fn run_on_terminal(args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut master, slave) = openpty();
    let mut child = Command::new(MEMTRAIL)
        .current_dir(dir.path())
        .arg("run")
        .args(args)
        .arg("--")
        .arg(fixture("malloc_once"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave))
        .spawn()
        .expect("spawn memtrail");
    // Read until every holder of the terminal's slave side has closed it
    // (EIO), then reap memtrail.
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => break,
            Err(e) => panic!("read the terminal: {e}"),
        }
    }
    let status = child.wait().expect("wait for memtrail");
    (
        status.code().expect("memtrail exited"),
        String::from_utf8_lossy(&out).into_owned(),
    )
}

/// Check that on a terminal the status line is drawn (carriage return and
/// erase, then `memtrail: N s, ...`), erased before the summary, and that
/// the summary follows on a clean line.
#[test]
fn cli_status_line_on_a_terminal() {
    let (code, out) = run_on_terminal(&["-o", "p.json"]);
    assert_eq!(code, 0, "{out}");
    // Pieces between erases: the status lines, each `memtrail: T s, ...`
    // and nothing else, then the summary after the last erase.
    let pieces: Vec<&str> = out.split("\r\x1b[K").collect();
    assert_eq!(pieces[0], "", "{out:?}");
    let (summary, lines) = pieces[1..].split_last().expect("a status line");
    assert!(!lines.is_empty(), "no status line: {out:?}");
    for line in lines {
        let rest = line
            .strip_prefix("memtrail: ")
            .unwrap_or_else(|| panic!("{line:?}"));
        let (secs, what) = rest
            .split_once(" s, ")
            .unwrap_or_else(|| panic!("{line:?}"));
        assert!(secs.parse::<f64>().is_ok(), "{line:?}");
        assert!(
            what == "starting" || what.contains(" events/s, live "),
            "{line:?}"
        );
        assert!(!line.contains('\n'), "{line:?}");
    }
    assert!(
        summary.starts_with("memtrail: ") && summary.contains("exited with code 0"),
        "the summary does not follow the erased line: {summary:?}"
    );
}

/// Check that `-q` on a terminal draws no status line, and that a stderr
/// that is not a terminal gets none either (only the summary).
#[test]
fn cli_status_line_only_when_asked_and_on_a_terminal() {
    let (code, out) = run_on_terminal(&["-q", "-o", "p.json"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "", "-q printed on the terminal");

    let dir = tempfile::tempdir().expect("tempdir");
    let piped = Command::new(MEMTRAIL)
        .current_dir(dir.path())
        .args(["run", "-o", "p.json", "--"])
        .arg(fixture("malloc_once"))
        .stdin(Stdio::null())
        .output()
        .expect("run memtrail");
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert_eq!(piped.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\r'),
        "{stderr:?}"
    );
    assert!(stderr.starts_with("memtrail: "), "{stderr:?}");
}

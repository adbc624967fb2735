//! A uprobe another tracer registered on a libc allocator function with a
//! different `ref_ctr_offset` makes the kernel refuse memtrail's probe
//! (EINVAL, and "ref_ctr_offset mismatch" in the kernel log): memtrail
//! exits 74.
//!
//! The conflicts are made where memtrail probes `free`, at entry only. A
//! function with a return probe (malloc, realloc) can stay registered in the
//! kernel after every tracer closed it: a task that was inside it for more
//! than the kernel's 100 ms return-probe lease (a process stopped or
//! blocked there, anywhere on the host while a system-wide capture ran)
//! holds the uprobe until it returns, and a registration with another
//! `ref_ctr_offset` fails meanwhile. CI once saw exactly that on malloc.
//!
//! The other tracer is `tests/fixtures/uprobe_conflict.c`, holding a uprobe
//! with ref_ctr_offset 2 (inside the ELF header, never mapped writable, so
//! the kernel writes nothing) until its stdin closes.
//!
//! The conflicts are made on a private copy of libc (in a temporary
//! directory, loaded through `LD_LIBRARY_PATH` by the helper, by memtrail
//! and by the command): its inode is the test's own, so no other tracer on
//! the host can hold a probe there, and the test disturbs no other capture.
//! (CI once failed here when the conflict was made on the system's libc:
//! something else on the host had a probe on its `free`.) The tests are
//! still serialized, as each asserts what the kernel holds at one place.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use crate::support::{capture, cmd, dir_entries, fixture, memtrail_env};

static SERIAL: Mutex<()> = Mutex::new(());

/// A copy of this process's libc in a directory of its own: processes
/// started with `LD_LIBRARY_PATH` set to it load the copy.
struct PrivateLibc {
    dir: tempfile::TempDir,
}

impl PrivateLibc {
    fn new() -> Self {
        let libc = memtrail::internals::attach::libc_path().expect("libc's path");
        let dir = tempfile::tempdir().expect("tempdir");
        let name = libc.file_name().expect("libc's file name");
        std::fs::copy(&libc, dir.path().join(name)).expect("copy libc");
        Self { dir }
    }

    /// `LD_LIBRARY_PATH`'s value that loads the copy.
    fn library_path(&self) -> &str {
        self.dir
            .path()
            .to_str()
            .expect("a UTF-8 temporary directory")
    }

    /// The copy's path.
    fn path(&self) -> std::path::PathBuf {
        let libc = memtrail::internals::attach::libc_path().expect("libc's path");
        self.dir
            .path()
            .join(libc.file_name().expect("libc's file name"))
    }
}

/// The conflicting tracer: holds its uprobe until dropped.
struct Holder {
    child: Child,
}

impl Holder {
    /// Starts the helper with `ref_ctr` at the place memtrail probes
    /// `free` (past its NULL test) in the private copy of libc, and returns
    /// it with its first line of output ("ready OFFSET PATH" or "error
    /// ERRNO").
    fn start(libc: &PrivateLibc, ref_ctr: u32) -> (Self, String) {
        let sites = memtrail::internals::attach::find_sites(
            &libc.path(),
            &memtrail::internals::attach::api::libc(),
        )
        .expect("libc's allocator sites");
        let free = sites
            .iter()
            .find(|s| s.symbol == "free")
            .expect("memtrail probes libc's free");
        let mut child = Command::new(fixture("uprobe_conflict"))
            .env("LD_LIBRARY_PATH", libc.library_path())
            .arg(ref_ctr.to_string())
            .arg(free.offset.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn uprobe_conflict");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("helper stdout"))
            .read_line(&mut line)
            .expect("read helper output");
        if ref_ctr != 0 && line.starts_with("ready ") {
            assert!(
                line.trim_end().ends_with(&*libc.path().to_string_lossy()),
                "the helper probes the private libc: {line:?}"
            );
        }
        (Self { child }, line)
    }

    /// Starts the helper with ref_ctr_offset 2 and waits until it holds its
    /// probe.
    fn hold(libc: &PrivateLibc) -> Self {
        let (holder, line) = Self::start(libc, 2);
        assert!(line.starts_with("ready "), "the helper: {line:?}");
        holder
    }

    /// Closes the helper's stdin and returns its exit code.
    fn finish(mut self) -> Option<i32> {
        drop(self.child.stdin.take());
        self.child.wait().expect("wait for helper").code()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // EOF on stdin makes the helper release its probe and exit.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Check that the premise holds: while the helper holds its probe on free,
/// a plain uprobe at the same place (ref_ctr_offset 0, as memtrail's) fails with
/// EINVAL, and succeeds again once the helper is gone.
#[test]
fn cli_uprobe_conflict_fixture_blocks_plain_probe() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let libc = PrivateLibc::new();
    let holder = Holder::hold(&libc);
    let (plain, refused) = Holder::start(&libc, 0);
    assert_eq!(refused, format!("error {}\n", libc::EINVAL));
    assert_eq!(plain.finish(), Some(1));
    assert_eq!(holder.finish(), Some(0));

    let (plain, ready) = Holder::start(&libc, 0);
    assert!(ready.starts_with("ready "), "after release: {ready}");
    assert_eq!(plain.finish(), Some(0));
}

/// Runs `memtrail run FLAGS --output DIR/profile.json -- touch_marker
/// DIR/marker` with the private libc (memtrail's and the command's) and
/// checks that it exits 74 naming ref_ctr_offset, with no file written and
/// the command not run.
fn expect_conflict(libc: &PrivateLibc, dir: &std::path::Path, flags: &[&std::ffi::OsStr]) {
    let mut args: Vec<OsString> = vec!["run".into()];
    args.extend(flags.iter().map(|f| f.to_os_string()));
    args.extend([
        "--output".into(),
        dir.join("profile.json").into(),
        "--".into(),
        fixture("touch_marker").into(),
        dir.join("marker").into(),
    ]);
    let (_, status, _, stderr) =
        memtrail_env(&args, b"", &[("LD_LIBRARY_PATH", libc.library_path())]);
    assert_eq!(status.code(), Some(74), "{stderr}");
    assert!(stderr.contains("ref_ctr_offset"), "message: {stderr}");
    assert!(dir_entries(dir).is_empty(), "files left or command ran");
}

/// Check that memtrail exits 74, names ref_ctr_offset in its message, does
/// not run the command and leaves no file when another tracer's uprobe on
/// free has a different ref_ctr_offset; and works again once it is gone.
#[test]
fn cli_conflicting_uprobe_exits_74() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let libc = PrivateLibc::new();
    let holder = Holder::hold(&libc);

    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    expect_conflict(
        &libc,
        dir.path(),
        &["--events".as_ref(), events.as_os_str()],
    );
    assert_eq!(holder.finish(), Some(0));

    let run = capture(&cmd("baseline", &[]));
    run.expect_code(0);
}

/// Check that with per-process probes, where the command's libc probes are
/// made once it exists (held before exec), a conflict on one of them
/// (`free`, not the first of the link) also exits 74 before the command
/// ran, with no file written and nothing left behind: the held command
/// exits unexec'd instead of waiting for ever for its release (it did,
/// and kept memtrail's guardian alive).
#[test]
fn cli_conflicting_uprobe_per_process_leaves_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let libc = PrivateLibc::new();
    let holder = Holder::hold(&libc);
    let dir = tempfile::tempdir().expect("tempdir");
    expect_conflict(
        &libc,
        dir.path(),
        &["--probes".as_ref(), "per-process".as_ref()],
    );
    // The held command is a fork of memtrail: its command line names the
    // output directory. None may be left once memtrail has exited.
    let marker = dir.path().to_string_lossy().into_owned();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
        })
        .map(|pid| pid.to_string())
        .collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    assert_eq!(holder.finish(), Some(0));
}

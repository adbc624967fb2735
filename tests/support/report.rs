//! Helpers for the `report_*` tests (`tests/report/`).
//!
//! - Profiles: `tests/fixtures/report/sites.json` is a hand-written profile
//!   with six stacks of known frames and metrics; tests read it as a
//!   `serde_json::Value`, change what they need, and write it into a fresh
//!   temporary directory. It stays a version 2 profile (stacks with their
//!   frames written out), so every report test also proves that version 2
//!   files still read; `report_compact` converts it to version 3.
//! - Runs: [`memtrail`] runs the binary under test ([`super::memtrail_bin`]:
//!   `MEMTRAIL_BIN` runs another build) and collects its exit code and
//!   output.
//!
//! The fixture's stacks, with their metrics (allocations, bytes, live at
//! peak, leaked bytes, leaked blocks; blocks live at peak: 300, 50 and 100
//! for stacks 10, 20 and 30, 0 for the others). Every stack is of process
//! 100 (`/opt/shop/bin/shop`) but 50. Frames in `shop` (build id
//! `5d2c9e0f…`) are at load address 0x400000, those in libc (build id
//! `c047672c…`) at 0x7f0000000000.
//!
//! | id | frames, innermost first | metrics |
//! | --- | --- | --- |
//! | 10 | `std::vector<int>::push_back` inlined into `make_buffer` (0x401a10), `main`:12, libc 0x7f0000029d90 | 1000, 6000000, 3000000, 0, 0 |
//! | 20 | `load_config`:88 (0x402000), `main`:13 (0x401240), libc | 200, 2500000, 500000, 500000, 5 |
//! | 30 | `parse;token`:120, `load_config`:90, `main`:13 (0x401240), libc | 299, 1499999, 500000, 100000, 2 |
//! | 40 | 0xdead0 (no module), `main`:14 | 1, 1, 0, 0, 0 |
//! | 50 | `free_list_grow` (no file), in process 101 (`/usr/bin/helper`) | 1, 1, 0, 0, 0 |
//! | 60 | as 20 but `main` at 0x401250 | 100, 500000, 0, 0, 0 |

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The fixture profile.
pub fn sites() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report/sites.json");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// Writes `doc` as `profile.json` into `dir`.
pub fn write_profile(dir: &Path, doc: &Value) -> PathBuf {
    let path = dir.join("profile.json");
    fs::write(&path, serde_json::to_vec_pretty(doc).expect("serialize")).expect("write profile");
    path
}

/// What one memtrail run did.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Run {
    pub fn stdout(&self) -> &str {
        std::str::from_utf8(&self.stdout).expect("stdout is UTF-8")
    }

    /// Asserts memtrail exited with `code` and returns `self`.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "exit code; stderr:\n{}", self.stderr);
        self
    }
}

/// Runs `memtrail ARGS` with no stdin.
pub fn memtrail<S: AsRef<OsStr>>(args: &[S]) -> Run {
    // A working directory of its own: a run without --output keeps its
    // profile there (memtrail.CMD.PID.json), not in the checkout.
    let cwd = tempfile::tempdir().expect("create a working directory");
    let out = Command::new(super::memtrail_bin())
        .current_dir(cwd.path())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run memtrail");
    Run {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The `id`s of a JSON report's stacks, in order.
pub fn json_ids(report: &Value) -> Vec<u64> {
    report["stacks"]
        .as_array()
        .expect("stacks array")
        .iter()
        .map(|s| {
            s["id"]
                .as_str()
                .and_then(|id| id.parse().ok())
                .expect("id is a decimal string")
        })
        .collect()
}

/// What a bounded run of `memtrail ARGS` did: its exit code, stderr and
/// peak RSS (KiB, the kernel's `ru_maxrss` of memtrail).
pub struct Measured {
    pub code: Option<i32>,
    pub stderr: String,
    pub max_rss_kib: i64,
}

/// Runs `memtrail ARGS` under the `measure` fixture, which takes its peak
/// RSS from `wait4` (forked from a small process: a child's `ru_maxrss`
/// keeps what it had before it exec'd, and this test process's is large);
/// killed if it still runs after 120 s (a bound on failure, not a timing
/// assumption: it must neither block nor run without end).
pub fn measured<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Measured {
    let mut child = Command::new(super::fixture("measure"))
        .arg(super::memtrail_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let watchdog = super::Watchdog::new(child.id());
    let output = child.wait_with_output().expect("wait for memtrail");
    watchdog.disarm();
    let stdout = String::from_utf8_lossy(&output.stdout);
    Measured {
        code: output.status.code(),
        stderr: reader.join().expect("stderr reader"),
        max_rss_kib: stdout.trim().parse().expect("measure prints the peak RSS"),
    }
}

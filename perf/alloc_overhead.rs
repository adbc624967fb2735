//! End-to-end cost of a malloc/free pair in a tight C loop, three ways, side
//! by side in one run:
//! - bare: no probes;
//! - floor: empty BPF programs at exactly memtrail's probe sites (what the
//!   kernel's uprobe machinery costs on its own);
//! - memtrail: the loop under `memtrail run`, without and with stacks.
//!
//! A fourth row probes `free` at its entry (its `test %rdi,%rdi`, which the
//! kernel single-steps) to show what moving the probe past the NULL test
//! saves.
//!
//! Run: `cargo bench --bench alloc_overhead` (as root). Target: memtrail
//! within 1.2x of the floor.

use std::hint::black_box;
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use memtrail::attach::{self, AllocPrograms, Links, Site};
use memtrail::skel::floor::FloorSkelBuilder;

const PAIRS: u64 = 300_000;
const ROUNDS: usize = 15;

fn build_loop(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("perf/fixtures/alloc_loop.c");
    let exe = dir.join("alloc_loop");
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc runs");
    assert!(status.success(), "building {}", src.display());
    exe
}

/// Runs `cmd` and parses the loop's ns-per-pair line.
fn ns_per_pair(cmd: &mut Command) -> f64 {
    let out = cmd.output().expect("loop runs");
    assert!(out.status.success(), "{cmd:?} failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().expect("the loop prints ns per pair")
}

/// Median and minimum: this VM's noise is large, and the minimum (the run
/// least disturbed) is the steadier of the two.
fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

/// Runs the loop while empty programs sit at `sites`.
fn under_floor(exe: &Path, sites: &[Site]) -> f64 {
    let mut storage = MaybeUninit::uninit();
    let skel = FloorSkelBuilder::default()
        .open(&mut storage)
        .expect("open floor")
        .load()
        .expect("load floor");
    let fd = |p: &libbpf_rs::ProgramMut<'_>| p.as_fd().try_clone_to_owned().expect("dup prog fd");
    let progs = AllocPrograms {
        enter: fd(&skel.progs.floor_enter),
        ret: fd(&skel.progs.floor_return),
        free: fd(&skel.progs.floor_enter),
        new: fd(&skel.progs.floor_enter),
    };
    let mut links = Links::default();
    attach::attach_sites(&progs, sites, &mut links).expect("attach floor");
    ns_per_pair(Command::new(exe).arg(PAIRS.to_string()))
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = build_loop(dir.path());
    let libc = attach::libc_path().expect("libc");
    let sites = attach::find_sites(&libc, &attach::api::libc()).expect("sites");
    // The same sites with free probed at its entry instruction.
    let entry_sites: Vec<Site> = sites
        .iter()
        .map(|s| Site {
            offset: s.offset - s.skipped,
            skipped: 0,
            emulated: s.skipped == 0 && s.emulated,
            ..s.clone()
        })
        .collect();
    let memtrail = env!("CARGO_BIN_EXE_memtrail");

    let (mut bare, mut floor, mut traced, mut floor_entry) = (vec![], vec![], vec![], vec![]);
    let mut no_stacks = vec![];
    for _ in 0..ROUNDS {
        bare.push(ns_per_pair(Command::new(&exe).arg(PAIRS.to_string())));
        floor.push(under_floor(&exe, black_box(&sites)));
        traced.push(ns_per_pair(
            Command::new(memtrail)
                .args(["run", "-q", "--"])
                .arg(&exe)
                .arg(PAIRS.to_string()),
        ));
        floor_entry.push(under_floor(&exe, black_box(&entry_sites)));
        no_stacks.push(ns_per_pair(
            Command::new(memtrail)
                .args(["run", "-q", "--stack-depth", "0", "--"])
                .arg(&exe)
                .arg(PAIRS.to_string()),
        ));
    }
    let no_stacks = stats(no_stacks);
    let (bare, floor, traced, floor_entry) =
        (stats(bare), stats(floor), stats(traced), stats(floor_entry));
    assert!(bare.0 > 0.0 && floor.0 > bare.0 && traced.0 > bare.0);

    let mut w = io::stdout().lock();
    let _ = writeln!(
        w,
        "malloc/free pair, {ROUNDS} rounds of {PAIRS} pairs: median (min) ns, ratio to the floor's median (min)"
    );
    let row = |w: &mut io::StdoutLock<'_>, name: &str, (med, min): (f64, f64)| {
        let _ = writeln!(
            w,
            "  {name:<30} {med:8.1} ({min:8.1}) ns   {:.2}x ({:.2}x)",
            med / floor.0,
            min / floor.1
        );
    };
    row(&mut w, "bare", bare);
    row(&mut w, "uprobe floor (memtrail sites)", floor);
    row(&mut w, "memtrail run --stack-depth 0", no_stacks);
    row(&mut w, "memtrail run (stacks, 127)", traced);
    row(&mut w, "floor, free probed at entry", floor_entry);
}

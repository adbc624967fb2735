//! `memtrail bench`: memory metrics of benchmarks, each run under a full
//! capture, into a versioned results document (docs/bench.md).
//!
//! Each run is a child `memtrail run -q -o PROFILE -- CMD` of the current
//! executable, and its metrics are read back from the profile: the harness
//! depends on the profile format only, not on the capture's library API,
//! and a capture failure is the child's (its message on stderr, its exit
//! code passed on).
//!
//! Files: a run writes into `DIR/.NAME.tmp-PID/` (`DIR` is
//! `$CARGO_TARGET_DIR/memtrail`, else `target/memtrail`; `NAME` the
//! `--save-baseline` name, else `new`): one profile per run
//! (`BENCH/run-K.json`) and `results.json`. Only a bench that got through
//! every benchmark replaces `DIR/NAME/` with it; otherwise the temporary
//! directory is removed, so a failed bench leaves the last good results in
//! place and nothing half-written. Stale temporary directories of memtrail
//! processes that are gone are removed on the next bench.
//!
//! Per-region metrics: the USDT region markers a benchmark hits (the
//! profile's `regions`) fill [`results::BenchResult::regions`] in
//! [`collect`]; `compare`, BMF and github-action-benchmark treat a region
//! `R` of benchmark `B` as a benchmark `B/R`.

pub mod beside;
pub mod format;
pub mod results;
pub mod suite;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::profile::Profile;
use crate::report::{self, ReportError};
use results::{BenchResult, Metric, Results, SiteRuns, Stat, sites_by_key};
pub use suite::Benchmark;

/// Most differing sites kept per non-deterministic benchmark.
pub const MAX_DIFFERING_SITES: usize = 20;

/// Why `memtrail bench` failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot read the suite {}", path.display())]
    SuiteRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid suite {}: {msg}", path.display())]
    SuiteInvalid { path: PathBuf, msg: String },
    #[error("{0}")]
    Usage(String),
    #[error("cannot start `memtrail run` ({})", exe.display())]
    Spawn {
        exe: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `memtrail run` wrote no profile: its own message is on stderr.
    #[error("benchmark `{name}` run {run}: the capture failed (memtrail run exited with {code})")]
    Capture { name: String, run: u32, code: i32 },
    #[error("benchmark `{name}` run {run}: cannot read its profile")]
    Profile {
        name: String,
        run: u32,
        #[source]
        source: ReportError,
    },
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the results {}", path.display())]
    ResultsRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not a valid memtrail bench results file: {msg}", path.display())]
    ResultsInvalid { path: PathBuf, msg: String },
}

/// What to run and where to put it.
#[derive(Debug)]
pub struct BenchOptions {
    pub benchmarks: Vec<Benchmark>,
    /// Flags passed on to every `memtrail run` (capture options).
    pub capture_args: Vec<OsString>,
    /// `target/memtrail` or where `--dir` says.
    pub dir: PathBuf,
    /// The name of the results directory under `dir`: a baseline name, or
    /// `new`.
    pub save_as: String,
    pub quiet: bool,
}

/// The directory results go to: `$CARGO_TARGET_DIR/memtrail`, else
/// `target/memtrail` (like criterion's `target/criterion`), absolute.
pub fn default_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("target"), PathBuf::from);
    std::path::absolute(target.join("memtrail")).unwrap_or_else(|_| target.join("memtrail"))
}

/// The results document of a saved baseline (or `new`).
pub fn results_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name).join("results.json")
}

/// Runs every benchmark and saves the results; returns them. Progress goes
/// to `progress` unless quiet.
pub fn run(opts: &BenchOptions, progress: &mut dyn Write) -> Result<Results, BenchError> {
    let io_err = |what, path: &Path| {
        let path = path.to_owned();
        move |source| BenchError::Io { what, path, source }
    };
    fs::create_dir_all(&opts.dir).map_err(io_err("cannot create", &opts.dir))?;
    remove_stale(&opts.dir);
    let final_dir = opts.dir.join(&opts.save_as);
    let work = opts
        .dir
        .join(format!(".{}.tmp-{}", opts.save_as, std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir(&work).map_err(io_err("cannot create", &work))?;
    let outcome = run_all(opts, &work, &final_dir, progress).and_then(|results| {
        let path = work.join("results.json");
        let mut text = serde_json::to_vec_pretty(&results)
            .map_err(io::Error::from)
            .map_err(io_err("cannot write", &path))?;
        text.push(b'\n');
        fs::write(&path, text).map_err(io_err("cannot write", &path))?;
        replace_dir(&work, &final_dir)?;
        Ok(results)
    });
    if outcome.is_err() {
        let _ = fs::remove_dir_all(&work);
    }
    outcome
}

/// Moves `work` to `dest`, replacing what was there.
fn replace_dir(work: &Path, dest: &Path) -> Result<(), BenchError> {
    let old = dest.with_file_name(format!(
        ".{}.old-{}",
        dest.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let had_old = match fs::rename(dest, &old) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(source) => {
            return Err(BenchError::Io {
                what: "cannot replace",
                path: dest.to_owned(),
                source,
            });
        }
    };
    if let Err(source) = fs::rename(work, dest) {
        if had_old {
            let _ = fs::rename(&old, dest);
        }
        return Err(BenchError::Io {
            what: "cannot replace",
            path: dest.to_owned(),
            source,
        });
    }
    if had_old {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
}

/// Removes `.NAME.tmp-PID` and `.NAME.old-PID` directories of processes
/// that no longer exist (a bench that was killed).
fn remove_stale(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let pid = name
            .strip_prefix('.')
            .and_then(|n| n.rsplit_once(".tmp-").or_else(|| n.rsplit_once(".old-")))
            .and_then(|(_, pid)| pid.parse::<u32>().ok());
        let gone = pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
        if gone {
            tracing::debug!("removing stale {name}");
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn run_all(
    opts: &BenchOptions,
    work: &Path,
    final_dir: &Path,
    progress: &mut dyn Write,
) -> Result<Results, BenchError> {
    let exe = std::env::current_exe().map_err(|source| BenchError::Spawn {
        exe: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let start = Instant::now();
    // Wall time of the child captures, for the harness's own cost (perf/).
    let mut captures = Duration::ZERO;
    let mut total_runs = 0u32;
    let count = opts.benchmarks.len();
    let mut out = Vec::with_capacity(count);
    for (i, bench) in opts.benchmarks.iter().enumerate() {
        let bench_dir = work.join(&bench.name);
        fs::create_dir(&bench_dir).map_err(|source| BenchError::Io {
            what: "cannot create",
            path: bench_dir.clone(),
            source,
        })?;
        let mut profiles = Vec::with_capacity(bench.runs as usize);
        let mut rels = Vec::with_capacity(bench.runs as usize);
        let mut digests = Vec::with_capacity(bench.runs as usize);
        for run in 1..=bench.runs {
            if !opts.quiet {
                let _ = writeln!(
                    progress,
                    "memtrail bench: [{}/{count}] {}: run {run} of {} ({} elapsed)",
                    i + 1,
                    bench.name,
                    bench.runs,
                    seconds(start.elapsed())
                );
            }
            let rel = PathBuf::from(&bench.name).join(format!("run-{run}.json"));
            let path = work.join(&rel);
            let t = Instant::now();
            capture(&exe, bench, &opts.capture_args, &path, run)?;
            captures += t.elapsed();
            total_runs += 1;
            let (profile, sha256) = read_run(&path).map_err(|source| BenchError::Profile {
                name: bench.name.clone(),
                run,
                source,
            })?;
            profiles.push(profile);
            digests.push((rel.to_string_lossy().into_owned(), sha256));
            rels.push(rel);
        }
        let mut result = collect(bench, &profiles, rels);
        result.sha256 = digests.into_iter().collect();
        if !opts.quiet {
            let _ = write_done(progress, &result);
        }
        out.push(result);
    }
    tracing::info!(
        runs = total_runs,
        captures_us = captures.as_micros() as u64,
        "child captures' wall time"
    );
    Ok(Results::new(final_dir.to_owned(), out))
}

/// A run's profile and its SHA-256, from one open of the file.
fn read_run(path: &Path) -> Result<(Profile, String), ReportError> {
    let read_err = |source| ReportError::Read {
        path: path.to_owned(),
        source,
    };
    let mut input = report::open_input(path).map_err(read_err)?;
    let sha256 = input
        .sha256(report::MAX_PROFILE_BYTES, "a profile")
        .map_err(read_err)?;
    Ok((report::read_profile(&mut input, path)?, sha256))
}

/// `1.234 s`.
fn seconds(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn write_done(w: &mut dyn Write, r: &BenchResult) -> io::Result<()> {
    let v = |m: Metric| r.value(m).unwrap_or(0);
    write!(
        w,
        "memtrail bench: {}: {} allocations, {} B allocated, peak {} B, leaked {} B",
        r.name,
        format::grouped(v(Metric::Allocations)),
        format::grouped(v(Metric::AllocatedBytes)),
        format::grouped(v(Metric::PeakLiveBytes)),
        format::grouped(v(Metric::LeakedBytes))
    )?;
    if !r.deterministic {
        write!(
            w,
            " — NON-DETERMINISTIC over {} runs ({} sites differ)",
            r.runs,
            r.differing_sites.len()
        )?;
    }
    writeln!(w)
}

/// One run: `memtrail run -q -o PROFILE [capture args] -- CMD` in the
/// benchmark's directory and environment. The command's stdout goes to
/// memtrail's stderr: stdout is for the results.
fn capture(
    exe: &Path,
    bench: &Benchmark,
    capture_args: &[OsString],
    profile: &Path,
    run: u32,
) -> Result<(), BenchError> {
    let spawn_err = |source| BenchError::Spawn {
        exe: exe.to_owned(),
        source,
    };
    let stderr = io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(spawn_err)?;
    let status = Command::new(exe)
        .arg("run")
        .arg("-q")
        .arg("-o")
        .arg(profile)
        .args(capture_args)
        .arg("--")
        .args(&bench.command)
        .current_dir(&bench.cwd)
        .envs(&bench.env)
        .stdin(Stdio::null())
        .stdout(Stdio::from(stderr))
        .status()
        .map_err(spawn_err)?;
    if profile.exists() {
        return Ok(());
    }
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Err(BenchError::Capture {
        name: bench.name.clone(),
        run,
        code,
    })
}

/// A benchmark's result from its runs' profiles.
pub fn collect(bench: &Benchmark, profiles: &[Profile], rels: Vec<PathBuf>) -> BenchResult {
    let metrics: BTreeMap<String, Stat> = Metric::ALL
        .into_iter()
        .map(|m| {
            (
                m.key().to_owned(),
                Stat::of(profiles.iter().map(|p| m.of(p)).collect()),
            )
        })
        .collect();
    let regions = results::regions_of(profiles);
    let deterministic = metrics
        .values()
        .chain(regions.values().flat_map(|r| r.values()))
        .all(|s| s.spread() == 0);
    // The median run of allocations represents the benchmark.
    let median = metrics[Metric::Allocations.key()].value;
    let rep = profiles
        .iter()
        .position(|p| p.totals.allocations == median)
        .unwrap_or(0);
    let exits: Vec<(Option<i32>, Option<i32>)> = profiles
        .iter()
        .map(|p| (p.exit.code, p.exit.signal))
        .collect();
    BenchResult {
        name: bench.name.clone(),
        command: bench.command.clone(),
        cwd: bench.cwd.clone(),
        runs: profiles.len() as u32,
        exit: profiles[rep].exit,
        exit_consistent: exits.windows(2).all(|w| w[0] == w[1]),
        deterministic,
        differing_sites: if deterministic {
            Vec::new()
        } else {
            differing_sites(profiles)
        },
        profile: rels[rep].clone(),
        profiles: rels,
        sha256: BTreeMap::new(),
        metrics,
        regions,
    }
}

/// Sites (merged by [`results::site_key`]) whose allocations or bytes
/// differ between runs, largest spread of bytes first.
fn differing_sites(profiles: &[Profile]) -> Vec<SiteRuns> {
    let per_run: Vec<_> = profiles.iter().map(sites_by_key).collect();
    let keys: BTreeSet<&String> = per_run.iter().flat_map(|s| s.keys()).collect();
    let mut out: Vec<SiteRuns> = keys
        .into_iter()
        .filter_map(|key| {
            let name = per_run
                .iter()
                .find_map(|s| s.get(key).map(|e| e.name.clone()))
                .unwrap_or_default();
            let allocations: Vec<u64> = per_run
                .iter()
                .map(|s| s.get(key).map_or(0, |e| e.allocations))
                .collect();
            let bytes: Vec<u64> = per_run
                .iter()
                .map(|s| s.get(key).map_or(0, |e| e.bytes))
                .collect();
            let same = |v: &[u64]| v.windows(2).all(|w| w[0] == w[1]);
            (!same(&allocations) || !same(&bytes)).then(|| SiteRuns {
                site: name,
                stack: key.clone(),
                allocations,
                bytes,
            })
        })
        .collect();
    let spread = |v: &[u64]| v.iter().max().unwrap_or(&0) - v.iter().min().unwrap_or(&0);
    out.sort_by(|a, b| {
        spread(&b.bytes)
            .cmp(&spread(&a.bytes))
            .then(spread(&b.allocations).cmp(&spread(&a.allocations)))
            .then(a.stack.cmp(&b.stack))
    });
    out.truncate(MAX_DIFFERING_SITES);
    out
}

/// Reads a results document (or a saved baseline's).
pub fn load_results(path: &Path) -> Result<Results, BenchError> {
    let mut input = report::open_input(path).map_err(|source| BenchError::ResultsRead {
        path: path.to_owned(),
        source,
    })?;
    read_results(&mut input, path)
}

/// Reads the results document of `input` (opened from `path`): its
/// `format` and `version` first, then the document, whose benchmark names
/// must be unique (compare matches benchmarks by name).
pub fn read_results(input: &mut report::InputFile, path: &Path) -> Result<Results, BenchError> {
    let invalid = |msg: String| BenchError::ResultsInvalid {
        path: path.to_owned(),
        msg,
    };
    let json_err = |e| match e {
        report::JsonError::Read(source) => BenchError::ResultsRead {
            path: path.to_owned(),
            source,
        },
        report::JsonError::Invalid(e) => invalid(e.to_string()),
    };
    #[derive(serde::Deserialize)]
    #[serde(expecting = "memtrail bench results (a JSON object)")]
    struct Header {
        format: Option<serde_json::Value>,
        version: Option<serde_json::Value>,
    }
    let what = "a results document";
    let header: Header = input
        .json(report::MAX_PROFILE_BYTES, what)
        .map_err(json_err)?;
    if header.format.as_ref().and_then(|f| f.as_str()) != Some(results::RESULTS_FORMAT) {
        return Err(invalid(format!(
            "its \"format\" is not \"{}\"",
            results::RESULTS_FORMAT
        )));
    }
    if header.version.as_ref().and_then(|f| f.as_u64()) != Some(u64::from(results::RESULTS_VERSION))
    {
        return Err(invalid(format!(
            "version {}, this memtrail reads version {}",
            header.version.map_or("missing".into(), |v| v.to_string()),
            results::RESULTS_VERSION
        )));
    }
    let results: Results = input
        .json(report::MAX_PROFILE_BYTES, what)
        .map_err(json_err)?;
    // A region R of benchmark B is compared as a benchmark `B/R`: no name
    // may be given twice, counting those.
    let mut names = BTreeSet::new();
    let all = results.benchmarks.iter().flat_map(|b| {
        std::iter::once(b.name.clone()).chain(b.regions.keys().map(|r| format!("{}/{r}", b.name)))
    });
    for name in all {
        if !names.insert(name.clone()) {
            return Err(invalid(format!(
                "two benchmarks are named `{name}`: benchmarks are matched by name"
            )));
        }
    }
    Ok(results)
}

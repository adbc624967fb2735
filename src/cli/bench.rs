//! The `memtrail bench` and `memtrail compare` command lines: flags, and
//! running them to an exit code. `cli/mod.rs` only wires them in.

use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::bench::format::{self, BenchFormat};
use crate::bench::{BenchError, BenchOptions, suite};
use crate::compare::{self, CompareError, FlameMetric, Input, Thresholds};
use crate::output::OutputFile;

/// Exit codes of `memtrail bench` and `memtrail compare`.
pub mod exit {
    /// Nothing regressed (compare), every benchmark ran and exited 0
    /// (bench).
    pub const OK: i32 = 0;
    /// Something regressed (compare, bench --baseline), or a benchmark's
    /// command exited nonzero (bench).
    pub const REGRESSED: i32 = 1;
    /// Bad usage or bad input (a suite, results or profile that cannot be
    /// read or is invalid, a missing baseline).
    pub const BAD_INPUT: i32 = 2;
    /// An output cannot be written.
    pub const OUTPUT: i32 = crate::cli::exit::OUTPUT;
    /// memtrail itself failed.
    pub const INTERNAL: i32 = crate::cli::exit::INTERNAL;
}

pub const BENCH_EXIT_HELP: &str = "\
Exit status:
    0    every benchmark ran and its command exited 0 (and, with --baseline,
         nothing regressed)
    1    a benchmark's command exited nonzero or was killed, or with
         --baseline a metric regressed beyond its --threshold
    2    bad usage or input: an invalid suite (also: a benchmark that
         cannot be started - a working directory missing or not a
         directory, a NUL byte in its command or environment), a missing
         baseline, results (--from, --baseline) that are not valid, name a
         benchmark twice, or are not a regular file of at most 1 GiB
    73   the results cannot be written (--output, the results directory),
         --output is a file the bench reads (the suite, --from, the
         baseline's results), or --output names an existing file (or a
         JSON document's existing STEM.profiles/) and --force was not
         given
  A capture that failed (no profile) ends the bench with the exit status of
  its `memtrail run` (e.g. 71 lost events, 72 missing privileges, 127 the
  command was not found); its message is above it on stderr.";

pub const COMPARE_EXIT_HELP: &str = "\
Exit status:
    0    nothing regressed
    1    a metric of a benchmark regressed beyond its --threshold (or its
         command no longer exits 0)
    2    bad usage or input (a file that is not memtrail bench results or a
         profile, or not a regular file of at most 1 GiB; results naming a
         benchmark twice; an empty --threshold, or a metric's limit given
         twice; an unknown benchmark for --format flamegraph)
    73   the report cannot be written, --output is BASE or NEW, or
         --output names an existing file and --force was not given";

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Run the benchmarks of a TOML suite file (name, command, cwd, env,
    /// runs: docs/bench.md) instead of one command.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["name", "command"])]
    pub suite: Option<PathBuf>,

    /// Run nothing: render the results document RESULTS.json (e.g.
    /// target/memtrail/new/results.json) in --format (a regular file of at
    /// most 1 GiB).
    #[arg(long, value_name = "RESULTS.json",
          conflicts_with_all = ["suite", "name", "command", "runs", "save_baseline", "baseline"])]
    pub from: Option<PathBuf>,

    /// The name of the command-line benchmark [default: the program's file
    /// name].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Runs of each benchmark (overrides the suite's). With more than one,
    /// the spread of each metric is reported and a benchmark whose metrics
    /// differ between runs is flagged non-deterministic, with the sites that
    /// differed. [default: the suite's, else 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: Option<u32>,

    /// Format of the results on stdout or --output: text, json (the results
    /// document, docs/bench.md), markdown, bmf (Bencher Metric Format), gab
    /// (github-action-benchmark customSmallerIsBetter). [default: from
    /// --output's extension: `.json` the results document, `.md` Markdown;
    /// else text]
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub format: Option<BenchFormat>,

    /// Write the results in --format to PATH instead of stdout (a file
    /// appears whole once every benchmark ran; PATH may not be a file the
    /// bench reads). The JSON results document is also always saved as
    /// DIR/new/results.json (or DIR/NAME/ with --save-baseline), with the
    /// profiles it names; written to PATH, it keeps a copy of its profiles
    /// beside it, in STEM.profiles/ (A.profiles/ for A.json), so that it
    /// compares fully whatever later benches replace.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Replace the file --output names, as `memtrail run --force` does
    /// (and, for a JSON document, its STEM.profiles/). Without it, an
    /// existing regular file (or profiles directory) there is refused
    /// (exit 73) before any benchmark runs.
    #[arg(long)]
    pub force: bool,

    /// Save the results and profiles as baseline NAME (DIR/NAME/) instead of
    /// DIR/new/.
    #[arg(long, value_name = "NAME")]
    pub save_baseline: Option<String>,

    /// Compare the results with the saved baseline NAME, as `memtrail
    /// compare` would (the comparison goes to stderr); exit 1 if a metric
    /// regressed.
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,

    /// With --baseline: how much a metric may grow, as in `memtrail
    /// compare --threshold` [default: 0, exact].
    #[arg(long = "threshold", value_name = "LIMITS", value_parser = compare::check_threshold,
          requires = "baseline")]
    pub thresholds: Vec<String>,

    /// Where results and baselines are kept [default: $CARGO_TARGET_DIR/memtrail,
    /// else target/memtrail].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Passed on to every capture, as `memtrail run --pressure-timeout`.
    #[arg(long, value_name = "TIMEOUT", env = "MEMTRAIL_PRESSURE_TIMEOUT",
          allow_hyphen_values = true, value_parser = check_timeout)]
    pub pressure_timeout: Option<String>,

    /// Passed on to every capture, as `memtrail run --ring-size`.
    #[arg(long, value_name = "BYTES", value_parser = check_size)]
    pub ring_size: Option<String>,

    /// Passed on to every capture, as `memtrail run --stack-ring-size`.
    #[arg(long, value_name = "BYTES", value_parser = check_size)]
    pub stack_ring_size: Option<String>,

    /// Passed on to every capture, as `memtrail run --watermark`.
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=99))]
    pub watermark: Option<u8>,

    /// Passed on to every capture, as `memtrail run --stack-depth` (0 leaves
    /// no sites for compare to name).
    #[arg(long, value_name = "FRAMES",
          value_parser = clap::value_parser!(u32).range(0..=crate::session::MAX_STACK_DEPTH as i64))]
    pub stack_depth: Option<u32>,

    /// No progress on stderr.
    #[arg(short, long)]
    pub quiet: bool,

    /// The benchmark command and its arguments (without --suite).
    #[arg(last = true, value_name = "CMD", required_unless_present_any = ["suite", "from"])]
    pub command: Vec<String>,
}

fn check_timeout(s: &str) -> Result<String, String> {
    s.parse::<crate::pressure::PressureTimeout>()
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

fn check_size(s: &str) -> Result<String, String> {
    crate::cli::values::parse_size(s).map(|_| s.to_owned())
}

/// `memtrail compare` output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareFormat {
    /// For a terminal.
    Text,
    /// For a pull-request comment.
    Markdown,
    /// The comparison as a JSON document (docs/bench.md).
    Json,
    /// A differential flame graph (SVG) of one benchmark's two profiles.
    Flamegraph,
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The base: bench results (results.json) or a profile.
    #[arg(value_name = "BASE")]
    pub base: PathBuf,

    /// The new results or profile. A profile is a benchmark named
    /// `profile`, so it compares with another profile.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,

    /// How much a metric may grow before it regresses: `1%` for every
    /// metric, `peak=0.5%,allocations=0` per metric (a percentage of the
    /// base, an absolute count or bytes, or `inf`: never a regression), or
    /// both (`1%,leaked=0`). Repeatable; each metric's limit (and the one
    /// for every metric) may be given once. Judged metrics, smaller is
    /// better: allocations, allocated_bytes (bytes), peak_live_bytes (peak),
    /// leaked_bytes (leaked), leaked_blocks (blocks), mmap_peak_bytes
    /// (mmap). Shown, never judged (no limit but `inf`): frees, and
    /// temporary_allocations (temporary), whose changes follow from the
    /// others' (a leak fixed adds frees). [default: 0, exact]
    #[arg(long = "threshold", value_name = "LIMITS", value_parser = compare::check_threshold)]
    pub thresholds: Vec<String>,

    /// Report format: text, markdown, json or flamegraph. [default: from
    /// --output's extension: `.json` JSON, `.md` Markdown, `.svg` a flame
    /// graph; else text]
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub format: Option<CompareFormat>,

    /// With --format flamegraph: the benchmark to draw (needed when the
    /// inputs have more than one).
    #[arg(long, value_name = "NAME")]
    pub bench: Option<String>,

    /// With --format flamegraph: what the graph is sized by.
    #[arg(long, value_enum, value_name = "METRIC", default_value_t = FlameMetric::Bytes)]
    pub by: FlameMetric,

    /// Allocation sites named per regressed benchmark (0: none).
    #[arg(long, value_name = "N", default_value_t = compare::DEFAULT_SITES)]
    pub sites: usize,

    /// Write the report to PATH instead of stdout (a file appears whole;
    /// PATH may not be BASE or NEW; an existing file is refused unless
    /// --force).
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Replace the file --output names, as `memtrail run --force` does
    /// (without it, an existing regular file is refused: exit 73).
    #[arg(long)]
    pub force: bool,
}

/// The extension of `path`, lower case.
fn extension(path: Option<&Path>) -> Option<String> {
    path.and_then(Path::extension)
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
}

/// The format of `bench` results: `--format`, else by --output's
/// extension, as `--events` picks by `.mtev` (issue 26: `-o results.json`
/// wrote a text table).
pub fn bench_format(format: Option<BenchFormat>, output: Option<&Path>) -> BenchFormat {
    format.unwrap_or_else(|| match extension(output).as_deref() {
        Some("json") => BenchFormat::Json,
        Some("md" | "markdown") => BenchFormat::Markdown,
        _ => BenchFormat::Text,
    })
}

/// The format of a comparison: `--format`, else by --output's extension.
pub fn compare_format(format: Option<CompareFormat>, output: Option<&Path>) -> CompareFormat {
    format.unwrap_or_else(|| match extension(output).as_deref() {
        Some("json") => CompareFormat::Json,
        Some("md" | "markdown") => CompareFormat::Markdown,
        Some("svg") => CompareFormat::Flamegraph,
        _ => CompareFormat::Text,
    })
}

/// The device and inode of the file `path` names, if any.
fn path_id(path: &Path) -> Option<crate::sys::FileId> {
    std::fs::metadata(path)
        .ok()
        .map(|m| crate::sys::FileId::of(&m))
}

/// The exit code for a failed bench.
pub fn bench_exit_code(err: &BenchError) -> i32 {
    match err {
        BenchError::SuiteRead { .. }
        | BenchError::SuiteInvalid { .. }
        | BenchError::Usage(_)
        | BenchError::ResultsRead { .. }
        | BenchError::ResultsInvalid { .. } => exit::BAD_INPUT,
        BenchError::Capture { code, .. } => *code,
        BenchError::Io { .. } => exit::OUTPUT,
        BenchError::Spawn { .. } | BenchError::Profile { .. } => exit::INTERNAL,
    }
}

/// The exit code for a failed compare.
pub fn compare_exit_code(err: &CompareError) -> i32 {
    match err {
        CompareError::Output(_) | CompareError::Stdout(_) => exit::OUTPUT,
        _ => exit::BAD_INPUT,
    }
}

/// Runs `memtrail bench`: results to `stdout` (or --output), progress and
/// the --baseline comparison to `stderr`. Returns the exit code.
pub fn bench(
    args: BenchArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<i32, BenchError> {
    let format = bench_format(args.format, args.output.as_deref());
    if let Some(path) = &args.from {
        let mut input =
            crate::report::open_input(path).map_err(|source| BenchError::ResultsRead {
                path: path.clone(),
                source,
            })?;
        let results = crate::bench::read_results(&mut input, path)?;
        let out_file = open_output(
            args.output.as_deref(),
            args.force,
            &[("the results", path, input.id())],
        )?;
        write_results_to(&results, format, out_file, stdout, || Ok(()))?;
        return Ok(exit::OK);
    }
    let benchmarks = match &args.suite {
        Some(path) => suite::load(path, args.runs)?,
        None => {
            let name = args
                .name
                .clone()
                .unwrap_or_else(|| suite::default_name(&args.command));
            suite::check_name(&name).map_err(BenchError::Usage)?;
            let cwd = std::env::current_dir().map_err(|source| BenchError::Io {
                what: "cannot read the working directory",
                path: PathBuf::from("."),
                source,
            })?;
            vec![suite::Benchmark {
                name,
                command: args.command.clone(),
                cwd,
                env: Default::default(),
                runs: args.runs.unwrap_or(1),
            }]
        }
    };
    let dir = args
        .dir
        .clone()
        .map_or_else(crate::bench::default_dir, |d| {
            std::path::absolute(&d).unwrap_or(d)
        });
    let save_as = args
        .save_baseline
        .clone()
        .unwrap_or_else(|| "new".to_owned());
    suite::check_name(&save_as).map_err(|e| BenchError::Usage(format!("--save-baseline: {e}")))?;
    let thresholds = Thresholds::parse_all(&args.thresholds).map_err(BenchError::Usage)?;
    // Read before the run replaces anything.
    let baseline = match &args.baseline {
        Some(name) if *name == save_as => {
            return Err(BenchError::Usage(format!(
                "--baseline {name} would be replaced by this run's results: save them under \
                 another name (--save-baseline)"
            )));
        }
        Some(name) => {
            suite::check_name(name).map_err(|e| BenchError::Usage(format!("--baseline: {e}")))?;
            let path = crate::bench::results_path(&dir, name);
            let results = crate::bench::load_results(&path)?;
            let id = path_id(&path);
            Some(Input { path, results, id })
        }
        None => None,
    };
    // The files this bench reads: --output may be none of them.
    let mut inputs: Vec<(&str, &Path, crate::sys::FileId)> = Vec::new();
    if let Some((path, id)) = args.suite.as_deref().and_then(|p| Some((p, path_id(p)?))) {
        inputs.push(("the suite", path, id));
    }
    if let Some((path, id)) = baseline
        .as_ref()
        .and_then(|b| Some((b.path.as_path(), b.id?)))
    {
        inputs.push(("the baseline's results", path, id));
    }
    let out_file = open_output(args.output.as_deref(), args.force, &inputs)?;
    let keep_beside = keep_beside(out_file.as_ref(), format, args.force)?;
    let opts = BenchOptions {
        benchmarks,
        capture_args: capture_args(&args),
        dir: dir.clone(),
        save_as: save_as.clone(),
        quiet: args.quiet,
    };
    let results = crate::bench::run(&opts, stderr)?;
    match keep_beside {
        Some(doc) => {
            let beside = crate::bench::beside::stage(&results, &doc)?;
            write_results_to(&beside.results, format, out_file, stdout, || {
                beside.commit()
            })?;
        }
        None => write_results_to(&results, format, out_file, stdout, || Ok(()))?,
    }
    let mut code = exit::OK;
    for r in &results.benchmarks {
        if r.exit.code != Some(0) {
            let _ = writeln!(
                stderr,
                "memtrail bench: {}: the command exited with {}",
                r.name,
                format::exit_text(&r.exit)
            );
            code = exit::REGRESSED;
        }
    }
    if let Some(base) = baseline {
        let new = Input {
            path: crate::bench::results_path(&dir, &save_as),
            results,
            id: None,
        };
        let c = compare::compare(&base, &new, &thresholds, compare::DEFAULT_SITES);
        let _ = compare::write_text(&c, stderr);
        if c.regressed {
            code = exit::REGRESSED;
        }
    }
    Ok(code)
}

/// The flags passed on to every `memtrail run`.
fn capture_args(args: &BenchArgs) -> Vec<OsString> {
    let mut capture_args: Vec<OsString> = Vec::new();
    let mut pass = |flag: &str, v: Option<String>| {
        if let Some(v) = v {
            capture_args.push(flag.into());
            capture_args.push(v.into());
        }
    };
    pass("--pressure-timeout", args.pressure_timeout.clone());
    pass("--ring-size", args.ring_size.clone());
    pass("--stack-ring-size", args.stack_ring_size.clone());
    pass("--watermark", args.watermark.map(|v| v.to_string()));
    pass("--stack-depth", args.stack_depth.map(|v| v.to_string()));
    capture_args
}

/// The results document whose profiles are kept beside it (issue 41): the
/// JSON document written to a file; its profiles directory checked before
/// any benchmark runs.
fn keep_beside(
    out_file: Option<&OutputFile>,
    format: BenchFormat,
    force: bool,
) -> Result<Option<PathBuf>, BenchError> {
    let doc = out_file
        .filter(|o| format == BenchFormat::Json && o.is_file())
        .map(|o| o.path().to_owned());
    if let Some(doc) = &doc {
        crate::bench::beside::check(doc, force)?;
    }
    Ok(doc)
}

/// Opens --output (none for `-`, standard output), refusing one of the
/// files the bench reads; an existing file is replaced only with `force`.
fn open_output(
    output: Option<&Path>,
    force: bool,
    inputs: &[(&str, &Path, crate::sys::FileId)],
) -> Result<Option<OutputFile>, BenchError> {
    let io_err = |e: crate::output::OutputError| BenchError::Io {
        what: "cannot write",
        path: e.path,
        source: e.source,
    };
    let Some(path) = output else {
        crate::output::check_not_input(Path::new("-"), inputs).map_err(io_err)?;
        return Ok(None);
    };
    crate::output::check_not_input(path, inputs).map_err(io_err)?;
    if path.as_os_str() == "-" {
        return Ok(None);
    }
    OutputFile::create_with(path, force)
        .map(Some)
        .map_err(io_err)
}

/// Writes `results` in `format` to `out_file` (else `stdout`);
/// `before_commit` runs once the file is written, before it is put in
/// place (a failure leaves no file).
fn write_results_to(
    results: &crate::bench::results::Results,
    format: BenchFormat,
    out_file: Option<OutputFile>,
    stdout: &mut dyn Write,
    before_commit: impl FnOnce() -> Result<(), BenchError>,
) -> Result<(), BenchError> {
    let write_err = |path: PathBuf| {
        move |source| BenchError::Io {
            what: "cannot write",
            path,
            source,
        }
    };
    match out_file {
        Some(out) => {
            let path = out.path().to_owned();
            let mut w = BufWriter::new(out.file());
            format::write(results, format, &mut w)
                .and_then(|()| w.flush())
                .map_err(write_err(path))?;
            drop(w);
            before_commit()?;
            out.commit().map_err(|e| BenchError::Io {
                what: "cannot write",
                path: e.path,
                source: e.source,
            })
        }
        None => {
            let mut w = BufWriter::new(stdout);
            format::write(results, format, &mut w)
                .and_then(|()| w.flush())
                .map_err(write_err(PathBuf::from("-")))
        }
    }
}

/// Runs `memtrail compare`; returns the exit code (0 or 1).
pub fn compare(args: CompareArgs, stdout: &mut dyn Write) -> Result<i32, CompareError> {
    let thresholds = Thresholds::parse_all(&args.thresholds).map_err(CompareError::Usage)?;
    let format = compare_format(args.format, args.output.as_deref());
    let base = Input::load(&args.base)?;
    let new = Input::load(&args.new)?;
    let inputs: Vec<(&str, &Path, crate::sys::FileId)> =
        [("the BASE file", &base), ("the NEW file", &new)]
            .into_iter()
            .filter_map(|(what, i)| Some((what, i.path.as_path(), i.id?)))
            .collect();
    let output = args.output.as_deref().unwrap_or(Path::new("-"));
    crate::output::check_not_input(output, &inputs)?;
    let out_file = Some(output)
        .filter(|p| p.as_os_str() != "-")
        .map(|p| OutputFile::create_with(p, args.force))
        .transpose()?;
    let c = compare::compare(&base, &new, &thresholds, args.sites);
    let render = |w: &mut dyn Write| -> Result<(), CompareError> {
        match format {
            CompareFormat::Text => compare::write_text(&c, w).map_err(CompareError::Stdout),
            CompareFormat::Markdown => compare::write_markdown(&c, w).map_err(CompareError::Stdout),
            CompareFormat::Json => serde_json::to_writer_pretty(&mut *w, &c)
                .map_err(io::Error::from)
                .and_then(|()| writeln!(w))
                .map_err(CompareError::Stdout),
            CompareFormat::Flamegraph => {
                compare::write_flamegraph(&base, &new, args.bench.as_deref(), args.by, w)
            }
        }
    };
    match out_file {
        Some(out) => {
            // A failed write is the file's, not standard output's.
            let file_err = |e| match e {
                CompareError::Stdout(source) => CompareError::Output(crate::output::OutputError {
                    path: out.path().to_owned(),
                    source,
                }),
                e => e,
            };
            let mut w = BufWriter::new(out.file());
            render(&mut w).map_err(file_err)?;
            w.flush().map_err(|e| file_err(CompareError::Stdout(e)))?;
            drop(w);
            out.commit()?;
        }
        None => {
            let mut w = BufWriter::new(stdout);
            render(&mut w)?;
            w.flush().map_err(CompareError::Stdout)?;
        }
    }
    Ok(if c.regressed {
        exit::REGRESSED
    } else {
        exit::OK
    })
}

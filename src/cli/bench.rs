//! `memtrail bench`: benchmarks run under full captures, their memory
//! metrics written as results (and kept as a baseline, or compared with
//! one).

use std::ffi::OsString;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::exit::bench as exit;
use super::flags::{BenchArgs, bench_format};
use crate::bench::format::{self, BenchFormat};
use crate::bench::{BenchError, BenchOptions, suite};
use crate::compare::{self, Input, Thresholds};
use crate::output::OutputFile;

/// The device and inode of the file `path` names, if any.
fn path_id(path: &Path) -> Option<crate::sys::FileId> {
    std::fs::metadata(path)
        .ok()
        .map(|m| crate::sys::FileId::of(&m))
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
        render_from(path, &args, format, stdout)?;
        return Ok(exit::OK);
    }
    let benchmarks = benchmarks(&args)?;
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
    let baseline = read_baseline(args.baseline.as_deref(), &dir, &save_as)?;
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
    let new = Input {
        path: crate::bench::results_path(&dir, &save_as),
        results,
        id: None,
    };
    Ok(verdict(new, baseline, &thresholds, stderr))
}

/// `memtrail bench --from`: renders the results document `path` in
/// `format`, running nothing.
fn render_from(
    path: &Path,
    args: &BenchArgs,
    format: BenchFormat,
    stdout: &mut dyn Write,
) -> Result<(), BenchError> {
    let mut input = crate::report::open_input(path).map_err(|source| BenchError::ResultsRead {
        path: path.to_owned(),
        source,
    })?;
    let results = crate::bench::read_results(&mut input, path)?;
    let out_file = open_output(
        args.output.as_deref(),
        args.force,
        &[("the results", path, input.id())],
    )?;
    write_results_to(&results, format, out_file, stdout, || Ok(()))
}

/// The benchmarks to run: --suite's, else the command line's.
fn benchmarks(args: &BenchArgs) -> Result<Vec<suite::Benchmark>, BenchError> {
    if let Some(path) = &args.suite {
        return suite::load(path, args.runs);
    }
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
    Ok(vec![suite::Benchmark {
        name,
        command: args.command.clone(),
        cwd,
        env: Default::default(),
        runs: args.runs.unwrap_or(1),
    }])
}

/// The saved baseline `name` (--baseline) in `dir`, which this run, saved
/// as `save_as`, may not replace.
fn read_baseline(
    name: Option<&str>,
    dir: &Path,
    save_as: &str,
) -> Result<Option<Input>, BenchError> {
    let Some(name) = name else {
        return Ok(None);
    };
    if name == save_as {
        return Err(BenchError::Usage(format!(
            "--baseline {name} would be replaced by this run's results: save them under \
             another name (--save-baseline)"
        )));
    }
    suite::check_name(name).map_err(|e| BenchError::Usage(format!("--baseline: {e}")))?;
    let path = crate::bench::results_path(dir, name);
    let results = crate::bench::load_results(&path)?;
    let id = path_id(&path);
    Ok(Some(Input { path, results, id }))
}

/// The exit code of a bench that ran: [`exit::REGRESSED`] when a
/// benchmark's command exited nonzero (said on `stderr`) or, compared with
/// `baseline` (the comparison on `stderr`), a metric regressed.
fn verdict(
    new: Input,
    baseline: Option<Input>,
    thresholds: &Thresholds,
    stderr: &mut dyn Write,
) -> i32 {
    let mut code = exit::OK;
    for r in &new.results.benchmarks {
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
        let c = compare::compare(&base, &new, thresholds, compare::DEFAULT_SITES);
        let _ = compare::write_text(&c, stderr);
        if c.regressed {
            code = exit::REGRESSED;
        }
    }
    code
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

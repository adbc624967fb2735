//! `memtrail compare`: two bench results (or two profiles) compared, per
//! metric the change and a verdict, and the sites behind each regression.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use super::exit::bench as exit;
use super::flags::{CompareArgs, CompareFormat, compare_format};
use crate::compare::{self, CompareError, Input, Thresholds};
use crate::output::OutputFile;

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

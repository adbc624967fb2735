//! `memtrail events`: a binary event stream (`--events FILE.mtev`) to the
//! JSON lines `--events FILE.jsonl` would have written.

use std::io::{self, BufWriter, Write};

use super::flags::EventsArgs;
use crate::output::OutputFile;
use crate::report;

/// Runs `memtrail events`: a binary stream to JSON lines.
pub fn events(
    args: EventsArgs,
    stdout: &mut impl Write,
) -> Result<u64, crate::events::EventsError> {
    use crate::events::EventsError;
    // The reader every command shares: a regular file only (issue 28).
    let input = report::open_input(&args.file).map_err(|source| EventsError::Open {
        path: args.file.clone(),
        source,
    })?;
    let output = args.output.as_deref().unwrap_or(std::path::Path::new("-"));
    crate::output::check_not_input(output, &[("the event stream", &args.file, input.id())])?;
    let input = io::BufReader::with_capacity(1 << 20, input.stream());
    match Some(output).filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            let out = OutputFile::create_with(path, args.force)?;
            let mut w = BufWriter::with_capacity(
                1 << 20,
                out.file().try_clone().map_err(EventsError::Write)?,
            );
            let n = crate::events::to_jsonl(input, &mut w)?;
            drop(w);
            out.commit()?;
            Ok(n)
        }
        None => {
            let mut w = BufWriter::with_capacity(1 << 20, stdout);
            crate::events::to_jsonl(input, &mut w)
        }
    }
}

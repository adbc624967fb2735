//! `memtrail report`: a profile (its stacks filtered, symbolized again
//! where debug files appeared since) ranked and written in one format.

use std::io::{BufWriter, Write};

use super::flags::ReportArgs;
use crate::output::OutputFile;
use crate::report::{self, ReportError, ReportOptions};

/// Runs `memtrail report`, writing to `--output` or `stdout`.
pub fn report(args: ReportArgs, stdout: &mut impl Write) -> Result<(), ReportError> {
    // Before the profile: a bad file fails fast.
    let suppressions = report::read_suppressions(&args.suppressions)?;
    let (mut profile, id) = report::load_profile_with_id(&args.profile)?;
    // Never over the profile itself (issue 28), by whatever path.
    let output = args.output.as_deref().unwrap_or(std::path::Path::new("-"));
    crate::output::check_not_input(output, &[("the profile", &args.profile, id)])?;
    let filter = report::StackFilter {
        pids: args.pids,
        exes: args.exes,
    };
    filter.apply(&mut profile, &args.profile)?;
    if let Some(dir) = args.debuginfo_dirs.iter().find(|d| !d.is_dir()) {
        return Err(ReportError::DebuginfoDir { path: dir.clone() });
    }
    let dirs = crate::symbolize::debug_dirs(&args.debuginfo_dirs);
    let found = crate::symbolize::StackSymbolizer::new().resymbolize(&mut profile.stacks, &dirs);
    if found > 0 {
        tracing::info!(frames = found, "symbolized again from debug files");
    }
    let grouping = if args.no_group {
        report::Grouping::none()
    } else {
        report::Grouping::new(args.wrappers)
    };
    let opts = ReportOptions {
        format: args.format,
        by: args.by,
        top: args.top,
        shaping: report::Shaping {
            grouping,
            view: args.view,
            focus: args.focus,
            hide: args.hide,
            suppressions,
        },
    };
    opts.check()?;
    match args.output.filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            let out = OutputFile::create_with(&path, args.force)?;
            report::write_report_file(&profile, &opts, out)?;
        }
        // `-o -` is stdout: a closed pipe is then no failure either.
        None => {
            let mut w = BufWriter::new(stdout);
            report::write_report(&profile, &opts, &mut w)
                .and_then(|()| w.flush())
                .map_err(ReportError::Stdout)?;
        }
    }
    Ok(())
}

//! `memtrail`: parse flags, run, map errors to exit codes.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;
use memtrail::cli::{self, Cli, Command};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() {
                cli::exit::USAGE
            } else {
                0
            };
            let _ = err.print();
            return ExitCode::from(code as u8);
        }
    };
    let filter = EnvFilter::try_from_env("MEMTRAIL_LOG")
        .or_else(|_| EnvFilter::try_new(&cli.log))
        .unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_target(false)
        .init();
    // Not locked for the whole run: the capture's threads log through
    // tracing to stderr too, and would wait on the lock forever.
    let mut stderr = io::stderr();
    let code = match cli.command {
        Command::Run(args) => match cli::run(args, &mut stderr) {
            Ok(code) => code,
            Err(err) => {
                let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
                cli::exit_code(&err)
            }
        },
        Command::Report(args) => match cli::report(args, &mut io::stdout().lock()) {
            Ok(()) => 0,
            // `memtrail report | head`: the reader has all it wanted.
            Err(err) if err.is_broken_pipe() => 0,
            Err(err) => {
                let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
                cli::report_exit_code(&err)
            }
        },
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// `error: cause: cause`, like anyhow's `{:#}`.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    msg
}

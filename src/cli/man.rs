//! `memtrail man [SUBCOMMAND]`: memtrail's man page, or a subcommand's.

use std::io::{self, Write};

use super::flags::command;

/// Writes the man page of memtrail, or of its subcommand `page`.
pub fn man(page: Option<&str>, out: &mut impl Write) -> io::Result<()> {
    let cmd = command();
    let cmd = match page {
        Some(name) => {
            let sub = cmd
                .find_subcommand(name)
                .cloned()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such subcommand"))?;
            // Its page is memtrail-NAME(1), as git's and cargo's are.
            let title = match name {
                "run" => "memtrail-run",
                "bench" => "memtrail-bench",
                "compare" => "memtrail-compare",
                "attach" => "memtrail-attach",
                "events" => "memtrail-events",
                _ => "memtrail-report",
            };
            sub.name(title).version(super::version::SHORT)
        }
        None => cmd,
    };
    clap_mangen::Man::new(cmd).render(out)
}

//! The command line's values for the library's enums (`--unwind`,
//! `--format`, `--by`, ...): names and help text, so clap stays in `cli/`;
//! and the parsers of sizes, durations and patterns.

use clap::ValueEnum;
use clap::builder::PossibleValue;

/// Implements [`ValueEnum`] for a library enum: each variant's name on
/// the command line and its help text.
macro_rules! value_enum {
    ($ty:ty { $($variant:ident => $name:literal: $help:literal,)+ }) => {
        impl ValueEnum for $ty {
            fn value_variants<'a>() -> &'a [Self] {
                &[$(<$ty>::$variant),+]
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(match self {
                    $(<$ty>::$variant => PossibleValue::new($name).help($help),)+
                })
            }
        }
    };
}

value_enum!(crate::profile::unwind::Mode {
    Auto => "auto":
        "Unwind tables where an image has them, frame pointers elsewhere",
    Fp => "fp":
        "Frame pointers only",
    Dwarf => "dwarf":
        "Unwind tables only: a frame without one ends the stack",
});

value_enum!(crate::report::Format {
    Text => "text":
        "The top sites with their metrics and symbolized stacks, for a terminal",
    Json => "json":
        "The sites ranked by the metric, as a JSON document",
    Flamegraph => "flamegraph":
        "An SVG flame graph of the metric, outermost caller at the bottom",
    Pprof => "pprof":
        "A gzipped pprof profile.proto with every metric as a sample type",
    Folded => "folded":
        "Collapsed stacks, `outer;...;inner VALUE` a line, for any flame graph tool",
    Timeline => "timeline":
        "An SVG chart of the heap over time (the profile's timeline), stacked by its top allocation sites, with the peak instant and the sites at the peak; `--by` and `--top` do not apply",
    Profile => "profile":
        "The profile in this memtrail's version (compact; zstd to a .zst name): converts an older one, keeps --pid/--exe's stacks; `--by` and `--top` do not apply",
});

value_enum!(crate::report::View {
    Sites => "sites":
        "Allocation sites, grouped by the first caller outside allocator wrappers (--no-group: whole stacks)",
    Functions => "functions":
        "Functions with their self and inclusive values (text and json)",
    Calls => "calls":
        "The callers and callees of the functions --focus matches (text and json)",
});

value_enum!(crate::report::Metric {
    Bytes => "bytes":
        "Bytes allocated (the sum of the sizes asked for)",
    Count => "count":
        "Allocating calls",
    Peak => "peak":
        "Bytes live when the tree's live heap peaked",
    Leaked => "leaked":
        "Bytes still live when their process exited (in an attach window: live at detach)",
    Temporary => "temporary":
        "Temporary allocations: blocks freed by their thread before it allocated or freed anything else (heaptrack's definition)",
    Mapped => "mapped":
        "Bytes of anonymous memory mapped outside allocator calls (mmap and mremap's new lengths, whole pages)",
    MappedPeak => "mapped-peak":
        "Of them, bytes mapped when the tree's anonymous mappings peaked",
    MappedExit => "mapped-exit":
        "Of them, bytes still mapped when their process exited",
    Brk => "brk":
        "Program break growth made through sbrk outside allocator calls",
});

value_enum!(crate::ring::merge::EventRings {
    Auto => "auto":
        "Per CPU on machines with at least 4 CPUs online, else one",
    Shared => "shared":
        "One ring every CPU reserves from",
    PerCpu => "per-cpu":
        "One ring per CPU, merged by time (`--ring-size` is split between them)",
});

value_enum!(crate::events::writer::EventsFormat {
    Jsonl => "jsonl":
        "One JSON object a line (~107 bytes an event)",
    Binary => "binary":
        "zstd-compressed length-prefixed binary records (docs/events.md); `memtrail events FILE` turns it into JSON lines",
});

value_enum!(crate::compare::FlameMetric {
    Bytes => "bytes":
        "Bytes allocated",
    Allocations => "allocations":
        "Allocating calls",
});

value_enum!(crate::attach::per_process::Probes {
    Auto => "auto":
        "Per process for a running process (`memtrail attach`, a session on a pid or on its own process) where the kernel can hold a new process at fork (`bpf_send_signal_task`, Linux 6.13); system-wide for a command memtrail starts",
    PerProcess => "per-process":
        "Only in the tracked processes; fails on a kernel without it",
    SystemWide => "system-wide":
        "In every process that maps a probed file (each pays a trap per allocator call while memtrail runs); no stop at fork",
});

value_enum!(crate::bench::format::BenchFormat {
    Text => "text":
        "A table for a terminal",
    Json => "json":
        "The results document (docs/bench.md)",
    Markdown => "markdown":
        "A Markdown table, for a pull-request comment",
    Bmf => "bmf":
        "Bencher Metric Format JSON (`bencher run --adapter json`)",
    Gab => "gab":
        "github-action-benchmark's `customSmallerIsBetter` JSON",
});

/// Parses `--duration`: a number with a unit, as `--pressure-timeout`'s
/// durations are written, from 1 ms to a day. Every message names the
/// flag: the words are `--duration`'s, not the pressure timeout's.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    use crate::pressure::{ParseTimeoutError, PressureTimeout};
    const TAKES: &str =
        "--duration takes a number with a unit, ns, us, ms, s or m (30s, 500ms, 2m)";
    const UNTIL: &str = "without it, memtrail stays attached until Ctrl-C";
    match s.parse::<PressureTimeout>() {
        Ok(PressureTimeout::After(d)) => Ok(d),
        Ok(PressureTimeout::Off) => Err(format!("`{s}` is no time: {TAKES}; {UNTIL}")),
        Err(ParseTimeoutError::NoUnit(_)) => {
            Err(format!("`{s}` has no unit: {TAKES}; `{s}s` is {s} seconds"))
        }
        Ok(PressureTimeout::Infinite) | Err(ParseTimeoutError::Invalid(_)) => {
            Err(format!("`{s}` is not a duration: {TAKES}; {UNTIL}"))
        }
        Err(ParseTimeoutError::TooShort(_)) => Err(format!(
            "`{s}` is shorter than 1ms, the shortest --duration memtrail keeps"
        )),
        Err(ParseTimeoutError::TooLong(_)) => Err(format!(
            "`{s}` is longer than a day, the longest --duration; {UNTIL}"
        )),
    }
}

/// Parses a ring size: bytes (`4096`, `4096B`), or a number of KiB, MiB or
/// GiB (`64K`, `64KiB`, `64KB`, `64M`, `64MiB`, `1G`, ...; any case, a
/// space allowed before the unit). Every unit is binary: a ring is a power
/// of two, so `64MB` can only mean 64 MiB.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let invalid = || {
        format!("`{s}` is not a size: use bytes or a whole number of K, M or G (e.g. 256K, 64MiB)")
    };
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let unit = unit.trim_start().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(invalid()),
    };
    let n: usize = digits.parse().map_err(|_| invalid())?;
    let bytes = n
        .checked_mul(1 << shift)
        .filter(|b| *b <= u32::MAX as usize)
        .ok_or_else(|| format!("`{s}` is too large: a ring holds at most 2G"))?;
    if !bytes.is_power_of_two() || bytes < rustix::param::page_size() {
        return Err(format!(
            "`{s}` must be a power of two of at least the page size ({} bytes)",
            rustix::param::page_size()
        ));
    }
    Ok(bytes)
}

/// A `--wrapper`, `--focus` or `--hide` pattern.
pub fn parse_regex(s: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(s).map_err(|e| e.to_string())
}

/// `memtrail bench --pressure-timeout`: checked as `memtrail run` would,
/// passed on as written.
pub fn check_timeout(s: &str) -> Result<String, String> {
    s.parse::<crate::pressure::PressureTimeout>()
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

/// `memtrail bench --ring-size` and `--stack-ring-size`: checked as
/// `memtrail run` would, passed on as written.
pub fn check_size(s: &str) -> Result<String, String> {
    parse_size(s).map(|_| s.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::parse_size;
    use crate::ring::merge::{AUTO_PER_CPU, EventRings};

    #[test]
    fn event_rings_help_says_the_number() {
        // `--help` says the number (issue 26: it said `[`AUTO_PER_CPU`]`).
        let help = EventRings::Auto
            .to_possible_value()
            .and_then(|v| v.get_help().map(ToString::to_string))
            .unwrap_or_default();
        assert!(
            help.contains(&format!("at least {AUTO_PER_CPU} CPUs")),
            "{help}"
        );
    }

    #[test]
    fn sizes_as_people_write_them() {
        for (s, bytes) in [
            ("4096", 4096),
            ("4096B", 4096),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("64KiB", 64 << 10),
            ("64KB", 64 << 10),
            ("64M", 64 << 20),
            ("64MiB", 64 << 20),
            ("64mib", 64 << 20),
            ("64 MiB", 64 << 20),
            ("64MB", 64 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
        ] {
            assert_eq!(parse_size(s), Ok(bytes), "{s}");
        }
        for s in [
            "", "M", "1.5M", "64Mi", "64MBs", "-64M", "64 M B", "48M", "8G", "1K",
        ] {
            assert!(parse_size(s).is_err(), "{s} was accepted");
        }
    }
}

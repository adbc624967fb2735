//! Blocks live at exit that are not leaks: the language runtimes' and
//! glibc's one-time allocations ("still reachable at exit: runtime"), and
//! those a suppression file names.
//!
//! A stack's live-at-exit blocks are one of: a leak; a runtime pool's,
//! when a frame of the stack matches one of [`RUNTIME_POOLS`] (e.g.
//! libstdc++'s emergency exception pool, 71 KiB allocated when
//! libstdc++ is loaded and never freed); suppressed, when a frame matches
//! a `leak:PATTERN` line of `--suppressions` (LSan's and heaptrack's
//! format). Runtime pools are tried first. Reports rank leaks without
//! them and show them apart, with their bytes and blocks: nothing is
//! dropped silently.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use regex::Regex;

use crate::profile::{Frame, Profile, StackMetrics};

/// A known runtime allocation made once and kept until exit.
pub struct RuntimePool {
    pub name: &'static str,
    /// Matched against each frame's function name.
    function: &'static str,
    /// The file name of the module the matching frame must be in (a
    /// prefix: `libc.so` takes `libc.so.6`); any module when empty. A
    /// frame without a name matches when it is in such a module and the
    /// stack went through `also` (a library constructor run at load).
    module: &'static str,
    /// With `module`: a frame of the stack matching this (or, when the
    /// loader's frames have no name, a stack whose other frames are all
    /// the loader's or outside any file) marks a first frame without a
    /// name in `module` as the pool's.
    also: &'static str,
}

/// The built-in runtime pools.
pub const RUNTIME_POOLS: &[RuntimePool] = &[
    RuntimePool {
        name: "libstdc++ emergency exception pool",
        function: r"^(\(anonymous namespace\)::pool::pool|__gnu_cxx::__freeres|_GLOBAL__sub_I_eh_alloc\.cc)\b",
        module: "",
        also: "",
    },
    RuntimePool {
        name: "libstdc++ emergency exception pool",
        function: "",
        module: "libstdc++.so",
        also: r"^(_dl_init|call_init)$",
    },
    RuntimePool {
        name: "CPython obmalloc arena map",
        function: r"^arena_map_(get|mark_used)$",
        module: "",
        also: "",
    },
    RuntimePool {
        name: "glibc locale data",
        function: r"^(__GI_)?(setlocale|newlocale|_nl_\w+|new_composite_name|read_alias_file|extend_alias_table)$",
        module: "libc.so",
        also: "",
    },
    RuntimePool {
        name: "glibc message catalogs",
        function: r"^(__dcigettext|__textdomain|textdomain|set_binding_values|__bindtextdomain)$",
        module: "libc.so",
        also: "",
    },
    RuntimePool {
        name: "glibc stdio buffer",
        function: r"^(_IO_file_doallocate|__GI__IO_file_doallocate)$",
        module: "libc.so",
        also: "",
    },
    RuntimePool {
        name: "glibc environment strings",
        function: r"^(__add_to_environ|__setenv|setenv|putenv)$",
        module: "libc.so",
        also: "",
    },
    RuntimePool {
        name: "glibc time zone data",
        function: r"^(__tzfile_read|tzset_internal|__tzstring\w*|__tzset)$",
        module: "libc.so",
        also: "",
    },
    RuntimePool {
        name: "glibc NSS and iconv modules",
        function: r"^(_?_?nss_\w+|__gconv_\w+|gconv_\w+)$",
        module: "libc.so",
        also: "",
    },
    RuntimePool {
        name: "dynamic loader (loaded objects, TLS)",
        function: r"^(_dl_\w+|dl_open_worker\w*|_dlerror_run|allocate_dtv)$",
        module: "ld-linux",
        also: "",
    },
];

/// The regexes of [`RUNTIME_POOLS`], compiled once per report.
struct Pools(Vec<(Option<Regex>, Option<Regex>)>);

impl Pools {
    fn new() -> Self {
        let compile = |p: &str| {
            // `\w` as ASCII: Unicode's word class is costly to compile.
            let p = p.replace("\\w", "[0-9A-Za-z_]");
            (!p.is_empty()).then(|| Regex::new(&p).expect("built-in runtime patterns compile"))
        };
        Self(
            RUNTIME_POOLS
                .iter()
                .map(|p| (compile(p.function), compile(p.also)))
                .collect(),
        )
    }

    /// The index in [`RUNTIME_POOLS`] of the pool `frames` allocated.
    fn of(&self, frames: &[Arc<Frame>]) -> Option<usize> {
        let in_module = |f: &Frame, module: &str| {
            module.is_empty()
                || f.module
                    .as_deref()
                    .is_some_and(|m| super::names::module_base(m).starts_with(module))
        };
        RUNTIME_POOLS
            .iter()
            .zip(&self.0)
            .position(|(pool, (function, also))| match (function, also) {
                (Some(function), _) => frames.iter().any(|f| {
                    in_module(f, pool.module)
                        && f.function.as_deref().is_some_and(|n| function.is_match(n))
                }),
                (None, Some(also)) => {
                    let loader = |f: &Frame| {
                        f.module.as_deref().is_none_or(|m| {
                            let base = super::names::module_base(m);
                            base.starts_with("ld-linux") || base.starts_with("ld.so")
                        })
                    };
                    frames
                        .first()
                        .is_some_and(|f| f.function.is_none() && in_module(f, pool.module))
                        && (frames
                            .iter()
                            .any(|f| f.function.as_deref().is_some_and(|n| also.is_match(n)))
                            // The loader's frames, when they could not be
                            // named (code outside any known file).
                            || (frames.len() > 1 && frames[1..].iter().all(|f| loader(f))))
                }
                (None, None) => false,
            })
    }
}

/// The largest suppression file memtrail reads: 1 MiB (LSan's
/// suppression files in large projects are a few hundred lines).
pub const MAX_SUPPRESSION_FILE_BYTES: u64 = 1 << 20;

/// The most `leak:` patterns read, from every `--suppressions` file
/// together: 10,000.
pub const MAX_SUPPRESSIONS: usize = 10_000;

/// The longest pattern: 1,024 bytes.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// One `leak:PATTERN` line of a suppression file.
///
/// Matched without a regex or backtracking (issue 40: 8 MB of
/// `leak:*a*b*…` took over 2 GB as regexes): the pattern is its literal
/// pieces between `*`s, each found after the previous one (the leftmost
/// match of each piece is the one that leaves the most room for the rest),
/// so a match costs one substring search per piece.
#[derive(Clone, Debug)]
pub struct Suppression {
    /// The line as written after `leak:`.
    pub pattern: String,
    /// `^`: the first piece starts the string.
    start: bool,
    /// `$`: the last piece ends it.
    end: bool,
    /// The literal pieces between `*`s (empty ones dropped, except that
    /// a pattern of only `*`s keeps none and matches anything).
    pieces: Vec<String>,
}

impl Suppression {
    /// A pattern as LSan reads it: a substring of a frame's function,
    /// module path or source file, `*` for any characters, `^` and `$`
    /// anchoring it at the start or end.
    pub fn new(pattern: &str) -> Result<Self, String> {
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(format!(
                "a pattern of {} bytes: at most {MAX_PATTERN_BYTES} are read",
                pattern.len()
            ));
        }
        let (start, rest) = match pattern.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, pattern),
        };
        let (rest, end) = match rest.strip_suffix('$') {
            Some(rest) => (rest, true),
            None => (rest, false),
        };
        let parts: Vec<&str> = rest.split('*').collect();
        // An anchor binds to the piece next to it: `^*x` anchors nothing.
        let start = start && parts.first().is_some_and(|p| !p.is_empty());
        let end = end && parts.last().is_some_and(|p| !p.is_empty());
        Ok(Self {
            pattern: pattern.to_owned(),
            start,
            end,
            pieces: parts
                .into_iter()
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }

    /// Whether `s` matches: in time linear in `s` per piece.
    fn is_match(&self, s: &str) -> bool {
        let n = self.pieces.len();
        let mut rest = s;
        for (i, piece) in self.pieces.iter().enumerate() {
            let last = i + 1 == n;
            if i == 0 && self.start {
                let Some(after) = rest.strip_prefix(piece.as_str()) else {
                    return false;
                };
                if last && self.end {
                    return after.is_empty();
                }
                rest = after;
            } else if last && self.end {
                return rest.ends_with(piece.as_str());
            } else {
                let Some(at) = rest.find(piece.as_str()) else {
                    return false;
                };
                rest = &rest[at + piece.len()..];
            }
        }
        // No pieces: `^$` matches only the empty string; `*`, `^*$`
        // anything.
        n > 0 || self.pattern != "^$" || s.is_empty()
    }

    fn matches(&self, frames: &[Arc<Frame>]) -> bool {
        frames.iter().any(|f| {
            [&f.function, &f.module, &f.file]
                .into_iter()
                .flatten()
                .any(|s| self.is_match(s))
        })
    }
}

/// Why a suppression file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SuppressionError {
    #[error("cannot read the suppression file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {reason}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// Reads suppression files: a `leak:PATTERN` a line; empty lines and
/// lines starting with `#` are skipped, surrounding blanks ignored. Each
/// must be a regular file of at most [`MAX_SUPPRESSION_FILE_BYTES`] (a
/// FIFO or a device is refused before any read), with at most
/// [`MAX_SUPPRESSIONS`] patterns in all, each of at most
/// [`MAX_PATTERN_BYTES`].
pub fn read_suppressions<P: AsRef<Path>>(
    paths: &[P],
) -> Result<Vec<Suppression>, SuppressionError> {
    let mut out = Vec::new();
    for path in paths {
        read_suppression_file(path.as_ref(), &mut out)?;
    }
    Ok(out)
}

/// Appends the patterns of the file at `path` to `out`.
fn read_suppression_file(path: &Path, out: &mut Vec<Suppression>) -> Result<(), SuppressionError> {
    let text = super::load::read_text(path, MAX_SUPPRESSION_FILE_BYTES, "a suppression file")
        .map_err(|source| SuppressionError::Read {
            path: path.to_owned(),
            source,
        })?;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |reason: String| SuppressionError::Line {
            path: path.to_owned(),
            line: n + 1,
            reason,
        };
        let Some(pattern) = line.strip_prefix("leak:") else {
            return Err(err(format!(
                "expected `leak:PATTERN`, not {:?} (memtrail reads only leak suppressions)",
                shortened(line)
            )));
        };
        let pattern = pattern.trim();
        if pattern.is_empty() {
            return Err(err("`leak:` without a pattern".to_owned()));
        }
        if out.len() == MAX_SUPPRESSIONS {
            return Err(err(format!(
                "more than {MAX_SUPPRESSIONS} patterns (in all --suppressions files)"
            )));
        }
        out.push(Suppression::new(pattern).map_err(err)?);
    }
    Ok(())
}

/// `line`, cut to its first 80 characters for a message.
fn shortened(line: &str) -> String {
    match line.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}

/// What a stack's blocks live at exit are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Reach {
    #[default]
    Leak,
    /// Index in [`RUNTIME_POOLS`].
    Runtime(usize),
    /// Index in the suppressions.
    Suppressed(usize),
}

/// Blocks live at exit of one kind (a runtime pool, a suppression).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Held {
    /// The pool's name or the suppression's pattern.
    pub name: String,
    pub bytes: u64,
    pub blocks: u64,
    /// The stacks, in profile order.
    pub stacks: Vec<u64>,
}

/// The profile's live-at-exit blocks that are not leaks.
#[derive(Clone, Debug, Default)]
pub(super) struct Reachable {
    /// Per stack of the profile.
    pub reach: Vec<Reach>,
    /// By runtime pool name, in [`RUNTIME_POOLS`] order.
    pub runtime: Vec<Held>,
    /// By suppression, in the file's order; those that matched.
    pub suppressed: Vec<Held>,
}

fn total(held: &[Held]) -> (u64, u64) {
    held.iter()
        .fold((0, 0), |(b, n), h| (b + h.bytes, n + h.blocks))
}

impl Reachable {
    /// Classifies the stacks of `profile` that hold blocks at exit;
    /// `frames(i)` are stack `i`'s frames as the report shows them.
    pub fn classify<'a>(
        profile: &'a Profile,
        frames: impl Fn(usize) -> &'a [Arc<Frame>],
        suppressions: &[Suppression],
    ) -> Self {
        let pools = Pools::new();
        let mut out = Self {
            reach: vec![Reach::Leak; profile.stacks.len()],
            ..Self::default()
        };
        let mut runtime: Vec<Held> = Vec::new();
        let mut suppressed: Vec<Option<Held>> = vec![None; suppressions.len()];
        for (i, stack) in profile.stacks.iter().enumerate() {
            let m = &stack.metrics;
            if m.live_bytes_at_exit == 0 && m.live_allocations_at_exit == 0 {
                continue;
            }
            let frames = frames(i);
            let held = if let Some(p) = pools.of(frames) {
                let name = RUNTIME_POOLS[p].name;
                out.reach[i] = Reach::Runtime(p);
                let at = match runtime.iter().position(|h| h.name == name) {
                    Some(at) => at,
                    None => {
                        runtime.push(Held {
                            name: name.to_owned(),
                            ..Held::default()
                        });
                        runtime.len() - 1
                    }
                };
                &mut runtime[at]
            } else if let Some(s) = suppressions.iter().position(|s| s.matches(frames)) {
                out.reach[i] = Reach::Suppressed(s);
                suppressed[s].get_or_insert_with(|| Held {
                    name: format!("leak:{}", suppressions[s].pattern),
                    ..Held::default()
                })
            } else {
                continue;
            };
            held.bytes += m.live_bytes_at_exit;
            held.blocks += m.live_allocations_at_exit;
            held.stacks.push(stack.id);
        }
        out.runtime = runtime;
        out.suppressed = suppressed.into_iter().flatten().collect();
        out
    }

    /// Bytes and blocks of the runtime pools.
    pub fn runtime_total(&self) -> (u64, u64) {
        total(&self.runtime)
    }

    /// Bytes and blocks suppressed.
    pub fn suppressed_total(&self) -> (u64, u64) {
        total(&self.suppressed)
    }

    /// The profile's leaked bytes and blocks: live at exit, less the
    /// runtime pools and the suppressed.
    pub fn leaked(&self, profile: &Profile) -> (u64, u64) {
        let (rb, rn) = self.runtime_total();
        let (sb, sn) = self.suppressed_total();
        let t = &profile.totals;
        (
            t.live_bytes_at_exit.saturating_sub(rb + sb),
            t.live_allocations_at_exit.saturating_sub(rn + sn),
        )
    }

    /// `m` of stack `i` as a leak report counts it: without its blocks
    /// live at exit when they are not a leak.
    pub fn as_leak(&self, i: usize, m: &StackMetrics) -> StackMetrics {
        match self.reach.get(i) {
            Some(Reach::Leak) | None => *m,
            Some(_) => StackMetrics {
                live_bytes_at_exit: 0,
                live_allocations_at_exit: 0,
                ..*m
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, s: &str) -> bool {
        Suppression::new(pattern).expect("pattern").is_match(s)
    }

    /// Patterns match as LSan's do (substring, `*`, `^`, `$`), and a
    /// pattern of many `*`s against a long string that almost matches
    /// costs one search per piece (issue 40: as a regex, a backtracking
    /// matcher's worst case).
    #[test]
    fn suppression_patterns_match() {
        for (p, s, want) in [
            ("keep_", "my_keep_forever", true),
            ("keep_*ever", "my_keep_forever", true),
            ("^keep_", "my_keep_forever", false),
            ("^my_", "my_keep_forever", true),
            ("ever$", "my_keep_forever", true),
            ("keep$", "my_keep_forever", false),
            ("^my_keep_forever$", "my_keep_forever", true),
            ("^my*ever$", "my_keep_forever", true),
            ("^my*keep$", "my_keep_forever", false),
            ("^ab*ba$", "aba", false),
            ("^ab*ba$", "abba", true),
            ("a*b*c", "xaxbxc", true),
            ("a*b*c", "xcxbxa", false),
            ("*", "", true),
            ("^*$", "anything", true),
            ("^$", "", true),
            ("^$", "x", false),
            ("^*x", "ax", true),
            ("x.y", "x.y", true),
            ("x.y", "xzy", false),
            ("(", "f(int)", true),
        ] {
            assert_eq!(m(p, s), want, "{p:?} on {s:?}");
        }
        let many = format!("*{}", "a*".repeat(500));
        let s = format!("{}b", "a".repeat(499));
        assert!(!m(&many, &s));
        assert!(m(&many, &"a".repeat(500)));
        assert!(Suppression::new(&"a".repeat(MAX_PATTERN_BYTES + 1)).is_err());
    }
}

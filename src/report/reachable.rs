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
            (!p.is_empty()).then(|| Regex::new(p).expect("built-in runtime patterns compile"))
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
                    .is_some_and(|m| super::sites::module_base(m).starts_with(module))
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
                            let base = super::sites::module_base(m);
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

/// One `leak:PATTERN` line of a suppression file.
#[derive(Clone, Debug)]
pub struct Suppression {
    /// The line as written after `leak:`.
    pub pattern: String,
    regex: Regex,
}

impl Suppression {
    /// A pattern as LSan reads it: a substring of a frame's function,
    /// module path or source file, `*` for any characters, `^` and `$`
    /// anchoring it at the start or end.
    pub fn new(pattern: &str) -> Result<Self, regex::Error> {
        let (start, rest) = match pattern.strip_prefix('^') {
            Some(rest) => ("^", rest),
            None => ("", pattern),
        };
        let (rest, end) = match rest.strip_suffix('$') {
            Some(rest) => (rest, "$"),
            None => (rest, ""),
        };
        let body: Vec<String> = rest.split('*').map(regex::escape).collect();
        Ok(Self {
            pattern: pattern.to_owned(),
            regex: Regex::new(&format!("{start}{}{end}", body.join(".*")))?,
        })
    }

    fn matches(&self, frames: &[Arc<Frame>]) -> bool {
        frames.iter().any(|f| {
            [&f.function, &f.module, &f.file]
                .into_iter()
                .flatten()
                .any(|s| self.regex.is_match(s))
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

/// Reads a suppression file: a `leak:PATTERN` a line; empty lines and
/// lines starting with `#` are skipped, surrounding blanks ignored.
pub fn read_suppressions(path: &Path) -> Result<Vec<Suppression>, SuppressionError> {
    let text = std::fs::read_to_string(path).map_err(|source| SuppressionError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut out = Vec::new();
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
                "expected `leak:PATTERN`, not {line:?} (memtrail reads only leak suppressions)"
            )));
        };
        let pattern = pattern.trim();
        if pattern.is_empty() {
            return Err(err("`leak:` without a pattern".to_owned()));
        }
        out.push(Suppression::new(pattern).map_err(|e| err(e.to_string()))?);
    }
    Ok(out)
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

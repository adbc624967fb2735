//! Sites grouped by their caller: a stack's site is named by its first
//! frame outside allocator wrappers (`xmalloc`, `g_malloc`,
//! `sqlite3Malloc`, `PyMem_Malloc`, `operator new`, `std::allocator`…),
//! so the thousands of stacks through `xmalloc` in cc1 become one site per
//! function that called it, with all of that function's bytes.
//!
//! The wrappers are [`BUILTIN_WRAPPERS`] and the `--wrapper` patterns; a
//! frame is one when its function (or, unnamed, its `module+0xOFFSET`)
//! matches. A stack made only of wrapper frames (or none) stays a site of
//! its own frames. `--no-group` ([`Grouping::none`]) keeps whole stacks:
//! stacks merge only when they show the same frames.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use regex::Regex;

use super::Metric;
use super::names::{module_base, short};
use super::sites::{Site, add, folded_name};
use crate::profile::unwind::StackEnd;
use crate::profile::{Frame, PYTHON_MODULE};

/// The built-in allocator wrappers, each matched against a whole function
/// name (demangled; a C++ name's parameter list after it is allowed, as
/// are compiler suffixes such as `.isra.0` or `.cold`, and a C++ name's
/// ` [clone .cold]`).
pub const BUILTIN_WRAPPERS: &[&str] = &[
    // The allocator entry points themselves (frames[0] is usually past
    // them, but a C++ `operator new` calls malloc, strdup calls malloc).
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "__libc_(malloc|calloc|realloc|memalign)",
    "__(GI_)?__?strn?dup",
    "strn?dup",
    // libiberty (gcc, binutils), bash, git and many GNU tools.
    "x(malloc|calloc|realloc|strdup|strndup|memdup|zalloc|mallocz|mallocz_gently|reallocarray)",
    // GLib.
    "g_(try_)?(malloc|malloc0|realloc)(_n)?",
    "g_new0?",
    "g_(strdup|strndup|memdup2?|slice_alloc0?)",
    // SQLite.
    "sqlite3_(malloc|realloc)(64)?",
    "sqlite3(Malloc|Realloc|DbMalloc|DbRealloc|MemMalloc|MemRealloc)\\w*",
    "mallocWithAlarm|dbMallocRawFinish|dbReallocFinish",
    // CPython.
    "_?PyMem_\\w+",
    "_?PyObject_(Malloc|Calloc|Realloc)\\w*",
    "pymalloc_\\w+|allocate_from_new_pool|new_arena|arena_map_\\w+",
    // C++.
    "operator new(\\[\\])?",
    "std::allocator<.*>::allocate",
    "std::(__new_allocator|allocator_traits)<.*>::allocate",
    "__gnu_cxx::new_allocator<.*>::allocate",
    // The standard containers' allocation primitives (inlined under
    // them): the site is then the container operation that allocated
    // (`std::vector<…>::_M_realloc_insert`), its caller in the stack.
    "std::_Vector_base<.*>::_M_allocate",
    "std::_Rb_tree<.*>::_M_get_node",
    "std::__detail::_Hashtable_alloc<.*>::_M_allocate_(node|buckets)",
    "std::_Deque_base<.*>::_M_allocate_(node|map)",
    "std::(__cxx11::)?basic_string<.*>::_M_create",
    // obstacks (glibc, libiberty): the chunk's user called them.
    "_obstack_(newchunk|begin|begin_1)",
    // Rust.
    "__rust_(alloc|alloc_zeroed|realloc)|__rdl_\\w+",
    "alloc::alloc::(alloc|alloc_zeroed|realloc|exchange_malloc|Global::\\w+)",
];

/// How sites are grouped (`--wrapper`, `--no-group`).
#[derive(Clone, Debug)]
pub struct Grouping {
    /// None: `--no-group`.
    builtin: Option<Regex>,
    extra: Vec<Regex>,
}

impl Default for Grouping {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Grouping {
    /// Grouping by the first frame outside the built-in wrappers and
    /// `extra` (which match anywhere in a name, as pprof's patterns do).
    pub fn new(extra: Vec<Regex>) -> Self {
        let alternatives = BUILTIN_WRAPPERS.join("|");
        let pattern = format!(
            "^(?:{alternatives})(?:\\.[\\w.]+)?(?:\\(.*\\))?( const)?(?: \\[clone \\.[\\w.]+\\])*$"
        );
        // `\w` as ASCII (the names it matches are): Unicode's word class
        // took ~25,000 allocations to compile, a cost in every report.
        let pattern = pattern.replace("\\w", "[0-9A-Za-z_]");
        let builtin = Regex::new(&pattern).expect("the built-in wrapper patterns compile");
        Self {
            builtin: Some(builtin),
            extra,
        }
    }

    /// Whole stacks (`--no-group`).
    pub fn none() -> Self {
        Self {
            builtin: None,
            extra: Vec::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.builtin.is_some()
    }

    /// Whether `f` is an allocator wrapper's frame.
    pub fn is_wrapper(&self, f: &Frame) -> bool {
        let Some(builtin) = &self.builtin else {
            return false;
        };
        // An unnamed frame's `module+0xOFFSET` matches no built-in
        // pattern: named only for `--wrapper`'s.
        if self.extra.is_empty()
            && f.function
                .as_deref()
                .map(str::trim)
                .is_none_or(str::is_empty)
        {
            return false;
        }
        let name = folded_name(f);
        builtin.is_match(&name) || self.extra.iter().any(|r| r.is_match(&name))
    }

    /// The index of the frame that names a stack's group: its first frame
    /// outside wrappers, past frames without a name that lie between
    /// wrappers (a wrapper's static helper, e.g. SQLite's
    /// `sqlite3MemMalloc` without symbols under `sqlite3Malloc`); None
    /// without grouping or when every frame is a wrapper's.
    /// A stack with Python frames is named by its innermost Python
    /// function: the interpreter's C code under it is the Python program's
    /// allocator, as a wrapper is a C program's.
    pub fn caller(&self, frames: &[Arc<Frame>]) -> Option<usize> {
        if !self.enabled() {
            return None;
        }
        let python = frames
            .iter()
            .position(|f| f.module.as_deref() == Some(PYTHON_MODULE));
        if python.is_some() {
            return python;
        }
        let mut last_wrapper = None;
        for (i, f) in frames.iter().enumerate() {
            if self.is_wrapper(f) {
                last_wrapper = Some(i);
            } else if f.function.is_some() {
                break;
            }
        }
        let caller = last_wrapper.map_or(0, |j| j + 1);
        (caller < frames.len()).then_some(caller)
    }
}

/// What identifies a frame in a group key: its function (or unnamed
/// module and offset) and where it is: its module's file name, or for a
/// Python frame (every one is in the module `[python]`) its source file
/// as the interpreter names it, `[python]` without one. A Python
/// function is its name and its file (issue 41: the `<module>` code of
/// every imported file was one site).
pub(super) fn frame_key(f: &Frame) -> (Cow<'_, str>, &str) {
    (folded_name(f), place(f))
}

/// Where a frame's function is, as [`frame_key`] has it.
pub(super) fn place(f: &Frame) -> &str {
    match (f.module.as_deref(), python_file(f)) {
        (_, Some(file)) => file,
        (module, None) => module.map_or("", module_base),
    }
}

/// A Python frame's source file; None for native frames and Python
/// frames without one.
pub(super) fn python_file(f: &Frame) -> Option<&str> {
    (f.module.as_deref() == Some(PYTHON_MODULE))
        .then_some(f.file.as_deref())
        .flatten()
}

/// The function that names a group in text: shortened, and for a Python
/// function with its file (`<module> in /src/a.py`).
pub(super) fn caller_name(f: &Frame) -> String {
    let name = short(&folded_name(f)).into_owned();
    match python_file(f) {
        Some(file) => format!("{name} in {file}"),
        None => name,
    }
}

/// One group of sites: its summed metrics on the largest member (ranked
/// first), the frame that names it and its members.
#[derive(Clone, Debug)]
pub(super) struct Group<'a> {
    /// The largest member, with the group's summed metrics.
    pub site: Site<'a>,
    /// Index in `site.frames` of the caller that names the group; None for
    /// a group of whole stacks.
    pub caller: Option<usize>,
    /// The members' stack ids, largest first.
    pub stacks: Vec<u64>,
    /// Whether every member shows the same frames as `site`.
    pub same_frames: bool,
}

/// What a frame shows once symbolized (its address only when it has no
/// function), for merging stacks that show the same frames.
type ShownFrame<'a> = (
    Option<&'a str>,
    Option<&'a str>,
    Option<u32>,
    Option<&'a str>,
    bool,
    Option<u64>,
);

fn shown(frames: &[Arc<Frame>]) -> Vec<ShownFrame<'_>> {
    frames
        .iter()
        .map(|f| {
            let addr = f.function.is_none().then_some(f.addr);
            (
                f.function.as_deref(),
                f.file.as_deref(),
                f.line,
                f.module.as_deref(),
                f.inlined,
                addr,
            )
        })
        .collect()
}

#[derive(PartialEq, Eq, Hash)]
enum Key<'a> {
    Caller(Cow<'a, str>, &'a str),
    Frames(Vec<ShownFrame<'a>>, StackEnd),
}

/// Groups ranked `sites` (highest first): by caller with grouping, else
/// the stacks that show the same frames (function, file, line, module,
/// inlined; the address only for frames without a function) and end the
/// same way, e.g. the calls of an unrolled loop. Metrics are summed; the
/// result is ranked by `by` again (stable: ties keep the input's order).
pub(super) fn group<'a>(sites: Vec<Site<'a>>, grouping: &Grouping, by: Metric) -> Vec<Group<'a>> {
    let mut groups: Vec<Group<'a>> = Vec::with_capacity(sites.len());
    let mut frames_of: Vec<Vec<ShownFrame<'a>>> = Vec::new();
    let mut index: HashMap<Key<'a>, usize> = HashMap::new();
    for site in sites {
        let caller = grouping.caller(site.frames);
        let key = match caller {
            Some(i) => {
                let (name, module) = frame_key(&site.frames[i]);
                Key::Caller(name, module)
            }
            None => Key::Frames(shown(site.frames), site.end),
        };
        match index.get(&key) {
            Some(&i) => {
                let g = &mut groups[i];
                add(&mut g.site.metrics, &site.metrics);
                g.stacks.push(site.id);
                if g.same_frames && (g.site.end != site.end || frames_of[i] != shown(site.frames)) {
                    g.same_frames = false;
                }
            }
            None => {
                index.insert(key, groups.len());
                frames_of.push(shown(site.frames));
                groups.push(Group {
                    stacks: vec![site.id],
                    site,
                    caller,
                    same_frames: true,
                });
            }
        }
    }
    groups.sort_by_key(|g| Reverse(by.of(&g.site.metrics)));
    groups
}

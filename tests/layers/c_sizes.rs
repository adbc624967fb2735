//! The C sides' sizes (issue 42): no C function in `bpf/` or `preload/`
//! longer than 100 lines, no C file (`.c`, `.h`) longer than 1,200.
//!
//! The scanner reads C the way its authors write it: comments, strings,
//! character literals and preprocessor lines (with their continuations) are
//! blanked first, then a `{` at brace depth 0 whose declaration ends in `)`
//! opens a function body (`struct x {`, `= {` do not). A function's lines
//! run from the first line of its declaration (after the previous `;`, `}`
//! or preprocessor line at depth 0) to its closing brace.

use std::path::{Path, PathBuf};

/// The longest C function allowed, in lines.
const MAX_C_FN_LINES: usize = 100;
/// The longest C file allowed, in lines.
const MAX_C_FILE_LINES: usize = 1200;

/// The `.c` and `.h` files of `dir` (a directory of the repository).
fn c_files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("reading {}: {err}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "c" || e == "h"))
        .collect();
    out.sort();
    out
}

/// `text` with comments, string and character literals and preprocessor
/// lines blanked to spaces (newlines kept, so offsets keep their lines); a
/// preprocessor line leaves a `;` where it began, a declaration boundary.
fn blank_c(text: &str) -> Vec<u8> {
    let src = text.as_bytes();
    let mut out = src.to_vec();
    let mut i = 0;
    let mut line_start = true;
    while i < src.len() {
        let c = src[i];
        if line_start && c == b'#' {
            out[i] = b';';
            i += 1;
            // To the end of the line, and of each continued one.
            while i < src.len() && !(src[i] == b'\n' && src[i - 1] != b'\\') {
                if src[i] != b'\n' {
                    out[i] = b' ';
                }
                i += 1;
            }
            continue;
        }
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if !c.is_ascii_whitespace() {
            line_start = false;
        }
        let end = match (c, src.get(i + 1)) {
            (b'/', Some(b'/')) => (i..src.len())
                .find(|&k| src[k] == b'\n')
                .unwrap_or(src.len()),
            (b'/', Some(b'*')) => (i + 2..src.len().saturating_sub(1))
                .find(|&k| src[k] == b'*' && src[k + 1] == b'/')
                .map_or(src.len(), |k| k + 2),
            (b'"' | b'\'', _) => {
                let mut k = i + 1;
                while k < src.len() && src[k] != c && src[k] != b'\n' {
                    k += if src[k] == b'\\' { 2 } else { 1 };
                }
                (k + 1).min(src.len())
            }
            _ => {
                i += 1;
                continue;
            }
        };
        for byte in &mut out[i..end] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
        i = end;
    }
    out
}

/// The 1-based line of byte `at`.
fn line_of(code: &[u8], at: usize) -> usize {
    code[..at].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Every function of `text`: its first line and its length in lines.
fn c_functions(text: &str) -> Vec<(usize, usize)> {
    let code = blank_c(text);
    let mut out = Vec::new();
    let mut depth = 0usize;
    // Where the current declaration began (after the last boundary at
    // depth 0), and where the open function's declaration began.
    let mut decl = 0;
    let mut open = None;
    for (i, &b) in code.iter().enumerate() {
        match b {
            b'{' => {
                if depth == 0 {
                    let before = code[..i].trim_ascii_end();
                    let start = decl
                        + code[decl..i]
                            .iter()
                            .take_while(|b| b.is_ascii_whitespace())
                            .count();
                    open = before.ends_with(b")").then_some(start);
                }
                depth += 1;
            }
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    if let Some(start) = open.take() {
                        let first = line_of(&code, start);
                        out.push((first, line_of(&code, i) - first + 1));
                    }
                    decl = i + 1;
                }
            }
            b';' if depth == 0 => decl = i + 1,
            _ => {}
        }
    }
    out
}

/// What breaks the size rules in `dir`: long functions and long files.
fn oversized(dir: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for file in c_files(dir) {
        let text = std::fs::read_to_string(&file).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() > MAX_C_FILE_LINES {
            bad.push(format!("{}: {} lines", file.display(), lines.len()));
        }
        for (first, len) in c_functions(&text) {
            if len > MAX_C_FN_LINES {
                let head = lines.get(first - 1).map_or("", |l| l.trim());
                bad.push(format!("{}:{first} {len} lines: {head}", file.display()));
            }
        }
    }
    bad
}

/// Check that the scanner finds C functions as written in this tree:
/// kernel style, a brace on the declaration's line, BPF_PROG, and not
/// structs, initializers, macros, or braces in strings and comments.
#[test]
fn layers_c_scanner_finds_functions() {
    let text = "#define F(x) { x; }\n\
                struct s {\n\tint a;\n};\n\
                static const int t[] = { 1, 2 };\n\
                /* { */\n\
                static int\n\
                f(int a)\n\
                {\n\
                \tif (a) {\n\t\treturn '{';\n\t}\n\
                \treturn \"}\"[0];\n\
                }\n\
                SEC(\"tp_btf/x\")\n\
                int BPF_PROG(g, int a) {\n\treturn a;\n}\n";
    assert_eq!(c_functions(text), vec![(7, 8), (15, 4)]);
}

/// Check that no C function in `bpf/` is longer than 100 lines and no C
/// file there longer than 1,200 (issue 42).
#[test]
fn layers_bpf_c_sizes() {
    let bad = oversized("bpf");
    assert!(
        bad.is_empty(),
        "over {MAX_C_FN_LINES} lines a function or {MAX_C_FILE_LINES} a file: {bad:#?}"
    );
}

/// Check that no C function in `preload/` is longer than 100 lines and no
/// C file there longer than 1,200 (issue 42).
#[test]
fn layers_preload_c_sizes() {
    let bad = oversized("preload");
    assert!(
        bad.is_empty(),
        "over {MAX_C_FN_LINES} lines a function or {MAX_C_FILE_LINES} a file: {bad:#?}"
    );
}

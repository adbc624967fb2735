//! Function names as the text reports show them: C++ (and Rust) names with
//! their template arguments elided and without their parameter lists
//! (`std::vector<int, std::allocator<int> >::_M_realloc_insert<int
//! const&>(…)` reads `std::vector<…>::_M_realloc_insert<…>`). The clone
//! suffixes GCC's demangled names end with are kept after the shortened
//! name (`fill(Big) [clone .constprop.0] [clone .isra.0]` reads `fill
//! [clone .constprop.0] [clone .isra.0]`, issue 41). JSON, pprof, folded
//! stacks and flame graphs keep names whole. Images (modules) read as
//! their file name ([`module_base`]).

use std::borrow::Cow;

/// `name` shortened for text: every outermost `<…>` becomes `<…>`, and a
/// parameter list (with its trailing `const`, `&`, `&&`) is dropped. The
/// operator names (`operator<<`, `operator()`, `operator->`) and
/// `(anonymous namespace)` are kept, and so are Python's `<module>` and
/// `.<locals>` (a `<` that follows no name). GCC's clone suffixes
/// (` [clone .isra.0]`, ` [clone .cold]`…) follow the shortened name as
/// they are. A name without `<` or `(` is returned as is.
pub(super) fn short(name: &str) -> Cow<'_, str> {
    let (base, clones) = split_clones(name);
    if !base.contains(['<', '(']) {
        return Cow::Borrowed(name);
    }
    let mut out = shorten(base);
    out.push_str(clones);
    Cow::Owned(out)
}

/// The last component of a module path: `/usr/lib/libc.so.6` → `libc.so.6`.
pub(super) fn module_base(module: &str) -> &str {
    module.rsplit('/').find(|s| !s.is_empty()).unwrap_or(module)
}

/// `name` split before the clone suffixes it ends with: `foo(int) [clone
/// .part.0] [clone .cold]` → (`foo(int)`, ` [clone .part.0] [clone
/// .cold]`); (`name`, ``) without any.
fn split_clones(name: &str) -> (&str, &str) {
    let mut cut = name.len();
    loop {
        let head = &name[..cut];
        let Some(inner) = head.strip_suffix(']') else {
            break;
        };
        match inner.rfind(" [clone .") {
            Some(at) if !inner[at + 2..].contains(['[', ']']) => cut = at,
            _ => break,
        }
    }
    name.split_at(cut)
}

/// `name` (without clone suffixes) with its template arguments elided and
/// its parameter list and return type dropped.
fn shorten(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if out.ends_with("operator") && !c.is_alphanumeric() && c != '_' && c != ' ' {
            i += operator_token(&chars[i..], &mut out);
            continue;
        }
        match c {
            // Python's `<module>`, `f.<locals>.<listcomp>`: a template's
            // `<` always follows its name.
            '<' if out.is_empty() || out.ends_with('.') => {
                let end = past_group(&chars, i, '<', '>');
                out.extend(&chars[i..end]);
                i = end;
            }
            '<' => {
                out.push_str("<…>");
                i = past_group(&chars, i, '<', '>');
            }
            '(' if starts_with(&chars[i..], "(anonymous namespace)") => {
                out.push_str("(anonymous namespace)");
                i += "(anonymous namespace)".len();
            }
            '(' => {
                i = past_group(&chars, i, '(', ')');
                // The qualifiers of a member function's parameter list.
                for q in [" const", " volatile", " &&", " &", "&&", "&"] {
                    if starts_with(&chars[i..], q) {
                        i += q.chars().count();
                    }
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    drop_return_type(out)
}

/// `name` without the return type a demangled template function starts
/// with (`void std::vector<…>::_M_realloc_insert<…>` →
/// `std::vector<…>::_M_realloc_insert<…>`): what follows its last space
/// outside parentheses that does not follow `operator` (`operator new`,
/// `std::operator<< <…>`).
fn drop_return_type(name: String) -> String {
    let mut depth = 0i32;
    let mut cut = None;
    for (i, c) in name.char_indices() {
        match c {
            '(' | '{' => depth += 1,
            ')' | '}' => depth -= 1,
            ' ' if depth == 0 => {
                let token = name[..i].rsplit([' ', ':']).next().unwrap_or("");
                if !token.starts_with("operator") && !name[..i].ends_with("(anonymous") {
                    cut = Some(i + 1);
                }
            }
            _ => {}
        }
    }
    match cut {
        Some(at) if at < name.len() => name[at..].to_owned(),
        _ => name,
    }
}

fn starts_with(chars: &[char], s: &str) -> bool {
    let mut it = chars.iter();
    s.chars().all(|c| it.next() == Some(&c))
}

/// Copies the operator after `operator` into `out`; returns its length.
fn operator_token(chars: &[char], out: &mut String) -> usize {
    for t in ["()", "[]"] {
        if starts_with(chars, t) {
            out.push_str(t);
            return 2;
        }
    }
    let n = chars
        .iter()
        .take_while(|c| "<>=!+-*/%^&|~,".contains(**c))
        .count()
        .max(1);
    out.extend(&chars[..n]);
    n
}

/// The index past the group that opens at `chars[start]` (`open`), nested
/// groups of both kinds included; the end of the name when it does not
/// close.
fn past_group(chars: &[char], start: usize, open: char, close: char) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < chars.len() {
        let c = chars[i];
        // `operator<` inside template arguments does not open a group.
        let after_operator = chars[..i]
            .iter()
            .rev()
            .take(8)
            .copied()
            .eq("operator".chars().rev());
        if c == open && !(open == '<' && after_operator) {
            depth += 1;
        } else if c == close && !(close == '>' && i > 0 && chars[i - 1] == '-') {
            depth -= 1;
            if depth == 0 {
                return i + 1;
            }
        }
        i += 1;
    }
    chars.len()
}

#[cfg(test)]
mod tests {
    use super::short;

    #[test]
    fn shortens() {
        let cases = [
            (
                "std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)",
                "std::vector<…>::_M_realloc_insert<…>",
            ),
            (
                "std::__new_allocator<char>::allocate(unsigned long, void const*)",
                "std::__new_allocator<…>::allocate",
            ),
            ("operator new(unsigned long)", "operator new"),
            ("operator new[](unsigned long)", "operator new[]"),
            ("Foo::operator()(int) const", "Foo::operator()"),
            (
                "std::operator<< <char>(std::ostream&, char const*)",
                "std::operator<< <…>",
            ),
            (
                "(anonymous namespace)::pool::pool()",
                "(anonymous namespace)::pool::pool",
            ),
            ("xmalloc", "xmalloc"),
            (
                "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int>(int&&)",
                "std::vector<…>::_M_realloc_insert<…>",
            ),
            (
                "std::_Rb_tree_node<int>* std::_Rb_tree<int>::_M_create_node<int const&>(int const&)",
                "std::_Rb_tree<…>::_M_create_node<…>",
            ),
            ("unsigned long foo::bar(int)", "foo::bar"),
            ("operator delete(void*)", "operator delete"),
            (
                "{lambda(int)#1}::operator()(int) const",
                "{lambda#1}::operator()",
            ),
            ("parse;token", "parse;token"),
            (
                "make_big.<locals>.<listcomp>",
                "make_big.<locals>.<listcomp>",
            ),
            ("<module>", "<module>"),
            // GCC's clones (issue 41).
            (
                "fill(Big) [clone .constprop.0] [clone .isra.0]",
                "fill [clone .constprop.0] [clone .isra.0]",
            ),
            (
                "grow(unsigned long) [clone .part.0]",
                "grow [clone .part.0]",
            ),
            ("spill(unsigned long) [clone .cold]", "spill [clone .cold]"),
            (
                "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int>(int&&) [clone .isra.0]",
                "std::vector<…>::_M_realloc_insert<…> [clone .isra.0]",
            ),
            ("foo [clone .cold]", "foo [clone .cold]"),
            ("foo.isra.0", "foo.isra.0"),
        ];
        for (name, want) in cases {
            assert_eq!(short(name), want, "{name}");
        }
    }
}

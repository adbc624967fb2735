//! Which x86-64 instructions the kernel emulates at a uprobe (~0.4 µs a
//! hit) rather than single-stepping them out of line (~14 µs): the rule
//! the probe placement ([`super::prologue`]) and the return sites aim for.

/// Whether the kernel emulates the instruction at the start of `code`
/// instead of single-stepping it, by the rules of x86's
/// `arch_uprobe_analyze_insn` (arch/x86/kernel/uprobes.c, Linux 6.x):
/// `branch_setup_xol_ops` takes the kernel's own nops (`x86_nops`: `nop`,
/// `66 90`, and the `nopl`/`nopw` forms it pads code with, up to 8 bytes),
/// `nop` (0x90) whatever its prefixes, `jmp rel8/rel32`, `call rel32` and
/// the conditional jumps (short and near) unless a 0x66 prefix comes with
/// them; `push_setup_xol_ops` takes `push reg` alone or with the REX
/// prefix 0x41 only. Everything else (`ret`, other `nopl` encodings,
/// `sub`, `mov`, ...) is single-stepped out of line, or refused (a
/// 0x2e/0x3e/0x26/0x36 or lock prefix). Linux 6.18 checked on this
/// machine: a single-stepped probe maps the `[uprobes]` page into the
/// process, an emulated one does not (`tests/attach.rs`).
pub(super) fn is_emulated(code: &[u8]) -> bool {
    /// The kernel's `x86_nops` (`p6_nops`), 2 to 8 bytes long.
    const X86_NOPS: [&[u8]; 7] = [
        &[0x66, 0x90],
        &[0x0f, 0x1f, 0x00],
        &[0x0f, 0x1f, 0x40, 0x00],
        &[0x0f, 0x1f, 0x44, 0x00, 0x00],
        &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
        &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
        &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
    ];
    if X86_NOPS.iter().any(|nop| code.starts_with(nop)) {
        return true;
    }
    const LEGACY: [u8; 11] = [
        0x66, 0x67, 0xf2, 0xf3, 0x2e, 0x3e, 0x26, 0x36, 0x64, 0x65, 0xf0,
    ];
    let mut at = 0;
    while code.get(at).is_some_and(|b| LEGACY.contains(b)) && at < 14 {
        at += 1;
    }
    let legacy = &code[..at];
    if legacy
        .iter()
        .any(|p| matches!(p, 0x2e | 0x3e | 0x26 | 0x36 | 0xf0))
    {
        return false; // is_prefix_bad: refused
    }
    let rex = code.get(at).copied().filter(|b| b & 0xf0 == 0x40);
    let op = &code[(at + usize::from(rex.is_some())).min(code.len())..];
    let no_66 = !legacy.contains(&0x66);
    match op {
        [0x90, ..] => true,
        [0xe8 | 0xe9 | 0xeb, ..] | [0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..] => no_66,
        [0x50..=0x57, ..] => legacy.is_empty() && matches!(rex, None | Some(0x41)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::is_emulated;

    /// Check the instructions the kernel emulates against x86's
    /// `arch_uprobe_analyze_insn` (issue 22): push, the kernel's nops,
    /// relative jumps and calls; never `ret`, another `nopl` encoding, a
    /// 0x66-prefixed branch or a `push` with another REX prefix.
    #[test]
    fn attach_emulated_instructions_as_the_kernel() {
        let emulated: &[&[u8]] = &[
            &[0x53],
            &[0x41, 0x57],
            &[0x55],
            &[0x90],
            &[0x66, 0x90],
            &[0xe8, 0, 0, 0, 0],
            &[0xe9, 0, 0, 0, 0],
            &[0xeb, 0],
            &[0x74, 0],
            &[0x0f, 0x87, 0, 0, 0, 0],
            &[0xf2, 0xe9, 0, 0, 0, 0], // bnd jmp
        ];
        for code in emulated {
            assert!(is_emulated(code), "{code:02x?}");
        }
        for nop in [
            &[0x0f, 0x1f, 0x44, 0, 0][..],
            &[0x0f, 0x1f, 0x40, 0],
            &[0x66, 0x0f, 0x1f, 0x44, 0, 0],
            &[0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0],
        ] {
            assert!(is_emulated(nop), "{nop:02x?}");
        }
        let stepped: &[&[u8]] = &[
            &[0xc3],
            &[0x0f, 0x1f, 0x44, 0, 8],
            &[0x0f, 0x1f, 0x40, 1],
            &[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0],
            &[0x66, 0xe8, 0, 0],
            &[0x66, 0x74, 0],
            &[0x48, 0x53],
            &[0x66, 0x53],
            &[0x3e, 0x74, 0], // branch hint: refused
            &[0x48, 0x83, 0xec, 0x08],
            &[0xff, 0xe0],
            &[],
        ];
        for code in stepped {
            assert!(!is_emulated(code), "{code:02x?}");
        }
    }
}

// memtrail's USDT region markers for Rust: the same probes as
// include/memtrail_usdt.h (provider `memtrail`, `region_begin` with the
// region name's address in a register, `region_end`), for programs run
// under `memtrail run` or `memtrail attach`. No library to link: copy this
// file or `include!` it at a crate's root; the memtrail crate exports the
// same macros (`memtrail::memtrail_region_begin!`). Each marker is one `nop` (the
// kernel emulates it when probed; nothing when not traced) and a note in
// `.note.stapsdt`. x86_64 only: elsewhere the markers are empty.
//
//     memtrail_region_begin!("parse");
//     parse(input);
//     memtrail_region_end!();
//
// The name is a string literal, at most 31 bytes kept.

/// Marks the start of region `$name` (a string literal) on this thread.
#[macro_export]
macro_rules! memtrail_region_begin {
    ($name:literal) => {{
        #[cfg(target_arch = "x86_64")]
        {
            let name: &'static [u8] = concat!($name, "\0").as_bytes();
            // The name's page in memory before BPF copies it.
            // SAFETY: reads of the first and last bytes of a static.
            unsafe {
                ::core::ptr::read_volatile(name.as_ptr());
                ::core::ptr::read_volatile(name.as_ptr().add(name.len() - 1));
            }
            // SAFETY: a nop and a note in other sections; reads the
            // register only.
            unsafe {
                ::core::arch::asm!(
                    "990: nop",
                    ".pushsection .note.stapsdt,\"?\",\"note\"",
                    ".balign 4",
                    ".4byte 992f-991f, 994f-993f, 3",
                    "991: .asciz \"stapsdt\"",
                    "992: .balign 4",
                    "993: .8byte 990b",
                    ".8byte _.stapsdt.base",
                    ".8byte 0",
                    ".asciz \"memtrail\"",
                    ".asciz \"region_begin\"",
                    ".asciz \"8@{0}\"",
                    "994: .balign 4",
                    ".popsection",
                    ".ifndef _.stapsdt.base",
                    ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat",
                    ".weak _.stapsdt.base",
                    ".hidden _.stapsdt.base",
                    "_.stapsdt.base:",
                    ".space 1",
                    ".size _.stapsdt.base, 1",
                    ".popsection",
                    ".endif",
                    in(reg) name.as_ptr(),
                    options(att_syntax, nostack, preserves_flags),
                );
            }
        }
    }};
}

/// Marks the end of this thread's innermost open region.
#[macro_export]
macro_rules! memtrail_region_end {
    () => {{
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a nop and a note in other sections.
        unsafe {
            ::core::arch::asm!(
                "990: nop",
                ".pushsection .note.stapsdt,\"?\",\"note\"",
                ".balign 4",
                ".4byte 992f-991f, 994f-993f, 3",
                "991: .asciz \"stapsdt\"",
                "992: .balign 4",
                "993: .8byte 990b",
                ".8byte _.stapsdt.base",
                ".8byte 0",
                ".asciz \"memtrail\"",
                ".asciz \"region_end\"",
                ".asciz \"\"",
                "994: .balign 4",
                ".popsection",
                ".ifndef _.stapsdt.base",
                ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat",
                ".weak _.stapsdt.base",
                ".hidden _.stapsdt.base",
                "_.stapsdt.base:",
                ".space 1",
                ".size _.stapsdt.base, 1",
                ".popsection",
                ".endif",
                options(att_syntax, nostack, preserves_flags),
            );
        }
    }};
}

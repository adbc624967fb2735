//! `memtrail --version`: the release, the commit it was built from, and
//! which of the kernel's BPF features memtrail needs this machine has.

use std::fmt::Write as _;

use libbpf_rs::btf::{Btf, BtfType};
use libbpf_rs::{MapType, ProgramType};

/// `-V`: the release and the commit (`unknown` when not built from a git
/// checkout).
pub const SHORT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MEMTRAIL_GIT_COMMIT"),
    ")"
);

/// A feature memtrail needs, and whether this machine has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feature {
    pub name: &'static str,
    /// `Some(true)` found, `Some(false)` missing, `None` could not be told
    /// (probing BPF needs CAP_BPF).
    pub found: Option<bool>,
}

/// Looks for every kernel feature memtrail needs.
pub fn features() -> Vec<Feature> {
    let btf = Btf::from_vmlinux().ok();
    let has_type = |name: &str| {
        btf.as_ref()
            .map(|btf| btf.type_by_name::<BtfType<'_>>(name).is_some())
    };
    let probe = |r: libbpf_rs::Result<bool>| r.ok();
    let kprobe = ProgramType::Kprobe;
    vec![
        Feature {
            name: "BTF",
            found: Some(btf.is_some()),
        },
        Feature {
            name: "ring buffers",
            found: probe(MapType::RingBuf.is_supported()),
        },
        Feature {
            name: "uprobe_multi links",
            found: has_type("bpf_uprobe_multi_link"),
        },
        // A tp_btf program attaches through the tracepoint's btf_trace_*
        // type (libbpf cannot probe the program type itself).
        Feature {
            name: "tp_btf programs",
            found: has_type("btf_trace_sched_process_fork"),
        },
        Feature {
            name: "task storage",
            found: probe(MapType::TaskStorage.is_supported()),
        },
        Feature {
            name: "bpf_send_signal",
            found: probe(kprobe.is_helper_supported(libbpf_sys::BPF_FUNC_send_signal)),
        },
        Feature {
            name: "bpf_find_vma",
            found: probe(kprobe.is_helper_supported(libbpf_sys::BPF_FUNC_find_vma)),
        },
        // A kfunc: a function of the kernel's BTF. Only per-process probes
        // need it (`--probes`; without it they are system-wide).
        Feature {
            name: "bpf_send_signal_task",
            found: has_type("bpf_send_signal_task"),
        },
    ]
}

/// `--version`: [`SHORT`], then the BPF features found.
pub fn long() -> String {
    let mut text = String::from(SHORT);
    text.push_str("\nkernel BPF features memtrail needs:");
    for f in features() {
        let found = match f.found {
            Some(true) => "found",
            Some(false) => "MISSING",
            None => "unknown (probing needs CAP_BPF)",
        };
        let _ = write!(text, "\n  {:<20} {found}", f.name);
    }
    text
}

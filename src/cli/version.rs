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
    pub found: Found,
}

/// Whether a feature was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Yes,
    No,
    /// Not told: why (e.g. the probe needs a capability memtrail lacks).
    Unknown(&'static str),
}

/// What probing BPF needs, and what memtrail has of it.
struct Probing {
    /// Creating maps: CAP_BPF.
    maps: bool,
    /// Loading a kprobe program (how libbpf probes helpers): CAP_BPF and
    /// CAP_PERFMON.
    programs: bool,
}

impl Probing {
    fn now() -> Self {
        const CAP_SYS_ADMIN: u32 = 21;
        const CAP_PERFMON: u32 = 38;
        const CAP_BPF: u32 = 39;
        let has = crate::sys::has_capability;
        let admin = has(CAP_SYS_ADMIN);
        let bpf = admin || has(CAP_BPF);
        Self {
            maps: bpf,
            programs: bpf && (admin || has(CAP_PERFMON)),
        }
    }
}

/// A probe's answer; without the capabilities it needs, a refusal would
/// read as a missing feature (a map type libbpf cannot create is "not
/// supported") or a found one (a helper libbpf cannot load a program for
/// is "supported"), so it is not asked.
fn probed(
    allowed: bool,
    needs: &'static str,
    probe: impl FnOnce() -> libbpf_rs::Result<bool>,
) -> Found {
    if !allowed {
        return Found::Unknown(needs);
    }
    match probe() {
        Ok(true) => Found::Yes,
        Ok(false) => Found::No,
        Err(_) => Found::Unknown("the probe failed"),
    }
}

/// Looks for every kernel feature memtrail needs.
pub fn features() -> Vec<Feature> {
    const MAPS: &str = "needs CAP_BPF to probe";
    const PROGRAMS: &str = "needs CAP_BPF and CAP_PERFMON to probe";
    let btf = Btf::from_vmlinux().ok();
    // BTF is a file anyone may read: no capability needed.
    let has_type = |name: &str| match &btf {
        Some(btf) if btf.type_by_name::<BtfType<'_>>(name).is_some() => Found::Yes,
        _ => Found::No,
    };
    let can = Probing::now();
    let kprobe = ProgramType::Kprobe;
    vec![
        Feature {
            name: "BTF",
            found: if btf.is_some() { Found::Yes } else { Found::No },
        },
        Feature {
            name: "ring buffers",
            found: probed(can.maps, MAPS, || MapType::RingBuf.is_supported()),
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
            found: probed(can.maps, MAPS, || MapType::TaskStorage.is_supported()),
        },
        Feature {
            name: "bpf_send_signal",
            found: probed(can.programs, PROGRAMS, || {
                kprobe.is_helper_supported(libbpf_sys::BPF_FUNC_send_signal)
            }),
        },
        Feature {
            name: "bpf_find_vma",
            found: probed(can.programs, PROGRAMS, || {
                kprobe.is_helper_supported(libbpf_sys::BPF_FUNC_find_vma)
            }),
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
            Found::Yes => "found".to_owned(),
            Found::No => "MISSING".to_owned(),
            Found::Unknown(why) => format!("unknown ({why})"),
        };
        let _ = write!(text, "\n  {:<20} {found}", f.name);
    }
    text
}

//! memtrail's BPF object, loaded: its `.rodata` settings ([`Config`]), the
//! owner of the loaded skeleton ([`Loaded`]), and the events rings made
//! outside the object ([`make_ring_array`], [`make_event_rings`]).

use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, OpenObject};

use super::skel::memtrail::{MemtrailSkel, MemtrailSkelBuilder, OpenMemtrailSkel};
use crate::sys;

/// One ring's settings, by ring index (`enum mt_ring`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RingConfig {
    /// Its size in bytes (one of the events rings', when per CPU).
    pub capacity: u64,
    /// Its largest record, with its ring header.
    pub record: u64,
    /// Bytes left for a cgroup freeze to land past the watermark.
    pub freeze_room: u64,
    /// Fill, in bytes, past which the tree is paused.
    pub watermark: u64,
}

/// What the object is loaded with: the programs it loads and its
/// `const volatile` tunables (`.rodata`, set before load).
#[derive(Clone, Debug)]
pub(crate) struct Config<'a> {
    /// The array of events rings, made beforehand ([`make_ring_array`]):
    /// the object reuses it (its size and template come with it).
    pub event_ring_array: BorrowedFd<'a>,
    /// Size of the stack ring in bytes.
    pub stack_ring_size: u32,
    /// Load the uprobe session program (else the split programs).
    pub sessions: bool,
    /// Load the preload shim's programs (`--preload`): `shim_signal`, and
    /// `shim_hook` without sessions (with them, `alloc_session` serves the
    /// hook: `shim_hook`'s verification would cost as much as its own).
    pub preload: bool,
    /// Load `signal_generate` (stops and resumes by others): not in a
    /// process tracking itself, which is never stopped.
    pub signal_generate: bool,
    pub stack_depth: u32,
    /// Walk the Python frames of stacks through CPython interpreters.
    pub python_frames: bool,
    /// `enum mt_unwind_mode` ([`super::record::unwind_mode`]).
    pub unwind_mode: u32,
    pub pressure: bool,
    /// The PID namespace BPF translates ids into, when it is not the
    /// initial one (in a container).
    pub pidns: Option<u32>,
    /// Hold a process that maps an unknown image for the attach worker.
    pub attach_hold: bool,
    pub per_process: bool,
    pub memtrail_tgid: u32,
    /// The session's own threads are in `excluded_threads`.
    pub threads_excluded: bool,
    pub rings: [RingConfig; 4],
    /// One events ring per CPU.
    pub cpu_rings: bool,
    /// Every record stamped after its reservation (per-CPU rings, the
    /// preload shim's rings): the events are merged by stamp.
    pub stamp_reserved: bool,
    pub event_ring_count: u32,
    /// Fault injection: every thread shares one slot.
    pub one_thread_slot: bool,
    /// Fault injection: BPF's cache of unwind rules gives every frame of
    /// an image one slot.
    pub one_row_cache_slot: bool,
    /// Fault injection: every walk contends for one stack window.
    pub one_stack_window: bool,
    /// Fault injection: `bpf_find_vma` reports busy.
    pub find_vma_busy: bool,
    /// Fault injection: every allocating call's return counts as handed
    /// back elsewhere.
    pub returns_elsewhere: bool,
}

impl Config<'_> {
    /// Sets the open object up as configured. Returns the first unwind
    /// shard, made here ([`first_unwind_shard`]): it must live until the
    /// object is loaded.
    fn apply(
        &self,
        open: &mut OpenMemtrailSkel<'_>,
    ) -> Result<libbpf_rs::MapHandle, libbpf_rs::Error> {
        open.maps.event_rings.reuse_fd(self.event_ring_array)?;
        let first_shard = first_unwind_shard(open)?;
        open.maps.stacks.set_max_entries(self.stack_ring_size)?;
        open.progs
            .signal_generate
            .set_autoload(self.signal_generate);
        // One set of allocator programs: the session program or the
        // split ones.
        open.progs.alloc_session.set_autoload(self.sessions);
        open.progs
            .shim_hook
            .set_autoload(self.preload && !self.sessions);
        open.progs.shim_signal.set_autoload(self.preload);
        open.progs.rss_stat.set_autoload(rss_supported());
        for prog in [
            &mut open.progs.alloc_enter,
            &mut open.progs.alloc_return,
            &mut open.progs.free_enter,
        ] {
            prog.set_autoload(!self.sessions);
        }
        debug_assert_eq!(
            [
                u64::from(open.maps.mappings.max_entries()),
                u64::from(open.maps.attach_requests.max_entries())
            ],
            [self.rings[2].capacity, self.rings[3].capacity],
            "the fixed rings' sizes"
        );
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("the BPF object has .rodata tunables");
        ro.stack_depth = self.stack_depth;
        ro.python_frames = u32::from(self.python_frames);
        ro.unwind_mode = self.unwind_mode;
        ro.pressure_enabled = self.pressure;
        if let Some(ino) = self.pidns {
            ro.pidns_translate = true;
            ro.pidns_ino = ino;
        }
        ro.attach_hold = self.attach_hold;
        ro.per_process = self.per_process;
        ro.memtrail_tgid = self.memtrail_tgid;
        ro.threads_excluded = self.threads_excluded;
        for (i, ring) in self.rings.iter().enumerate() {
            ro.ring_capacity[i] = ring.capacity;
            ro.ring_record[i] = ring.record;
            ro.ring_freeze_room[i] = ring.freeze_room;
        }
        if self.one_thread_slot {
            ro.thread_slot_mask = 0;
        }
        if self.one_stack_window {
            ro.stack_window_mask = 0;
        }
        if self.one_row_cache_slot {
            ro.row_cache_crowd = 1;
        }
        ro.fault_find_vma_busy = self.find_vma_busy;
        ro.fault_returns_elsewhere = self.returns_elsewhere;
        ro.cpu_rings = self.cpu_rings;
        ro.stamp_reserved = self.stamp_reserved || self.cpu_rings;
        ro.event_ring_count = self.event_ring_count;
        ro.watermark_events = self.rings[0].watermark;
        ro.watermark_stacks = self.rings[1].watermark;
        ro.watermark_mappings = self.rings[2].watermark;
        ro.watermark_attach = self.rings[3].watermark;
        Ok(first_shard)
    }
}

/// Makes `unwind_rows`, the first shard of the unwind tables, for the
/// object to reuse, and makes it the template of the other shards'
/// map-in-map `unwind_shards`: libbpf would otherwise make a template of
/// its own, a second 8 MiB array that lives only during the load (~27 ms of
/// every start, perf/RESULTS.md). Its fd is the template's during the load.
fn first_unwind_shard(
    open: &mut OpenMemtrailSkel<'_>,
) -> Result<libbpf_rs::MapHandle, libbpf_rs::Error> {
    let rows = &open.maps.unwind_rows;
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
        map_flags: rows.map_flags(),
        ..Default::default()
    };
    let shard = libbpf_rs::MapHandle::create(
        libbpf_rs::MapType::Array,
        Some("unwind_rows"),
        rows.key_size(),
        rows.value_size(),
        rows.max_entries(),
        &opts,
    )?;
    open.maps.unwind_rows.reuse_fd(shard.as_fd())?;
    open.maps.unwind_shards.set_inner_map_fd(shard.as_fd())?;
    Ok(shard)
}

/// Whether the kernel's mm counters are the per-CPU counters `rss_stat`
/// reads (Linux 6.2 and later): else resident memory is not recorded.
pub(crate) fn rss_supported() -> bool {
    sys::kernel_release() >= (6, 2)
}

/// The loaded BPF object: the skeleton and the storage it borrows.
pub(crate) struct Loaded {
    pub skel: ManuallyDrop<MemtrailSkel<'static>>,
    storage: NonNull<MaybeUninit<OpenObject>>,
    /// Whether the uprobe session program was loaded (else the split
    /// programs).
    pub sessions: bool,
    /// Whether `shim_hook` was loaded (`--preload`).
    pub preload: bool,
}

// SAFETY: libbpf objects (the skeleton's object, programs, maps, links'
// targets) are not tied to the thread that made them, and `storage` is a
// heap allocation owned by this value alone. Moving the whole to another
// thread moves its sole owner.
unsafe impl Send for Loaded {}
// SAFETY: through `&Loaded` only libbpf-rs's `&self` methods are reachable:
// syscalls on the maps' and programs' descriptors (which the kernel
// serializes) and reads of metadata libbpf does not change after load; the
// `.bss` and `.rodata` views need `&mut` to write. No interior mutability
// is reachable through a shared borrow.
unsafe impl Sync for Loaded {}

impl Loaded {
    /// Opens, configures and loads the object. A kernel that refuses the
    /// session program (its session kfunc gone or changed again) gets the
    /// split programs.
    pub fn load(config: &Config<'_>) -> Result<Self, libbpf_rs::Error> {
        match Self::load_once(config) {
            Err(err) if config.sessions => {
                tracing::debug!(%err, "the uprobe session program did not load: the split programs instead");
                Self::load_once(&Config {
                    sessions: false,
                    ..config.clone()
                })
            }
            loaded => loaded,
        }
    }

    fn load_once(config: &Config<'_>) -> Result<Self, libbpf_rs::Error> {
        let storage = NonNull::from(Box::leak(Box::new(MaybeUninit::<OpenObject>::uninit())));
        let free = || {
            // SAFETY: `storage` came from Box::leak above and nothing
            // borrows it any more (the skeleton failed or was dropped).
            drop(unsafe { Box::from_raw(storage.as_ptr()) });
        };
        // SAFETY: the box lives until `Loaded::drop` (or `free` on failure),
        // which first drops the skeleton that borrows it; it is never
        // moved (it is on the heap) and borrowed by nothing else.
        let object: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *storage.as_ptr() };
        let loaded = MemtrailSkelBuilder::default()
            .open(object)
            .and_then(|mut open| {
                let first_shard = config.apply(&mut open)?;
                let skel = open.load();
                drop(first_shard);
                skel
            });
        match loaded {
            Ok(skel) => Ok(Self {
                skel: ManuallyDrop::new(skel),
                storage,
                sessions: config.sessions,
                preload: config.preload,
            }),
            Err(err) => {
                free();
                Err(err)
            }
        }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // Every link is closed by now (the object drops after them, in a
        // session and during its start), so no program holds a process any
        // more. A process BPF held at fork (or at a relink) and nobody
        // released is still in `held_for_probes`: its request was left in
        // the ring when the attach worker stopped, or its fork came after
        // (between the pollers' join and the links' close). Resumed here,
        // or it stays stopped for good, and a parent in `vfork` with it
        // (issue 27).
        resume_held_for_probes(&self.skel);
        // SAFETY: dropped once, here, before the storage it borrows.
        unsafe { ManuallyDrop::drop(&mut self.skel) };
        // SAFETY: from Box::leak in `load_once`; the skeleton is gone.
        drop(unsafe { Box::from_raw(self.storage.as_ptr()) });
    }
}

/// Sends SIGCONT to every process left in BPF's `held_for_probes` map.
fn resume_held_for_probes(skel: &MemtrailSkel<'_>) {
    let Ok(held) = sys::bpf_map_u32_keys(skel.maps.held_for_probes.as_fd()) else {
        return;
    };
    for pid in held {
        tracing::debug!(pid, "resuming a process held for probes nobody made");
        if let Err(err) = sys::kill(pid.into(), sys::Signal::CONT) {
            tracing::debug!(pid, %err, "could not resume a held process (gone?)");
        }
    }
}

/// Makes the array of `count` events rings BPF reserves from (see
/// `event_rings` in the BPF), empty.
pub(crate) fn make_ring_array(count: usize) -> Result<libbpf_rs::MapHandle, libbpf_rs::Error> {
    let page = rustix::param::page_size();
    let template = make_rings(&[page])?;
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
        inner_map_fd: template[0].as_fd().as_raw_fd() as u32,
        ..Default::default()
    };
    libbpf_rs::MapHandle::create(
        libbpf_rs::MapType::ArrayOfMaps,
        Some("event_rings"),
        4,
        4,
        count as u32,
        &opts,
    )
}

/// Makes the events rings, of `sizes` bytes (one shared, or one per CPU),
/// and puts ring `i` at index `i` of `array`.
/// Every single insertion into an array of maps waits for an RCU grace
/// period (~8 ms here); the batch took under 1 ms.
pub(crate) fn make_event_rings(
    sizes: &[usize],
    array: &libbpf_rs::MapHandle,
) -> Result<Vec<libbpf_rs::MapHandle>, libbpf_rs::Error> {
    let rings = make_rings(sizes)?;
    let keys: Vec<u8> = (0..rings.len() as u32).flat_map(u32::to_ne_bytes).collect();
    let fds: Vec<u8> = rings
        .iter()
        .flat_map(|r| (r.as_fd().as_raw_fd() as u32).to_ne_bytes())
        .collect();
    let batch = array.update_batch(
        &keys,
        &fds,
        rings.len() as u32,
        libbpf_rs::MapFlags::ANY,
        libbpf_rs::MapFlags::ANY,
    );
    if let Err(err) = batch {
        tracing::debug!(%err, "events rings: no batch insertion; one at a time");
        for (key, fd) in keys.chunks(4).zip(fds.chunks(4)) {
            array.update(key, fd, libbpf_rs::MapFlags::ANY)?;
        }
    }
    Ok(rings)
}

/// Makes ring buffers of `sizes` bytes.
fn make_rings(sizes: &[usize]) -> Result<Vec<libbpf_rs::MapHandle>, libbpf_rs::Error> {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    sizes
        .iter()
        .map(|&size| {
            libbpf_rs::MapHandle::create(
                libbpf_rs::MapType::RingBuf,
                Some("mt_events"),
                0,
                0,
                size as u32,
                &opts,
            )
        })
        .collect()
}

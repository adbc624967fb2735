//! Ring consumer benchmarks: memtrail's [`RingConsumer`] against libbpf-rs's
//! [`RingBuffer`], side by side in one process, on records the BPF program
//! `bpf/ringtest.bpf.c` makes (run with `BPF_PROG_TEST_RUN`).
//!
//! - Throughput, drain: a producer thread fills a ring, then the consumer
//!   thread, on the other core, empties it; only the emptying is timed, so
//!   this is the consumer's own cost per record. With a 64 MiB ring the
//!   records come from memory, with a 1 MiB ring from the shared cache.
//! - Throughput, streaming: producer and consumer run at once on the two
//!   cores; records/s end to end (bound by the slower of the two).
//! - Delivery latency: one record every 1-5 ms; memtrail's consumer on a
//!   poller with `engine::idle::IdleWait`, napping between records. BPF
//!   timestamp (CLOCK_MONOTONIC) to the callback, p50/p99/max. The pollers
//!   take turns in ten slices, so that the host's bursts of delay (a halted
//!   vCPU waits to be scheduled) fall on all of them alike.
//! - Idle CPU: the same poller with nothing to read, thread CPU time over
//!   wall time.
//!
//! The last two run for several naps (the default among them), for
//! libbpf's epoll wait with kernel wakeups as a reference point, and for a
//! consumer that spins without ever sleeping, a reference for the delay the
//! host adds by itself; the vCPUs' steal time over the latency turns is
//! printed too.
//!
//! libbpf gets its best mode for throughput: `ring_buffer__consume` in a
//! busy loop (no epoll). Both consumers run the same callback.
//!
//! `cargo bench --bench ring_bench` (as root) runs it in full. Without
//! `--bench` (as `cargo test --benches` runs it) it does a short smoke run:
//! same code, small counts, no targets.

#[path = "../tests/support/ringtest.rs"]
#[allow(
    dead_code,
    reason = "shared with tests/capture/ring_consumer.rs, which uses other parts"
)]
mod ringtest;

use std::cell::Cell;
use std::hint::black_box;
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use libbpf_rs::{RingBuffer, RingBufferBuilder};
use std::os::fd::AsFd;

use memtrail::internals::engine::idle::{DEFAULT_NAP, DeepSleep, IdleWait, NAPS_BEFORE_DEEP_SLEEP};
use ringtest::{RingTest, Run, capacity, header};

/// Body bytes per record: a memtrail allocation record's size
/// (`struct mt_alloc_event`: 24-byte header, four u64; 64 bytes in the
/// ring).
const RECORD_SIZE: u32 =
    std::mem::size_of::<memtrail::internals::bpf::skel::memtrail::types::mt_alloc_event>() as u32;
/// memtrail's default ring size: the streaming runs and the drain from
/// memory.
const BIG_RING: u32 = 1 << 26;
/// A ring that fits in the shared L3 cache: the drain from cache, the
/// latency and idle runs.
const SMALL_RING: u32 = 1 << 20;
/// Turns the pollers take in the latency runs.
const LATENCY_SLICES: u32 = 10;
/// Records per `produce` run when streaming.
const STREAM_BATCH: u32 = 256;

/// Targets from the design: memtrail vs libbpf records/s, p99 delivery
/// latency, idle poller CPU.
const TARGET_RATIO: f64 = 1.5;
const TARGET_P99: Duration = Duration::from_millis(1);
const TARGET_IDLE_CPU_PCT: f64 = 2.0;

/// How much work a run does.
struct Scale {
    /// Drain runs: ring size, and rounds per consumer (the median is
    /// reported). Each round fills the ring to capacity.
    drains: &'static [(u32, usize)],
    /// Records a streaming run moves.
    stream_records: u64,
    /// Records of the latency run.
    latency_records: u32,
    /// Wall time of each idle run.
    idle_time: Duration,
    /// The pollers of the latency and idle runs; must hold the default.
    pollers: &'static [Poller],
}

const FULL: Scale = Scale {
    drains: &[(BIG_RING, 9), (SMALL_RING, 301)],
    stream_records: 1 << 23,
    latency_records: 1000,
    idle_time: Duration::from_secs(3),
    pollers: &[
        Poller::Memtrail(Duration::from_micros(100)),
        Poller::MemtrailDeep(NAPS_BEFORE_DEEP_SLEEP),
        Poller::MemtrailDeep(0),
        Poller::Memtrail(DEFAULT_NAP),
        Poller::Memtrail(Duration::from_micros(300)),
        Poller::Memtrail(Duration::from_micros(500)),
        Poller::Memtrail(Duration::from_micros(700)),
        Poller::LibbpfEpoll,
        Poller::Spin,
    ],
};

const SMOKE: Scale = Scale {
    drains: &[(SMALL_RING, 1)],
    stream_records: 1 << 14,
    latency_records: 10,
    idle_time: Duration::from_millis(50),
    pollers: &[
        Poller::MemtrailDeep(NAPS_BEFORE_DEEP_SLEEP),
        Poller::Memtrail(DEFAULT_NAP),
        Poller::LibbpfEpoll,
    ],
};

/// Which consumer a run measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Consumer {
    Memtrail,
    Libbpf,
}

/// What the callback saw: the same work for both consumers.
#[derive(Default)]
struct Seen {
    count: Cell<u64>,
    seq_sum: Cell<u64>,
}

impl Seen {
    fn on_record(&self, body: &[u8]) {
        let hdr = header(black_box(body));
        self.count.set(self.count.get() + 1);
        self.seq_sum.set(self.seq_sum.get().wrapping_add(hdr.seq));
    }
}

/// libbpf-rs's consumer on `rt`'s ring, handing each record to `f`.
fn libbpf_ring<'a>(rt: &'a RingTest<'_>, mut f: impl FnMut(&[u8]) + 'a) -> RingBuffer<'a> {
    let mut builder = RingBufferBuilder::new();
    builder
        .add(rt.ring_map(), move |body: &[u8]| {
            f(body);
            0
        })
        .expect("add the ring");
    builder.build().expect("build libbpf's ring buffer")
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime: {}", io::Error::last_os_error());
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns()`.
fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread.
fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The two cores: producers on the first, consumers on the second.
fn cores() -> (core_affinity::CoreId, core_affinity::CoreId) {
    let ids = core_affinity::get_core_ids().expect("list the cores");
    assert!(ids.len() >= 2, "the benchmark needs two cores");
    (ids[0], ids[1])
}

fn pin(core: core_affinity::CoreId) {
    assert!(core_affinity::set_for_current(core), "pin to {core:?}");
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Fills `rt`'s ring with `records` records on the producer core.
fn fill(rt: &RingTest<'_>, seq: u64, records: u64, producer: core_affinity::CoreId) {
    thread::scope(|s| {
        s.spawn(|| {
            pin(producer);
            let out = rt.produce(Run::new(seq, records as u32, RECORD_SIZE));
            assert_eq!(u64::from(out.submitted), records, "fill dropped records");
        });
    });
}

/// One drain round: fills the ring, then times the consumer emptying it on
/// the consumer core. Returns records/s.
fn drain_round(
    rt: &RingTest<'_>,
    which: Consumer,
    seq: u64,
    records: u64,
    cores: (core_affinity::CoreId, core_affinity::CoreId),
) -> f64 {
    fill(rt, seq, records, cores.0);
    let want_sum: u64 = (seq..seq + records).fold(0, u64::wrapping_add);
    thread::scope(|s| {
        s.spawn(|| {
            pin(cores.1);
            let seen = Seen::default();
            let elapsed = match which {
                Consumer::Memtrail => {
                    let mut ring = rt.consumer();
                    let start = Instant::now();
                    let handed = ring.poll(|body| seen.on_record(body));
                    let elapsed = start.elapsed();
                    assert_eq!(handed as u64, records);
                    elapsed
                }
                Consumer::Libbpf => {
                    let rb = libbpf_ring(rt, |body| seen.on_record(body));
                    let start = Instant::now();
                    let handed = rb.consume_raw();
                    let elapsed = start.elapsed();
                    assert_eq!(handed as u64, records);
                    elapsed
                }
            };
            assert_eq!(seen.count.get(), records, "{which:?} record count");
            assert_eq!(seen.seq_sum.get(), want_sum, "{which:?} sequence numbers");
            records as f64 / elapsed.as_secs_f64()
        })
        .join()
        .expect("consumer thread")
    })
}

/// Drains full rings of `ring_size` bytes with each consumer, `rounds`
/// times alternately after a warm-up round each. Returns the records per
/// round, the median records/s of memtrail's consumer and libbpf's, and
/// the median of the rounds' ratios (each round's two drains back to back,
/// so the machine's drifts, large on this VM, cancel).
fn drain_compare(
    ring_size: u32,
    rounds: usize,
    cores: (core_affinity::CoreId, core_affinity::CoreId),
) -> (u64, f64, f64, f64) {
    // One object per consumer: the consumers never share a ring.
    let mut obj_m = MaybeUninit::uninit();
    let mut obj_l = MaybeUninit::uninit();
    let rt_m = RingTest::load(&mut obj_m, ring_size);
    let rt_l = RingTest::load(&mut obj_l, ring_size);
    let records = capacity(ring_size, RECORD_SIZE);
    drain_round(&rt_m, Consumer::Memtrail, 0, records, cores);
    drain_round(&rt_l, Consumer::Libbpf, 0, records, cores);
    let (mut m, mut l) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let seq = (round as u64 + 1) * records;
        m.push(drain_round(&rt_m, Consumer::Memtrail, seq, records, cores));
        l.push(drain_round(&rt_l, Consumer::Libbpf, seq, records, cores));
    }
    let ratios = m.iter().zip(&l).map(|(m, l)| m / l).collect();
    (records, median(m), median(l), median(ratios))
}

/// One streaming run: a producer thread makes `records` records in batches
/// while the consumer busy-polls on the other core. Returns records/s and
/// the records the producer dropped on a full ring.
fn stream_run(
    rt: &RingTest<'_>,
    which: Consumer,
    records: u64,
    cores: (core_affinity::CoreId, core_affinity::CoreId),
) -> (f64, u64) {
    let submitted = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let start_line = Barrier::new(2);
    let drops_before = rt.drops();
    let elapsed = thread::scope(|s| {
        s.spawn(|| {
            pin(cores.0);
            start_line.wait();
            let mut seq = 0;
            let mut made = 0;
            while made < records {
                let n = (records - made).min(u64::from(STREAM_BATCH)) as u32;
                let out = rt.produce(Run::new(seq, black_box(n), RECORD_SIZE));
                seq += u64::from(n);
                made += u64::from(out.submitted);
                submitted.fetch_add(u64::from(out.submitted), Ordering::Relaxed);
            }
            // Release: pairs with the consumer's Acquire load of `done`, so
            // it then sees the final `submitted`.
            done.store(true, Ordering::Release);
        });
        s.spawn(|| {
            pin(cores.1);
            let seen = Seen::default();
            let finished = || {
                done.load(Ordering::Acquire)
                    && seen.count.get() == submitted.load(Ordering::Relaxed)
            };
            let start = match which {
                Consumer::Memtrail => {
                    let mut ring = rt.consumer();
                    start_line.wait();
                    let start = Instant::now();
                    while !finished() {
                        ring.poll(|body| seen.on_record(body));
                    }
                    start
                }
                Consumer::Libbpf => {
                    let rb = libbpf_ring(rt, |body| seen.on_record(body));
                    start_line.wait();
                    let start = Instant::now();
                    while !finished() {
                        assert!(rb.consume_raw() >= 0, "ring_buffer__consume failed");
                    }
                    start
                }
            };
            let elapsed = start.elapsed();
            assert_eq!(seen.count.get(), records, "{which:?} record count");
            elapsed
        })
        .join()
        .expect("consumer thread")
    });
    (
        records as f64 / elapsed.as_secs_f64(),
        rt.drops() - drops_before,
    )
}

/// How a latency or idle run waits for records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Poller {
    /// memtrail's consumer, waiting with `IdleWait::new(nap)`; records are
    /// submitted with `BPF_RB_NO_WAKEUP`, as memtrail's probes do.
    Memtrail(Duration),
    /// libbpf-rs's `RingBuffer::poll` (epoll); records are submitted with
    /// the kernel's adaptive wakeups. A reference point, not memtrail's
    /// design.
    LibbpfEpoll,
    /// memtrail's consumer as the capture runs it: this many naps, then
    /// deep sleep on the ring's epoll with its `sleeping` flag raised;
    /// records are submitted with a wakeup only while the flag is set.
    MemtrailDeep(u32),
    /// memtrail's consumer polling without ever sleeping: a whole core. A
    /// reference for what the host itself adds (a vCPU that never halts
    /// still loses the CPU to the host's other work).
    Spin,
}

impl Poller {
    fn submit_flags(self) -> u32 {
        match self {
            Self::Memtrail(_) | Self::Spin => ringtest::NO_WAKEUP,
            Self::LibbpfEpoll => 0,
            Self::MemtrailDeep(_) => ringtest::AUTO_WAKEUP,
        }
    }

    fn name(self) -> String {
        match self {
            Self::Memtrail(nap) => format!("memtrail, IdleWait nap {} µs only", nap.as_micros()),
            Self::LibbpfEpoll => "libbpf-rs RingBuffer::poll (epoll, wakeups on)".to_owned(),
            Self::Spin => "memtrail, busy spin, never sleeps (reference)".to_owned(),
            Self::MemtrailDeep(naps) => format!(
                "memtrail, {naps} naps of {} µs then deep sleep{}",
                DEFAULT_NAP.as_micros(),
                if naps == NAPS_BEFORE_DEEP_SLEEP {
                    " (capture default)"
                } else {
                    ""
                }
            ),
        }
    }
}

/// What a poller cost while it ran.
struct Cost {
    /// Thread CPU time, from the first poll on (setup excluded).
    cpu: Duration,
    /// Wall time over the same span.
    wall: Duration,
    /// Waits: polls that found nothing (memtrail), or epoll waits (libbpf).
    waits: u64,
}

/// Consumes `rt`'s ring the way `poller` does until `stop`, on the calling
/// thread.
fn run_poller(
    rt: &RingTest<'_>,
    poller: Poller,
    stop: &AtomicBool,
    mut f: impl FnMut(&[u8]),
) -> Cost {
    let mut waits = 0;
    match poller {
        Poller::Memtrail(nap) => {
            let mut ring = rt.consumer();
            let mut idle = IdleWait::new(nap);
            let (cpu_start, start) = (thread_cpu_ns(), Instant::now());
            while !stop.load(Ordering::Relaxed) {
                if ring.poll(&mut f) == 0 {
                    waits += 1;
                    idle.idle();
                } else {
                    idle.reset();
                }
            }
            Cost {
                cpu: Duration::from_nanos(thread_cpu_ns() - cpu_start),
                wall: start.elapsed(),
                waits,
            }
        }
        Poller::MemtrailDeep(naps) => {
            let mut ring = rt.consumer();
            let kick = memtrail::internals::sys::eventfd().expect("eventfd");
            let flag = rt.sleeping_flag();
            let deep = DeepSleep::new(flag, &[rt.ring_fd()], kick.as_fd()).expect("deep sleep");
            let mut idle = IdleWait::default()
                .with_deep_sleep(deep)
                .naps_before_deep_sleep(naps);
            let (cpu_start, start) = (thread_cpu_ns(), Instant::now());
            // As the capture's pollers do (src/engine), paced while busy.
            let mut consumed = 0;
            while !stop.load(Ordering::Relaxed) {
                idle.pace(consumed, ring.size() as u64, || false);
                let before = ring.position();
                if ring.poll(&mut f) == 0 {
                    waits += 1;
                    idle.idle_until(|| ring.pending() == 0 && !stop.load(Ordering::Relaxed));
                } else {
                    idle.reset();
                }
                consumed = ring.position() - before;
            }
            Cost {
                cpu: Duration::from_nanos(thread_cpu_ns() - cpu_start),
                wall: start.elapsed(),
                waits,
            }
        }
        Poller::Spin => {
            let mut ring = rt.consumer();
            let (cpu_start, start) = (thread_cpu_ns(), Instant::now());
            while !stop.load(Ordering::Relaxed) {
                if ring.poll(&mut f) == 0 {
                    waits += 1;
                    std::hint::spin_loop();
                }
            }
            Cost {
                cpu: Duration::from_nanos(thread_cpu_ns() - cpu_start),
                wall: start.elapsed(),
                waits,
            }
        }
        Poller::LibbpfEpoll => {
            let rb = libbpf_ring(rt, f);
            let (cpu_start, start) = (thread_cpu_ns(), Instant::now());
            while !stop.load(Ordering::Relaxed) {
                waits += 1;
                rb.poll(Duration::from_millis(10))
                    .expect("ring_buffer__poll");
            }
            Cost {
                cpu: Duration::from_nanos(thread_cpu_ns() - cpu_start),
                wall: start.elapsed(),
                waits,
            }
        }
    }
}

struct Latency {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

/// Delivery latency at a low rate: one record every 1-5 ms, from the BPF
/// timestamp to the callback.
fn latency_run(
    rt: &RingTest<'_>,
    poller: Poller,
    records: u32,
    cores: (core_affinity::CoreId, core_affinity::CoreId),
) -> Vec<u64> {
    let stop = AtomicBool::new(false);
    let received = AtomicU64::new(0);
    let lat = thread::scope(|s| {
        let consumer = s.spawn(|| {
            pin(cores.1);
            let mut lat = Vec::with_capacity(records as usize);
            let _cost = run_poller(rt, poller, &stop, |body| {
                let now = monotonic_ns();
                let hdr = header(body);
                assert_eq!(hdr.seq, lat.len() as u64, "records out of order");
                lat.push(now.saturating_sub(hdr.ts_ns));
                received.store(lat.len() as u64, Ordering::Relaxed);
            });
            lat
        });
        pin(cores.0);
        for i in 0..records {
            // 1, 3, 5, 2, 4 ms, ...: the poller is asleep when records come.
            let gap = Duration::from_millis(1 + u64::from(i * 2 % 5));
            thread::sleep(gap);
            let run = Run {
                flags: poller.submit_flags(),
                ..Run::new(u64::from(i), 1, RECORD_SIZE)
            };
            assert_eq!(rt.produce(run).submitted, 1);
        }
        // Every record is in the ring once produce returned; let the
        // poller hand out the last before stopping it.
        while received.load(Ordering::Relaxed) < u64::from(records) {
            thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        consumer.join().expect("poller thread")
    });
    assert_eq!(lat.len(), records as usize, "latency record count");
    lat
}

/// Quantiles of latencies in ns.
fn latency_of(mut lat: Vec<u64>) -> Latency {
    lat.sort_unstable();
    let at = |q: f64| Duration::from_nanos(lat[((lat.len() - 1) as f64 * q) as usize]);
    Latency {
        p50: at(0.50),
        p99: at(0.99),
        max: at(1.0),
    }
}

/// A poller with nothing to read: its CPU use in percent of one core, and
/// CPU time per wait.
fn idle_run(
    rt: &RingTest<'_>,
    poller: Poller,
    wall: Duration,
    core: core_affinity::CoreId,
) -> (f64, Duration) {
    let stop = AtomicBool::new(false);
    let cost = thread::scope(|s| {
        let consumer = s.spawn(|| {
            pin(core);
            run_poller(rt, poller, &stop, |_| panic!("record in the idle run"))
        });
        thread::sleep(wall);
        stop.store(true, Ordering::Relaxed);
        consumer.join().expect("poller thread")
    });
    (
        100.0 * cost.cpu.as_secs_f64() / cost.wall.as_secs_f64(),
        cost.cpu / cost.waits.max(1) as u32,
    )
}

/// Steal time of each CPU so far, in clock ticks (/proc/stat: the time a
/// vCPU was ready but the host ran something else).
fn steal_ticks() -> Vec<(String, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let cpu = fields.next()?.to_owned();
            // user nice system idle iowait irq softirq steal
            let steal = fields.nth(7)?.parse().ok()?;
            Some((cpu, steal))
        })
        .collect()
}

/// Each CPU's steal time since `before`, in percent of `wall`.
fn steal_pct(before: &[(String, u64)], wall: Duration) -> Vec<(String, f64)> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    steal_ticks()
        .into_iter()
        .filter_map(|(cpu, now)| {
            let (_, then) = before.iter().find(|(c, _)| *c == cpu)?;
            let secs = (now - then) as f64 / hz;
            Some((cpu, 100.0 * secs / wall.as_secs_f64()))
        })
        .collect()
}

/// The 1-minute load average: the benchmark shares the machine.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

fn main() -> io::Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let scale = if full { FULL } else { SMOKE };
    let cores = cores();
    let mut out = io::stdout().lock();
    let load_before = loadavg();

    writeln!(out, "## Ring consumer")?;
    writeln!(
        out,
        "records: {RECORD_SIZE} B bodies ({} B in the ring)",
        ringtest::slot_len(RECORD_SIZE),
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| throughput | memtrail RingConsumer | libbpf-rs RingBuffer | ratio |"
    )?;
    writeln!(out, "|---|---:|---:|---:|")?;
    let mut ratios = Vec::new();
    for &(ring_size, rounds) in scale.drains {
        let (records, m, l, ratio) = drain_compare(ring_size, rounds, cores);
        writeln!(
            out,
            "| drain, {} MiB ring ({records} records), median of {rounds} | {:.1} M/s | {:.1} M/s | {:.2}x |",
            ring_size >> 20,
            m / 1e6,
            l / 1e6,
            ratio
        )?;
        ratios.push(ratio);
    }

    // One object per consumer: the consumers never share a ring.
    let mut obj_m = MaybeUninit::uninit();
    let mut obj_l = MaybeUninit::uninit();
    let rt_m = RingTest::load(&mut obj_m, BIG_RING);
    let rt_l = RingTest::load(&mut obj_l, BIG_RING);
    let (stream_m, drops_m) = stream_run(&rt_m, Consumer::Memtrail, scale.stream_records, cores);
    let (stream_l, drops_l) = stream_run(&rt_l, Consumer::Libbpf, scale.stream_records, cores);
    drop((rt_m, rt_l));
    writeln!(
        out,
        "| streaming, {} MiB ring, {} records (drops: {drops_m} / {drops_l}) | {:.1} M/s | {:.1} M/s | {:.2}x |",
        BIG_RING >> 20,
        scale.stream_records,
        stream_m / 1e6,
        stream_l / 1e6,
        stream_m / stream_l
    )?;
    // Streaming is bound by the producer (one core of BPF_PROG_TEST_RUN),
    // not by either consumer: reported, not held to the target.

    let mut obj = MaybeUninit::uninit();
    let rt = RingTest::load(&mut obj, SMALL_RING);
    writeln!(out)?;
    writeln!(
        out,
        "| poller ({} records 1-5 ms apart, {LATENCY_SLICES} turns; idle {:.1} s) | latency p50 | p99 | max | idle CPU | CPU per wait |",
        scale.latency_records,
        scale.idle_time.as_secs_f64()
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|")?;
    // The pollers take turns, a slice of the records each, so that the
    // host's bursts of vCPU wake-up delay hit them alike.
    let mut lats = vec![Vec::new(); scale.pollers.len()];
    let slice = scale.latency_records / LATENCY_SLICES;
    let (steal_before, latency_start) = (steal_ticks(), Instant::now());
    for _ in 0..LATENCY_SLICES {
        for (i, &poller) in scale.pollers.iter().enumerate() {
            lats[i].extend(latency_run(&rt, poller, slice, cores));
        }
    }
    let steal = steal_pct(&steal_before, latency_start.elapsed());
    let mut default = None;
    for (&poller, lat) in scale.pollers.iter().zip(lats) {
        let lat = latency_of(lat);
        let (idle_pct, per_wait) = idle_run(&rt, poller, scale.idle_time, cores.1);
        writeln!(
            out,
            "| {} | {:.0} µs | {:.0} µs | {:.0} µs | {idle_pct:.2} % | {:.1} µs |",
            poller.name(),
            lat.p50.as_secs_f64() * 1e6,
            lat.p99.as_secs_f64() * 1e6,
            lat.max.as_secs_f64() * 1e6,
            per_wait.as_secs_f64() * 1e6,
        )?;
        if poller == Poller::MemtrailDeep(NAPS_BEFORE_DEEP_SLEEP) {
            default = Some((lat, idle_pct));
        }
    }
    let (lat, idle_pct) = default.expect("the default poller was measured");
    writeln!(out)?;
    writeln!(
        out,
        "host steal time during the latency turns (the host ran other work on the vCPU): {}",
        steal
            .iter()
            .map(|(cpu, pct)| format!("{cpu} {pct:.1} %"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(
        out,
        "load average (1 min): {load_before} before, {} after",
        loadavg()
    )?;

    if full {
        writeln!(out)?;
        writeln!(
            out,
            "targets: ratio >= {TARGET_RATIO}x {} (drains from memory, from cache); \
             default poller: p99 <= {} ms {}; idle CPU <= {TARGET_IDLE_CPU_PCT} % {}",
            ratios
                .iter()
                .map(|&r| verdict(r >= TARGET_RATIO))
                .collect::<Vec<_>>()
                .join("/"),
            TARGET_P99.as_millis(),
            verdict(lat.p99 <= TARGET_P99),
            verdict(idle_pct <= TARGET_IDLE_CPU_PCT),
        )?;
    } else {
        writeln!(
            out,
            "(smoke run: `cargo bench --bench ring_bench` measures)"
        )?;
    }
    Ok(())
}

//! A symbolizer on a thread of its own, started with the capture.
//!
//! Most of a short capture's symbolization is loading files, not resolving
//! addresses: libc's detached DWARF (decompressed, its units indexed) took
//! ~100 ms of every `memtrail run`, at the end, while the user waited. The
//! files every capture symbolizes (libc, the command's executable) are
//! loaded here while the kernel verifies the BPF programs and the command
//! runs; the capture's stacks are then symbolized by the same symbolizer,
//! which keeps what it loaded. (blazesym's symbolizer cannot move between
//! threads: the work comes to it.)

use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use crate::sys::{self, Pid};

use super::{AddressSpaces, Places, StackSymbolizer};

/// Return addresses to symbolize: of each process, its pid and its
/// stacks' addresses (repeats are symbolized once).
pub type Request = Vec<(u32, Vec<u64>)>;

/// For each process of the request, in order, its addresses' frames.
pub type Reply = Vec<Places>;

type Job = (AddressSpaces, Request, mpsc::Sender<Reply>);

/// The symbolizing thread; joined when dropped.
pub struct Background {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    niceness: Arc<Mutex<Niceness>>,
}

/// Whether the thread still loads ahead at nice 19.
#[derive(Default)]
struct Niceness {
    /// Its work is waited for: it must not lower its priority any more.
    hurried: bool,
    /// Its id while it runs at nice 19.
    niced: Option<Pid>,
}

impl Niceness {
    /// Puts the niced thread back at the default priority.
    fn restore(&mut self) {
        if let Some(tid) = self.niced.take()
            && let Err(err) = sys::set_thread_nice(tid, 0)
        {
            tracing::debug!(%err, "symbolizing thread: nice not reset");
        }
    }
}

impl Background {
    /// No thread: [`symbolize`](Self::symbolize) works in place. For a
    /// session tracking its own process, whose threads' allocations count
    /// unless they are the session's known few.
    pub fn in_place() -> Self {
        Self {
            jobs: None,
            thread: None,
            niceness: Default::default(),
        }
    }

    /// Starts the thread, which first loads `warm` (files missing or
    /// unreadable are skipped) on the CPUs it is started on, then works on
    /// every CPU `cpus` had (sys::StartupCpus).
    pub fn start(warm: Vec<PathBuf>, cpus: Option<sys::StartupCpus>) -> Self {
        let (jobs, rx) = mpsc::channel::<Job>();
        let niceness = Arc::new(Mutex::new(Niceness::default()));
        let shared = niceness.clone();
        let thread = std::thread::Builder::new()
            .name("memtrail-symbols".into())
            .spawn(move || {
                // The signals memtrail passes on to the command are the
                // main thread's to take.
                if let Err(err) = crate::sys::signals::block_forwarded() {
                    tracing::debug!(%err, "symbolizing thread: signals not blocked");
                }
                // Loading ahead runs behind the verifier, the up-front
                // thread and the command; whoever needs the thread's work
                // raises it back (`hurry`).
                {
                    let mut nice = shared.lock().unwrap_or_else(|e| e.into_inner());
                    if !nice.hurried {
                        let tid = sys::gettid();
                        match sys::set_thread_nice(tid, 19) {
                            Ok(()) => nice.niced = Some(tid),
                            Err(err) => tracing::debug!(%err, "symbolizing thread: nice not set"),
                        }
                    }
                }
                let symbolizer = StackSymbolizer::new();
                for path in &warm {
                    let started = std::time::Instant::now();
                    symbolizer.warm(path);
                    tracing::debug!(
                        path = %path.display(),
                        ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1e3),
                        "symbolizer loaded a file ahead"
                    );
                }
                shared.lock().unwrap_or_else(|e| e.into_inner()).restore();
                if let Some(cpus) = cpus {
                    cpus.restore_here();
                }
                for (spaces, request, reply) in rx {
                    let _ = reply.send(symbolize(&symbolizer, &spaces, request));
                }
            })
            .inspect_err(|err| tracing::debug!(%err, "no symbolizing thread: symbolizing in place"))
            .ok();
        Self {
            jobs: thread.is_some().then_some(jobs),
            thread,
            niceness,
        }
    }

    /// Puts the thread back at the default priority for good: its work is
    /// now waited for (at nice 19 on a busy machine it could wait long).
    fn hurry(&self) {
        let mut nice = self.niceness.lock().unwrap_or_else(|e| e.into_inner());
        nice.hurried = true;
        nice.restore();
    }

    /// Symbolizes `request` in `spaces` on the thread (in place, with a
    /// new symbolizer, if it is not running).
    pub fn symbolize(&self, spaces: AddressSpaces, request: Request) -> Reply {
        self.hurry();
        let (tx, rx) = mpsc::channel();
        let Some(jobs) = &self.jobs else {
            return symbolize(&StackSymbolizer::new(), &spaces, request);
        };
        match jobs.send((spaces, request, tx)) {
            Ok(()) => rx.recv().unwrap_or_else(|_| {
                // The thread panicked: its panic goes on at the join.
                Vec::new()
            }),
            Err(mpsc::SendError((spaces, request, _))) => {
                symbolize(&StackSymbolizer::new(), &spaces, request)
            }
        }
    }
}

fn symbolize(symbolizer: &StackSymbolizer, spaces: &AddressSpaces, request: Request) -> Reply {
    request
        .into_iter()
        .map(|(pid, ips)| symbolizer.places(spaces, pid, &ips))
        .collect()
}

impl Drop for Background {
    fn drop(&mut self) {
        self.hurry();
        self.jobs.take();
        if let Some(thread) = self.thread.take()
            && let Err(panic) = thread.join()
            && !std::thread::panicking()
        {
            std::panic::resume_unwind(panic);
        }
    }
}

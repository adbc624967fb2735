//! The status line `memtrail run --status` draws on the terminal.

use std::time::{Duration, Instant};

use crate::engine::live::LiveCounters;
use crate::profile::human_bytes;
use std::io::{self, Write};
use std::sync::atomic::Ordering::Relaxed;

/// How often the status line is redrawn.
pub const STATUS_EVERY: Duration = Duration::from_millis(250);

/// Draws the status line from `counters`, each line over the last
/// (carriage return, erase to the end of the line).
pub struct StatusLine {
    began: Instant,
    last: (Instant, u64),
}

impl StatusLine {
    pub fn new() -> Self {
        let now = Instant::now();
        Self {
            began: now,
            last: (now, 0),
        }
    }

    /// Writes one refresh of the line.
    pub fn draw(&mut self, counters: &LiveCounters, w: &mut impl Write) -> io::Result<()> {
        let now = Instant::now();
        let events = counters.events.load(Relaxed);
        let (then, before) = self.last;
        let secs = (now - then).as_secs_f64();
        let rate = if secs > 0.0 {
            events.saturating_sub(before) as f64 / secs
        } else {
            0.0
        };
        self.last = (now, events);
        let pauses = counters.pauses.load(Relaxed);
        let elapsed = (now - self.began).as_secs_f64();
        let processes = counters.processes.load(Relaxed);
        if processes == 0 {
            write!(w, "\r\x1b[Kmemtrail: {elapsed:.1} s, starting")?;
            return w.flush();
        }
        write!(
            w,
            "\r\x1b[Kmemtrail: {elapsed:.1} s, {processes} process{}, {} events/s, live {}, peak {}{}",
            if processes == 1 { "" } else { "es" },
            human_rate(rate),
            human_bytes(counters.live_bytes.load(Relaxed)),
            human_bytes(counters.peak_bytes.load(Relaxed)),
            match pauses {
                0 => String::new(),
                1 => ", 1 pause".to_owned(),
                n => format!(", {n} pauses"),
            }
        )?;
        w.flush()
    }

    /// Erases the line (before the summary is written).
    pub fn clear(w: &mut impl Write) -> io::Result<()> {
        w.write_all(b"\r\x1b[K")?;
        w.flush()
    }
}

impl Default for StatusLine {
    fn default() -> Self {
        Self::new()
    }
}

fn human_rate(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.1}M", rate / 1e6)
    } else if rate >= 1e3 {
        format!("{:.1}k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

/// Runs `capture` with a live status line on stderr (elapsed time,
/// processes, events/s, live heap, peak, pauses; redrawn every
/// [`STATUS_EVERY`]) when stderr is a
/// terminal and the run is not quiet; the line is erased before `capture`'s
/// result is returned, so the summary starts on a clean line.
pub fn with_status<T>(
    quiet: bool,
    capture: impl FnOnce(Option<std::sync::Arc<LiveCounters>>) -> T,
) -> T {
    use std::io::IsTerminal;
    use std::sync::mpsc::{RecvTimeoutError, channel};
    if quiet || !std::io::stderr().is_terminal() {
        return capture(None);
    }
    let live = std::sync::Arc::new(LiveCounters::default());
    let (done, finished) = channel::<()>();
    std::thread::scope(|scope| {
        let counters = live.clone();
        scope.spawn(move || {
            let mut line = StatusLine::new();
            let mut err = std::io::stderr();
            // Drawn at once (start-up takes a while: the verifier), then
            // every STATUS_EVERY until the capture ends.
            let _ = line.draw(&counters, &mut err);
            while finished.recv_timeout(STATUS_EVERY) == Err(RecvTimeoutError::Timeout) {
                let _ = line.draw(&counters, &mut err);
            }
            let _ = StatusLine::clear(&mut err);
        });
        let out = capture(Some(live));
        drop(done);
        out
    })
}

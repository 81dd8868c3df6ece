//! A stop asked for by a signal: Ctrl-C (SIGINT), SIGTERM (`kill`, a CI runner's timeout) or
//! SIGHUP (the terminal went away).
//!
//! A command that runs many runs ([`wind_down`]) takes the first signal as "finish up": it
//! starts no new run, lets the runs in flight end (a simulated run takes milliseconds; a live
//! run stops at once, its processes killed, and is no verdict), writes what it has (its report,
//! `--json` lines, JUnit, `--out` files), each saying it was interrupted, and exits with the
//! signal's status (128 + its number: 130, 143, 129), as a program the signal ended would. A
//! second signal ends the process at once. Without such a command (the library in a test, a
//! `rig live` of a user's own program), the first signal ends the process at once; either way
//! every harness process the rig started is killed first.
//!
//! The signals are watched by tokio's (already the rig's runtime; registered through
//! `signal-hook-registry`, so the handler itself only records the signal) on a thread of their
//! own, which nothing else can keep busy.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Once, OnceLock};

/// What must be done before a signal ends the process at once: live mode kills every harness
/// process it started (registered by live mode, which builds on this module, not under it).
static BEFORE_EXIT: OnceLock<fn()> = OnceLock::new();

/// Has `cleanup` run before a signal ends the process at once (the first registration stands).
pub fn before_exit(cleanup: fn()) {
    let _ = BEFORE_EXIT.set(cleanup);
}

/// The signal that asked the command to wind down (its number), or 0.
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// Whether the running command winds down on a first signal.
static WINDS_DOWN: AtomicBool = AtomicBool::new(false);

/// A signal that stopped a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal(i32);

impl Signal {
    pub const INTERRUPT: Signal = Signal(libc::SIGINT);
    pub const TERMINATE: Signal = Signal(libc::SIGTERM);
    pub const HANG_UP: Signal = Signal(libc::SIGHUP);

    /// `SIGINT`, `SIGTERM`, `SIGHUP`.
    pub fn name(self) -> &'static str {
        match self.0 {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            _ => "a signal",
        }
    }

    /// Its number, to pass it on to a child process.
    pub fn number(self) -> i32 {
        self.0
    }

    /// The exit status of a program this signal ended: 128 + its number.
    pub fn exit_status(self) -> u8 {
        u8::try_from(128 + self.0).unwrap_or(u8::MAX)
    }
}

/// The signal that asked the command to stop, if one did.
pub fn received() -> Option<Signal> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        number => Some(Signal(number)),
    }
}

/// Whether a signal asked the command to stop: start nothing new.
pub fn requested() -> bool {
    RECEIVED.load(Ordering::Relaxed) != 0
}

/// The running command winds down on a first signal instead of ending at once (see the module).
pub fn wind_down() {
    WINDS_DOWN.store(true, Ordering::SeqCst);
    watch();
}

/// Starts watching for the signals, once per process; returns when the handlers are in place.
pub fn watch() {
    static WATCH: Once = Once::new();
    WATCH.call_once(|| {
        let (watching_now, watching) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("rig-signals".into()).spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_io().build() else { return };
            runtime.block_on(watch_signals(watching_now));
        });
        match thread {
            // Disconnected once the handlers are registered (or the thread gave up).
            Ok(_) => drop(watching.recv()),
            Err(error) => tracing::warn!("the rig cannot watch for Ctrl-C: {error}"),
        }
    });
}

async fn watch_signals(watching_now: std::sync::mpsc::Sender<()>) {
    use tokio::signal::unix::{signal, SignalKind};
    let kinds = [
        (SignalKind::interrupt(), Signal::INTERRUPT),
        (SignalKind::terminate(), Signal::TERMINATE),
        (SignalKind::hangup(), Signal::HANG_UP),
    ];
    let mut streams = Vec::new();
    for (kind, signal_of) in kinds {
        match signal(kind) {
            Ok(stream) => streams.push((stream, signal_of)),
            Err(error) => tracing::warn!("the rig cannot watch {}: {error}", signal_of.name()),
        }
    }
    drop(watching_now);
    if streams.is_empty() {
        return;
    }
    loop {
        let received = futures_util::future::select_all(
            streams
                .iter_mut()
                .map(|(stream, signal_of)| Box::pin(async move { stream.recv().await.map(|_| *signal_of) })),
        );
        let (signal_of, _, _) = received.await;
        let signal_of = signal_of.unwrap_or(Signal::TERMINATE);
        let first = RECEIVED.compare_exchange(0, signal_of.0, Ordering::SeqCst, Ordering::SeqCst).is_ok();
        if first && WINDS_DOWN.load(Ordering::SeqCst) {
            eprintln!(
                "rig: {}: starting no new run; finishing the runs in flight and writing what is done (send it again \
                 to stop at once)",
                signal_of.name()
            );
            continue;
        }
        if let Some(cleanup) = BEFORE_EXIT.get() {
            cleanup();
        }
        eprintln!("rig: stopped by {}; every harness process it started was killed", signal_of.name());
        std::process::exit(i32::from(signal_of.exit_status()));
    }
}

use std::future::{poll_fn, Future};
use std::mem;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};

use rand::rngs::SmallRng;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio::task::LocalSet;
use tokio::time::{sleep, Duration, Instant};

use super::Result;

// To support re-creation, we need to store a factory of the future that
// represents the software. This is somewhat annoying in that it requires
// boxxing to avoid generics.
type Software<'a> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result>>> + 'a>;

/// Runtime kinds.
pub enum Kind<'a> {
    /// A runtime for executing test code.
    Client,

    /// A runtime that is running simulated host software.
    Host { software: Software<'a> },
    // Rig patch: upstream's `NoSoftware`, a runtime the network topology
    // read its clock from, is gone (the topology keeps its clock itself).
}

/// Runtime configuration.
#[derive(Clone, Default)]
pub struct Config {
    /// Whether io is enabled on the runtime.
    pub enable_io: bool,

    /// Rng used to seed the tokio runtime.
    ///
    /// Only used if the `tokio_unstable` cfg flag is set.
    #[cfg_attr(not(tokio_unstable), expect(dead_code))]
    pub rng: Option<SmallRng>,
}

/// Per host simulated runtime.
///
/// The tokio runtime is paused (see [`Builder::start_paused`]), which gives us
/// control over when and how to advance time. In particular, see [`Rt::tick`],
/// which lets the runtime do a bit more work.
pub struct Rt<'a> {
    pub kind: Kind<'a>,

    /// Handle to the Tokio runtime driving this simulated host. Each runtime
    /// may have a different sense of "now" which simulates clock skew.
    tokio: Runtime,

    /// Local task set used for running !Send tasks.
    local: LocalSet,

    /// A user readable name to identify the node.
    pub nodename: Arc<str>,

    /// Optional handle to a host's software. When software finishes, the handle is
    /// consumed to check for error, which is propagated up to fail the simulation.
    handle: Option<JoinHandle<Result>>,

    /// Runtime configuration.
    config: Config,

    /// Whether the software promises to keep no tokio timers and to spawn no
    /// task on the runtime itself, so that a tick in which none of its local
    /// tasks was woken would do nothing and may be skipped (rig patch).
    skip_idle: bool,

    /// Set while the host's process is stopped from outside (rig patch): its
    /// software is not ticked at all, as if the process were suspended.
    frozen: bool,

    /// Set when a local task is woken and not yet run (rig patch).
    pending: Arc<AtomicBool>,

    /// Ticks skipped since the last one that ran, added to the next tick so
    /// the runtime's clock keeps up with the simulation (rig patch).
    lag: Duration,

    /// Steps skipped and not yet added to `lag` (rig patch): a skipped step
    /// only counts, and the next tick adds them all at once (the same sum).
    /// Counted in a `u64`, which no simulation overflows, and turned into the
    /// `u32` a `Duration` is multiplied by where it is used ([`steps`]).
    skipped: u64,

    /// Steps skipped and not yet added to the host's timer (rig patch), which
    /// the simulation adds before anything can read it ([`Rt::take_unsettled`]).
    unsettled: u64,

    /// The current runtime's metrics, for its count of tasks (rig patch).
    metrics: tokio::runtime::RuntimeMetrics,

    /// The noting waker and the `block_on` waker it wraps (rig patch): a
    /// runtime's `block_on` waker is the same on every tick, so the noting
    /// waker is made once per runtime rather than once per tick.
    noting: Option<(Waker, Waker)>,

    /// The runtime's paused clock as last read (rig patch), kept until the
    /// clock can have moved: a paused clock only moves when the scheduler
    /// parks with a timer to wait for, which only a tick that sleeps does (a
    /// timerless tick parks with a zero limit, which advances it by zero).
    /// Reading it enters the runtime's context, on every tick of every host.
    clock: Option<Instant>,
}

/// The waker the host's [`LocalSet`] is polled with: it notes that one of
/// the host's tasks was scheduled before passing the wake on (rig patch).
struct NoteWake {
    pending: Arc<AtomicBool>,
    inner: Waker,
}

impl NoteWake {
    /// The noting waker around `inner`, made when `inner` is not the waker it
    /// was last made around, and kept in `cache`.
    fn around(cache: &mut Option<(Waker, Waker)>, pending: &Arc<AtomicBool>, inner: &Waker) -> Waker {
        match cache {
            Some((wrapped, waker)) if wrapped.will_wake(inner) => waker.clone(),
            _ => {
                let waker = Waker::from(Arc::new(NoteWake { pending: Arc::clone(pending), inner: inner.clone() }));
                *cache = Some((inner.clone(), waker.clone()));
                waker
            }
        }
    }
}

impl Wake for NoteWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.pending.store(true, Ordering::Relaxed);
        self.inner.wake_by_ref();
    }
}

impl<'a> Rt<'a> {
    pub(crate) fn client<F>(nodename: Arc<str>, client: F, mut config: Config) -> Self
    where
        F: Future<Output = Result> + 'static,
    {
        let (tokio, local) = init(&mut config);
        let metrics = tokio.metrics();

        let handle = with(&tokio, &local, || tokio::task::spawn_local(client));

        Self {
            kind: Kind::Client,
            tokio,
            local,
            nodename,
            handle: Some(handle),
            config,
            skip_idle: false,
            frozen: false,
            pending: Arc::new(AtomicBool::new(true)),
            lag: Duration::ZERO,
            skipped: 0,
            unsettled: 0,
            metrics,
            noting: None,
            clock: None,
        }
    }

    pub(crate) fn host<F, Fut>(nodename: Arc<str>, software: F, mut config: Config) -> Self
    where
        F: Fn() -> Fut + 'a,
        Fut: Future<Output = Result> + 'static,
    {
        let (tokio, local) = init(&mut config);
        let metrics = tokio.metrics();

        let software: Software = Box::new(move || Box::pin(software()));
        let handle = with(&tokio, &local, || tokio::task::spawn_local(software()));

        Self {
            kind: Kind::Host { software },
            tokio,
            local,
            nodename,
            handle: Some(handle),
            config,
            skip_idle: false,
            frozen: false,
            pending: Arc::new(AtomicBool::new(true)),
            lag: Duration::ZERO,
            skipped: 0,
            unsettled: 0,
            metrics,
            noting: None,
            clock: None,
        }
    }

    /// Lets ticks with nothing to do be skipped; see [`Rt::is_idle`] (rig patch).
    pub(crate) fn set_skip_idle(&mut self, skip_idle: bool) {
        self.skip_idle = skip_idle;
    }

    /// Stops or resumes ticking the host's software (rig patch); see
    /// [`crate::Sim::freeze`].
    pub(crate) fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Whether ticking now would do nothing: the software opted in, none of
    /// its local tasks is scheduled, and no task lives on the runtime itself
    /// (rig patch).
    pub(crate) fn is_idle(&self) -> bool {
        self.skip_idle && !self.pending.load(Ordering::Relaxed) && self.no_runtime_tasks()
    }

    /// Whether no task lives on the runtime itself, only in the local set
    /// (rig patch). `Runtime::metrics` clones a handle; this is read for
    /// every host on every step.
    fn no_runtime_tasks(&self) -> bool {
        self.metrics.num_alive_tasks() == 0
    }

    /// Accounts for a tick that [`Rt::is_idle`] allowed to skip (rig patch):
    /// counted only, since most hosts skip most steps; the runtime's lag takes
    /// the skipped ticks on its next tick and the host's timer when the
    /// simulation settles it ([`Rt::take_unsettled`]).
    pub(crate) fn skip(&mut self) {
        // Most hosts skip most steps: two plain additions (see `skipped`).
        self.skipped += 1;
        self.unsettled += 1;
    }

    /// How many skipped ticks the host's timer has not been given yet, now
    /// given (rig patch).
    pub(crate) fn take_unsettled(&mut self) -> u32 {
        steps(mem::take(&mut self.unsettled))
    }

    pub(crate) fn is_client(&self) -> bool {
        matches!(self.kind, Kind::Client)
    }

    fn is_host(&self) -> bool {
        matches!(self.kind, Kind::Host { .. })
    }

    pub(crate) fn is_software_running(&self) -> bool {
        self.handle.is_some()
    }

    pub(crate) fn now(&mut self) -> Instant {
        // Rig patch: the clock as last read, unless a tick slept since (see
        // `clock`).
        let tokio = &self.tokio;
        *self.clock.get_or_insert_with(|| {
            let _guard = tokio.enter();
            Instant::now()
        })
    }

    // This method is called by [`Sim::run`], which iterates through all the
    // runtimes and ticks each one. The magic of this method is described in the
    // documentation for [`LocalSet::run_until`], but it may not be entirely
    // obvious how things fit together.
    //
    // A [`LocalSet`] tracks the tasks to run, which may in turn spawn more
    // tasks. `run_until` drives a top level task to completion, but not its
    // children. If you look below, you may be confused. The task we run here
    // just sleeps and has no children! However, it's the _same `LocalSet`_ that
    // is used to run software on the host.
    //
    // In this way, every time `tick` is called, the following unfolds:
    //
    // 1. Time advances on the runtime
    // 2. We schedule a new task that simply sleeps
    // 3. Other tasks on the `LocalSet` get a chance to run
    // 4. The sleep finishes
    // 5. The runtime pauses
    //
    // Returns whether the software has finished successfully or the error
    // that caused failure. Subsequent calls do not return the error as it is
    // expected to fail the simulation.
    pub(crate) fn tick(&mut self, duration: Duration) -> Result<bool> {
        // Rig patch: this is `LocalSet::run_until(sleep(duration))` written
        // out, so that the local set alone is polled with a waker that notes
        // wakes (the sleep's own wake is not a task's), and skipped ticks are
        // made up in one sleep. The order of polls is run_until's.
        // Rig patch: the ticks skipped since the last one, as one sum.
        self.lag += duration * steps(mem::take(&mut self.skipped));
        let pending = Arc::clone(&self.pending);
        let timerless = self.skip_idle && self.no_runtime_tasks();
        let local = &mut self.local;
        if timerless {
            // Rig patch: software that keeps no tokio timers has nothing the
            // sleep could wake; run the local set until it is idle, and leave
            // the clock's catching up to the next tick that sleeps. Idle means
            // idle twice over a park: a task that yielded (`yield_now`) is
            // woken only when the scheduler parks, as it was before the sleep.
            self.lag += duration;
            let noting = &mut self.noting;
            let mut idle_once = false;
            self.tokio.block_on(poll_fn(|cx| {
                if pending.swap(false, Ordering::Relaxed) {
                    idle_once = false;
                } else if idle_once {
                    // Rig patch: nothing was scheduled over the park (a
                    // deferred task's wake and a task put in the local set's
                    // queue from outside it both pass the noting waker), and
                    // the poll before the park left both queues empty (a tick
                    // that stops with tasks still queued wakes the set, which
                    // the flag notes too). Polling the set again would run no
                    // task and only count one more tick of its own, whose
                    // count only orders its queue of wakes from other threads
                    // (empty: a simulation runs on one thread) before its
                    // local one.
                    return Poll::Ready(());
                }
                let waker = NoteWake::around(noting, &pending, cx.waker());
                let _ = Pin::new(&mut *local).poll(&mut std::task::Context::from_waker(&waker));
                if pending.load(Ordering::Relaxed) {
                    Poll::Pending
                } else if !idle_once {
                    idle_once = true;
                    cx.waker().wake_by_ref();
                    Poll::Pending
                } else {
                    Poll::Ready(())
                }
            }));
            return self.software_finished();
        }
        let duration = duration + mem::take(&mut self.lag);
        let noting = &mut self.noting;
        self.tokio.block_on(async {
            let mut sleep = pin!(sleep(duration));
            poll_fn(|cx| {
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                let waker = NoteWake::around(noting, &pending, cx.waker());
                // Whatever was scheduled runs now; a task still queued after
                // the local set's tick wakes it again and sets the flag.
                pending.store(false, Ordering::Relaxed);
                let _ = Pin::new(&mut *local).poll(&mut std::task::Context::from_waker(&waker));
                Poll::Pending
            })
            .await
        });
        // The sleep moved the runtime's clock (rig patch).
        self.clock = None;

        self.software_finished()
    }

    /// Whether the software has finished, and its error if it failed.
    fn software_finished(&mut self) -> Result<bool> {
        // pull for software completion
        match &self.handle {
            Some(handle) if handle.is_finished() => {
                // Consume handle to extract task result
                if let Some(h) = self.handle.take() {
                    match self.tokio.block_on(h) {
                        // If the host was crashed the JoinError is cancelled, which
                        // needs to be handled to not fail the simulation.
                        Err(je) if je.is_cancelled() => {}
                        res => res??,
                    }
                };
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Ok(true),
        }
    }

    pub(crate) fn crash(&mut self) {
        if !self.is_host() {
            panic!("can only crash host's software");
        }

        // Rig patch: a process that died is no longer suspended.
        self.frozen = false;
        if self.handle.take().is_some() {
            self.cancel_tasks();
        };
    }

    pub(crate) fn bounce(&mut self) {
        if !self.is_host() {
            panic!("can only bounce host's software");
        }
        // Rig patch: a restarted process is no longer suspended.
        self.frozen = false;

        self.cancel_tasks();

        if let Kind::Host { software } = &self.kind {
            let handle = with(&self.tokio, &self.local, || tokio::task::spawn_local(software()));
            self.handle.replace(handle);
        };
    }

    /// Cancel all tasks within the [`Rt`] by dropping the current tokio
    /// [`Runtime`].
    ///
    /// Dropping the runtime blocks the calling thread until all futures have
    /// completed, which is desired here to ensure host software completes and
    /// all resources are dropped.
    ///
    /// Both the [`Runtime`] and [`LocalSet`] are replaced with new instances.
    fn cancel_tasks(&mut self) {
        let (tokio, local) = init(&mut self.config);

        self.metrics = tokio.metrics();
        // The noting waker wraps the old runtime's waker, and the clock read
        // was the old runtime's (rig patch).
        self.noting = None;
        self.clock = None;
        _ = mem::replace(&mut self.tokio, tokio);
        drop(mem::replace(&mut self.local, local));
        // The new local set's first task is queued without a wake (rig patch).
        self.pending.store(true, Ordering::Relaxed);
        self.lag = Duration::ZERO;
        self.skipped = 0;
    }
}

/// A count of skipped steps as the `u32` a `Duration` is multiplied by (rig
/// patch): more than `u32::MAX` steps skipped in a row is refused, as when
/// the counts were `u32`s themselves.
fn steps(skipped: u64) -> u32 {
    u32::try_from(skipped).expect("fewer than 2^32 steps skipped in a row")
}

fn init(config: &mut Config) -> (Runtime, LocalSet) {
    let mut tokio_builder = tokio::runtime::Builder::new_current_thread();

    #[cfg(tokio_unstable)]
    tokio_builder.unhandled_panic(tokio::runtime::UnhandledPanic::ShutdownRuntime);

    if config.enable_io {
        tokio_builder.enable_io();
    }

    #[cfg(tokio_unstable)]
    if let Some(rng) = &mut config.rng {
        let bytes: [u8; 32] = rand::Rng::random(rng);
        let seed = tokio::runtime::RngSeed::from_bytes(&bytes);
        tokio_builder.rng_seed(seed);
    }

    let tokio = tokio_builder.enable_time().start_paused(true).build().unwrap();

    tokio.block_on(async {
        // Sleep to "round" `Instant::now()` to the closest `ms`
        tokio::time::sleep(Duration::from_millis(1)).await;
    });

    (tokio, new_local())
}

fn new_local() -> LocalSet {
    #[cfg(not(tokio_unstable))]
    let local = LocalSet::new();

    #[cfg(tokio_unstable)]
    let mut local = LocalSet::new();

    #[cfg(tokio_unstable)]
    local.unhandled_panic(tokio::runtime::UnhandledPanic::ShutdownRuntime);

    local
}

fn with<R>(tokio: &Runtime, local: &LocalSet, f: impl FnOnce() -> R) -> R {
    tokio.block_on(async { local.run_until(async { f() }).await })
}

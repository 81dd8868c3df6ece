use log::*;
use std::{
    io::{Read, Write},
    pin::Pin,
    task::{Context, Poll},
};

use futures_util::task;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tungstenite::Error as WsError;

pub(crate) enum ContextWaker {
    Read,
    Write,
}

#[derive(Debug)]
pub(crate) struct AllowStd<S> {
    inner: S,
    // We have the problem that external read operations (i.e. the Stream impl)
    // can trigger both read (AsyncRead) and write (AsyncWrite) operations on
    // the underyling stream. At the same time write operations (i.e. the Sink
    // impl) can trigger write operations (AsyncWrite) too.
    // Both the Stream and the Sink can be used on two different tasks, but it
    // is required that AsyncRead and AsyncWrite are only ever used by a single
    // task (or better: with a single waker) at a time.
    //
    // Doing otherwise would cause only the latest waker to be remembered, so
    // in our case either the Stream or the Sink impl would potentially wait
    // forever to be woken up because only the other one would've been woken
    // up.
    //
    // To solve this we implement a waker proxy that has two slots (one for
    // read, one for write) to store wakers. One waker proxy is always passed
    // to the AsyncRead, the other to AsyncWrite so that they will only ever
    // have to store a single waker, but internally we dispatch any wakeups to
    // up to two actual wakers (one from the Sink impl and one from the Stream
    // impl).
    //
    // write_waker_proxy is always used for AsyncWrite, read_waker_proxy for
    // AsyncRead. The read_waker slots of both are used for the Stream impl
    // (and handshaking), the write_waker slots for the Sink impl.
    write_waker_proxy: Arc<WriteProxy>,
    read_waker_proxy: Arc<ReadProxy>,
}

// Internal trait used only in the Handshake module for registering
// the waker for the context used during handshaking. We're using the
// read waker slot for this, but any would do.
//
// Don't ever use this from multiple tasks at the same time!
pub(crate) trait SetWaker {
    fn set_waker(&self, waker: &task::Waker);
}

impl<S> SetWaker for AllowStd<S> {
    fn set_waker(&self, waker: &task::Waker) {
        self.set_waker(ContextWaker::Read, waker);
    }
}

impl<S> AllowStd<S> {
    pub(crate) fn new(inner: S, waker: &task::Waker) -> Self {
        // rig patch: both proxies keep their slots in one `Slots`, the read proxy's (see
        // `ReadProxy`); two allocations, as upstream's two proxies.
        let read_waker_proxy = Arc::new(ReadProxy { slots: Slots::default() });
        let res = Self {
            inner,
            write_waker_proxy: Arc::new(WriteProxy { read: Arc::clone(&read_waker_proxy) }),
            read_waker_proxy,
        };

        // Register the handshake waker as read waker for both proxies,
        // see also the SetWaker trait.
        res.set_waker(ContextWaker::Read, waker);

        res
    }

    // Set the read or write waker for our proxies.
    //
    // Read: this is only supposed to be called by read (or handshake) operations, i.e. the Stream
    // impl on the WebSocketStream.
    // Reading can also cause writes to happen, e.g. in case of Message::Ping handling.
    //
    // Write: this is only supposde to be called by write operations, i.e. the Sink impl on the
    // WebSocketStream.
    pub(crate) fn set_waker(&self, kind: ContextWaker, waker: &task::Waker) {
        let slot = match kind {
            ContextWaker::Read => READ_SLOT,
            ContextWaker::Write => WRITE_SLOT,
        };
        self.read_waker_proxy.slots.register(slot, waker);
    }

    /// Returns the underlying stream.
    pub(crate) fn into_inner(self) -> S {
        self.inner
    }
}

// Proxy Waker that we pass to the internal AsyncRead/Write of the
// stream underlying the websocket. We have two slots here for the
// actual wakers to allow external read operations to trigger both
// reads and writes, and the same for writes.
//
// rig patch: upstream's proxy holds its two slots in two `AtomicWaker`s, and every poll of the
// stream or the sink registers its task's waker with two of them (the same slot of both
// proxies): four atomic read-modify-writes and two waker comparisons a poll, and a clone
// whenever one of the two had been woken. Here both proxies' slots are kept together (`Slots`):
// a registration takes one short lock and compares once. The two proxies are still two wakers
// (the underlying stream tells them apart as before) and each still holds each slot or not on
// its own: a wake of one wakes what its read slot holds, then what its write slot holds, and
// leaves the other proxy's slots as they are, as upstream's do. So every task is woken when and
// as often as it was, in the same order.
#[derive(Debug)]
struct ReadProxy {
    slots: Slots,
}

/// rig patch: the write proxy, whose slots are kept with the read proxy's.
#[derive(Debug)]
struct WriteProxy {
    read: Arc<ReadProxy>,
}

const READ_PROXY: usize = 0;
const WRITE_PROXY: usize = 1;
const READ_SLOT: usize = 0;
const WRITE_SLOT: usize = 1;

/// rig patch: both proxies' slots. A registration always goes to the same slot of both proxies,
/// so wherever two proxies hold a slot they hold equal wakers (upstream keeps a waker that
/// `will_wake` the same task, else replaces it): one waker per slot, and which proxies hold it.
#[derive(Default)]
struct Slots {
    /// Taken (set) by whoever reads or writes `inner`; held only for a few instructions, never
    /// while a waker's code runs but for its `clone`, `will_wake` and `drop`, as `AtomicWaker`
    /// holds its own state.
    locked: AtomicBool,
    inner: UnsafeCell<SlotsInner>,
}

#[derive(Default)]
struct SlotsInner {
    /// The waker of each slot (`READ_SLOT`, `WRITE_SLOT`) while a proxy holds it.
    wakers: [Option<task::Waker>; 2],
    /// Whether each proxy (`READ_PROXY`, `WRITE_PROXY`) holds each slot.
    held: [[bool; 2]; 2],
}

// SAFETY: `inner` is only touched under `locked` (see `Slots::with`), and wakers are `Send`
// and `Sync`.
unsafe impl Send for Slots {}
unsafe impl Sync for Slots {}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots").finish_non_exhaustive()
    }
}

impl Slots {
    fn with<R>(&self, f: impl FnOnce(&mut SlotsInner) -> R) -> R {
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        struct Unlock<'a>(&'a AtomicBool);
        impl Drop for Unlock<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _unlock = Unlock(&self.locked);
        // SAFETY: the lock is held until `_unlock` drops.
        f(unsafe { &mut *self.inner.get() })
    }

    /// `AtomicWaker::register` on `slot` of both proxies.
    fn register(&self, slot: usize, waker: &task::Waker) {
        self.with(|inner| {
            match &mut inner.wakers[slot] {
                Some(old) if old.will_wake(waker) => {}
                other => *other = Some(waker.clone()),
            }
            inner.held[READ_PROXY][slot] = true;
            inner.held[WRITE_PROXY][slot] = true;
        });
    }

    /// `AtomicWaker::wake` on both slots of `proxy`, its read slot first as upstream's proxy.
    fn wake(&self, proxy: usize) {
        // Woken outside the lock, as `AtomicWaker::wake` wakes what it took.
        let [read, write] = self.take(proxy);
        if let Some(waker) = read {
            waker.wake();
        }
        if let Some(waker) = write {
            waker.wake();
        }
    }

    /// `AtomicWaker::take` on both slots of `proxy`.
    fn take(&self, proxy: usize) -> [Option<task::Waker>; 2] {
        let other = 1 - proxy;
        self.with(|inner| {
            let mut taken = [None, None];
            for slot in [READ_SLOT, WRITE_SLOT] {
                if std::mem::take(&mut inner.held[proxy][slot]) {
                    taken[slot] =
                        if inner.held[other][slot] { inner.wakers[slot].clone() } else { inner.wakers[slot].take() };
                }
            }
            taken
        })
    }
}

impl task::ArcWake for ReadProxy {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.slots.wake(READ_PROXY);
    }
}

impl task::ArcWake for WriteProxy {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.read.slots.wake(WRITE_PROXY);
    }
}

impl<S> AllowStd<S>
where
    S: Unpin,
{
    fn with_context<F, R>(&mut self, kind: ContextWaker, f: F) -> Poll<std::io::Result<R>>
    where
        F: FnOnce(&mut Context<'_>, Pin<&mut S>) -> Poll<std::io::Result<R>>,
    {
        trace!("{}:{} AllowStd.with_context", file!(), line!());
        let waker = match kind {
            ContextWaker::Read => task::waker_ref(&self.read_waker_proxy),
            ContextWaker::Write => task::waker_ref(&self.write_waker_proxy),
        };
        let mut context = task::Context::from_waker(&waker);
        f(&mut context, Pin::new(&mut self.inner))
    }

    pub(crate) fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S> Read for AllowStd<S>
where
    S: AsyncRead + Unpin,
{
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        trace!("{}:{} Read.read", file!(), line!());
        let mut buf = ReadBuf::new(buf);
        match self.with_context(ContextWaker::Read, |ctx, stream| {
            trace!("{}:{} Read.with_context read -> poll_read", file!(), line!());
            stream.poll_read(ctx, &mut buf)
        }) {
            Poll::Ready(Ok(_)) => Ok(buf.filled().len()),
            Poll::Ready(Err(err)) => Err(err),
            Poll::Pending => Err(std::io::Error::from(std::io::ErrorKind::WouldBlock)),
        }
    }
}

impl<S> Write for AllowStd<S>
where
    S: AsyncWrite + Unpin,
{
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        trace!("{}:{} Write.write", file!(), line!());
        match self.with_context(ContextWaker::Write, |ctx, stream| {
            trace!("{}:{} Write.with_context write -> poll_write", file!(), line!());
            stream.poll_write(ctx, buf)
        }) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(std::io::Error::from(std::io::ErrorKind::WouldBlock)),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        trace!("{}:{} Write.flush", file!(), line!());
        match self.with_context(ContextWaker::Write, |ctx, stream| {
            trace!("{}:{} Write.with_context flush -> poll_flush", file!(), line!());
            stream.poll_flush(ctx)
        }) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(std::io::Error::from(std::io::ErrorKind::WouldBlock)),
        }
    }
}

pub(crate) fn cvt<T>(r: Result<T, WsError>) -> Poll<Result<T, WsError>> {
    match r {
        Ok(v) => Poll::Ready(Ok(v)),
        Err(WsError::Io(ref e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
            trace!("WouldBlock");
            Poll::Pending
        }
        Err(e) => Poll::Ready(Err(e)),
    }
}

//! Rig patch: the channel from a host's stream socket to the stream's reader.
//!
//! Upstream uses tokio's bounded `mpsc` channel: a semaphore for its capacity (whose release
//! takes a lock), a list of blocks filled through atomics, and an `AtomicWaker` for the reader,
//! for a channel that one host's one thread fills and empties, a segment at a time. One lock
//! around a queue does the same for about half the instructions, and the stream stays `Send`.
//!
//! It behaves as the channel it replaces, wake for wake: a segment sent, or the sender dropped,
//! wakes the reader's waker once (taking it), a receive that finds nothing registers the waker
//! (kept if it would wake the same task), and a receive takes a unit of the task's budget
//! (tokio's coop) before it looks, so tasks interleave as they did. A full queue or a dropped
//! receiver refuses a reservation as tokio's does (`Closed` before `Full`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll, Waker};

use tokio::sync::mpsc::error::{TryRecvError, TrySendError};

struct Queue<T> {
    items: VecDeque<T>,
    capacity: usize,
    /// The reader's waker while it waits.
    waker: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

type Shared<T> = Arc<Mutex<Queue<T>>>;

/// How many items the queue has room for once it first holds one.
const FIRST_BLOCK: usize = 16;

fn lock<T>(shared: &Shared<T>) -> MutexGuard<'_, Queue<T>> {
    // Nothing panics while the lock is held; a poisoned queue is still whole.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A bounded channel of at most `capacity` items waiting to be received.
pub(crate) fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Mutex::new(Queue {
        items: VecDeque::new(),
        capacity,
        waker: None,
        sender_gone: false,
        receiver_gone: false,
    }));
    (Sender { shared: Arc::clone(&shared) }, Receiver { shared })
}

pub(crate) struct Sender<T> {
    shared: Shared<T>,
}

/// A place in the queue, held until [`Permit::send`] fills it.
pub(crate) struct Permit<'a, T> {
    queue: MutexGuard<'a, Queue<T>>,
}

impl<T> Sender<T> {
    /// A place for one item: `Closed` once the receiver is gone, else `Full` when `capacity`
    /// items wait, as tokio's `Sender::try_reserve`.
    pub(crate) fn try_reserve(&self) -> Result<Permit<'_, T>, TrySendError<()>> {
        let queue = lock(&self.shared);
        if queue.receiver_gone {
            return Err(TrySendError::Closed(()));
        }
        if queue.items.len() >= queue.capacity {
            return Err(TrySendError::Full(()));
        }
        Ok(Permit { queue })
    }
}

impl<T> Permit<'_, T> {
    /// Queues `item` and wakes the reader if it waits.
    pub(crate) fn send(self, item: T) {
        let mut queue = self.queue;
        if queue.items.capacity() == 0 {
            // Room for several at once, as tokio's first block has (32), so that a reader that
            // falls behind does not regrow the queue segment by segment; allocated only once
            // the socket receives something.
            let first = queue.capacity.min(FIRST_BLOCK);
            queue.items.reserve_exact(first);
        }
        queue.items.push_back(item);
        let waker = queue.waker.take();
        // Woken outside the lock.
        drop(queue);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut queue = lock(&self.shared);
            queue.sender_gone = true;
            queue.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

pub(crate) struct Receiver<T> {
    shared: Shared<T>,
}

impl<T> Receiver<T> {
    /// The next item; `None` once the sender is gone and nothing is left.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        let mut queue = lock(&self.shared);
        if let Some(item) = queue.items.pop_front() {
            coop.made_progress();
            return Poll::Ready(Some(item));
        }
        if queue.sender_gone {
            coop.made_progress();
            return Poll::Ready(None);
        }
        match &mut queue.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The next item if one waits, as tokio's `Receiver::try_recv`.
    pub(crate) fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut queue = lock(&self.shared);
        match queue.items.pop_front() {
            Some(item) => Ok(item),
            None if queue.sender_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let items = {
            let mut queue = lock(&self.shared);
            queue.receiver_gone = true;
            // Nothing will poll for the reader any more: its waker goes, as tokio's does.
            queue.waker = None;
            std::mem::take(&mut queue.items)
        };
        // Dropped outside the lock, as tokio drops what a closed channel still held.
        drop(items);
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

//! A connection's plumbing for one thread: its outbox of frames and the read and write halves
//! of its WebSocket.
//!
//! The engine and every worker run their connection tasks on one thread (`spawn_local`), so
//! nothing here needs atomics or locks: tokio's bounded channel (a semaphore, a block list, an
//! atomic waker) and `futures_util`'s `split` (a `BiLock` taken around every poll) cost about
//! 1.5 % of a simulated run's instructions for a hundred frames. Both stand-ins behave as what
//! they replace, wake for wake: a simulated run's order of task wake-ups is part of its trace.

use futures_util::{Sink, Stream};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// What the two ends of an outbox share.
struct Queue<T> {
    items: VecDeque<T>,
    capacity: usize,
    /// The receiver's waker while it waits for an item (tokio's channel keeps one the same way:
    /// a send wakes it once, and it registers again when it next finds the queue empty).
    waiting: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

/// The sending end of a bounded one-thread channel: [`Outbox::try_send`] fails when the queue
/// holds `capacity` items or the receiver is gone, as tokio's `mpsc::Sender::try_send` does.
pub struct Outbox<T> {
    queue: Rc<RefCell<Queue<T>>>,
}

/// The receiving end: items in order, then `None` once the sender is gone and the queue empty.
pub struct Outgoing<T> {
    queue: Rc<RefCell<Queue<T>>>,
}

/// A bounded channel of at most `capacity` waiting items, for one thread.
pub fn outbox<T>(capacity: usize) -> (Outbox<T>, Outgoing<T>) {
    let queue = Rc::new(RefCell::new(Queue {
        items: VecDeque::new(),
        capacity,
        waiting: None,
        sender_gone: false,
        receiver_gone: false,
    }));
    (Outbox { queue: Rc::clone(&queue) }, Outgoing { queue })
}

impl<T> Outbox<T> {
    /// Queues `item` and wakes the receiver if it waits; the item back when the queue is full
    /// or the receiver gone.
    pub fn try_send(&self, item: T) -> Result<(), T> {
        let waiting = {
            let mut queue = self.queue.borrow_mut();
            if queue.receiver_gone || queue.items.len() >= queue.capacity {
                return Err(item);
            }
            queue.items.push_back(item);
            queue.waiting.take()
        };
        // Woken outside the borrow: a waker may run code that sends again.
        if let Some(waker) = waiting {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Drop for Outbox<T> {
    fn drop(&mut self) {
        let waiting = {
            let mut queue = self.queue.borrow_mut();
            queue.sender_gone = true;
            queue.waiting.take()
        };
        if let Some(waker) = waiting {
            waker.wake();
        }
    }
}

impl<T> Outgoing<T> {
    /// The next item, or `None` once the sender is gone and nothing is left.
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        // Tokio's channel takes a unit of the task's budget per item: a task that has used its
        // budget yields here as it did there, so tasks interleave as before.
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let mut queue = self.queue.borrow_mut();
        if let Some(item) = queue.items.pop_front() {
            coop.made_progress();
            return Poll::Ready(Some(item));
        }
        if queue.sender_gone {
            coop.made_progress();
            return Poll::Ready(None);
        }
        match &mut queue.waiting {
            Some(waker) => waker.clone_from(cx.waker()),
            None => queue.waiting = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Drop for Outgoing<T> {
    fn drop(&mut self) {
        let items = {
            let mut queue = self.queue.borrow_mut();
            queue.receiver_gone = true;
            queue.waiting = None;
            std::mem::take(&mut queue.items)
        };
        // Dropped outside the borrow, as tokio drops what a closed channel still held.
        drop(items);
    }
}

/// A value shared by two halves on one thread, each borrowing it only for the length of a poll.
type Shared<S> = Rc<RefCell<S>>;

/// The write half of [`split`].
pub struct WriteHalf<S> {
    inner: Shared<S>,
}

/// The read half of [`split`].
pub struct ReadHalf<S> {
    inner: Shared<S>,
}

/// Splits a sink-and-stream into halves for two tasks of one thread, as `StreamExt::split`
/// does without its lock: a poll of one half cannot run inside a poll of the other on one
/// thread, so the borrow each poll takes never meets the other's.
pub fn split<S>(inner: S) -> (WriteHalf<S>, ReadHalf<S>) {
    let inner = Rc::new(RefCell::new(inner));
    (WriteHalf { inner: Rc::clone(&inner) }, ReadHalf { inner })
}

impl<S> ReadHalf<S> {
    /// The whole again, from both halves of one split; `None` for halves of different splits.
    pub fn reunite(self, other: WriteHalf<S>) -> Option<S> {
        if !Rc::ptr_eq(&self.inner, &other.inner) {
            return None;
        }
        drop(other);
        Rc::try_unwrap(self.inner).ok().map(RefCell::into_inner)
    }
}

impl<S: Stream + Unpin> Stream for ReadHalf<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut *self.inner.borrow_mut()).poll_next(cx)
    }
}

impl<S: Sink<Item> + Unpin, Item> Sink<Item> for WriteHalf<S> {
    type Error = S::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Pin::new(&mut *self.inner.borrow_mut()).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Item) -> Result<(), S::Error> {
        Pin::new(&mut *self.inner.borrow_mut()).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Pin::new(&mut *self.inner.borrow_mut()).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Pin::new(&mut *self.inner.borrow_mut()).poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{SinkExt, StreamExt};

    fn on_a_local_runtime(test: impl std::future::Future<Output = ()>) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, test);
    }

    #[test]
    fn an_outbox_refuses_past_its_capacity_and_ends_after_its_sender() {
        on_a_local_runtime(async {
            let (outbox, mut outgoing) = outbox::<u32>(2);
            assert_eq!(outbox.try_send(1), Ok(()));
            assert_eq!(outbox.try_send(2), Ok(()));
            assert_eq!(outbox.try_send(3), Err(3), "full at its capacity");
            assert_eq!(outgoing.recv().await, Some(1));
            assert_eq!(outbox.try_send(3), Ok(()), "a received item frees its place");
            drop(outbox);
            assert_eq!(outgoing.recv().await, Some(2), "what was queued still comes after the sender went");
            assert_eq!(outgoing.recv().await, Some(3));
            assert_eq!(outgoing.recv().await, None);
        });
    }

    #[test]
    fn a_send_wakes_the_waiting_receiver_and_a_gone_receiver_refuses() {
        on_a_local_runtime(async {
            let (outbox, mut outgoing) = outbox::<u32>(4);
            let receiver = tokio::task::spawn_local(async move { outgoing.recv().await });
            tokio::task::yield_now().await;
            assert_eq!(outbox.try_send(7), Ok(()));
            assert_eq!(receiver.await.unwrap(), Some(7));
            assert_eq!(outbox.try_send(8), Err(8), "the receiver is gone");
        });
    }

    #[test]
    fn halves_pass_through_and_reunite() {
        on_a_local_runtime(async {
            let (mut write, mut read) = split(Echo::default());
            write.send(5).await.unwrap();
            assert_eq!(read.next().await, Some(5));
            write.close().await.unwrap();
            let (other_write, _) = split(Echo::default());
            let (_, third_read) = split(Echo::default());
            assert!(third_read.reunite(other_write).is_none(), "halves of two splits do not reunite");
            let echo = read.reunite(write).expect("the halves of one split reunite");
            // Every call of the sink reaches the socket: a half that answered `ready`, `flush` or
            // `close` itself would leave frames in tungstenite's buffer, or a close unsent.
            assert_eq!(echo.calls, ["ready", "start_send", "flush", "close"]);
        });
    }

    /// A sink whose items come back out of it as a stream, noting each call of the sink.
    #[derive(Default)]
    struct Echo {
        items: VecDeque<u32>,
        calls: Vec<&'static str>,
    }

    impl Stream for Echo {
        type Item = u32;
        fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<u32>> {
            Poll::Ready(self.items.pop_front())
        }
    }

    impl Sink<u32> for Echo {
        type Error = std::convert::Infallible;
        fn poll_ready(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.calls.push("ready");
            Poll::Ready(Ok(()))
        }
        fn start_send(mut self: Pin<&mut Self>, item: u32) -> Result<(), Self::Error> {
            self.calls.push("start_send");
            self.items.push_back(item);
            Ok(())
        }
        fn poll_flush(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.calls.push("flush");
            Poll::Ready(Ok(()))
        }
        fn poll_close(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.calls.push("close");
            Poll::Ready(Ok(()))
        }
    }
}

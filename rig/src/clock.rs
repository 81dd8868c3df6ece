//! The simulated clock every rig component reads and sleeps on.
//!
//! turmoil advances time one fixed tick per step and cannot skip ahead, which makes a
//! 30-minute queue deadline cost 1.8 million steps. So no rig component uses tokio's timers:
//! they sleep on this clock, whose timers the runner fires between steps. When the world is
//! quiescent (nothing in flight, nothing happened), the runner warps this clock straight to the
//! next deadline. Nothing observable reads turmoil's own clock.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Simulated milliseconds since the start of a run, with the timers waiting on them.
#[derive(Default)]
pub struct Clock {
    state: RefCell<ClockState>,
}

#[derive(Default)]
struct ClockState {
    now_ms: u64,
    next_timer_id: u64,
    /// Ordered by deadline, then by creation, so timers due together wake in a fixed order.
    timers: BTreeMap<(u64, u64), Waker>,
}

impl Clock {
    pub fn new() -> Rc<Self> {
        Rc::new(Self::default())
    }

    pub fn now_ms(&self) -> u64 {
        self.state.borrow().now_ms
    }

    /// A future that completes `ms` simulated milliseconds from now.
    pub fn sleep(self: &Rc<Self>, ms: u64) -> Sleep {
        let deadline = self.now_ms().saturating_add(ms);
        self.sleep_until(deadline)
    }

    pub fn sleep_until(self: &Rc<Self>, deadline_ms: u64) -> Sleep {
        Sleep { clock: Rc::clone(self), deadline_ms, timer: None }
    }

    /// The earliest deadline anyone is waiting on.
    pub fn next_deadline(&self) -> Option<u64> {
        self.state.borrow().timers.keys().next().map(|&(deadline, _)| deadline)
    }

    /// Moves time forward (never back) and wakes every timer that is now due.
    /// Returns how many timers woke.
    pub(crate) fn advance_to(&self, now_ms: u64) -> usize {
        let due: Vec<Waker> = {
            let mut state = self.state.borrow_mut();
            state.now_ms = state.now_ms.max(now_ms);
            // Most steps wake nothing: splitting the map would rebuild it for nothing.
            if state.timers.keys().next().is_none_or(|&(deadline, _)| deadline > state.now_ms) {
                return 0;
            }
            let first_later = (state.now_ms.saturating_add(1), 0);
            let later = state.timers.split_off(&first_later);
            std::mem::replace(&mut state.timers, later).into_values().collect()
        };
        let woken = due.len();
        due.into_iter().for_each(Waker::wake);
        woken
    }
}

/// Completes at a simulated deadline. See [`Clock::sleep`].
pub struct Sleep {
    clock: Rc<Clock>,
    deadline_ms: u64,
    timer: Option<(u64, u64)>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let mut state = this.clock.state.borrow_mut();
        if state.now_ms >= this.deadline_ms {
            if let Some(timer) = this.timer.take() {
                state.timers.remove(&timer);
            }
            return Poll::Ready(());
        }
        let timer = *this.timer.get_or_insert_with(|| {
            state.next_timer_id += 1;
            (this.deadline_ms, state.next_timer_id)
        });
        state.timers.insert(timer, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            // A host that crashed drops its futures while the runner may hold the clock.
            if let Ok(mut state) = self.clock.state.try_borrow_mut() {
                state.timers.remove(&timer);
            }
        }
    }
}

/// Why a deadline-bounded wait gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// Runs `future` until it completes or `ms` simulated milliseconds pass, whichever is first.
pub async fn within<F: Future>(clock: &Rc<Clock>, ms: u64, future: F) -> Result<F::Output, Elapsed> {
    tokio::select! {
        biased;
        output = future => Ok(output),
        () = clock.sleep(ms) => Err(Elapsed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_wake_in_deadline_order_and_only_when_due() {
        let clock = Clock::new();
        let mut early = Box::pin(clock.sleep(5));
        let mut late = Box::pin(clock.sleep(10));
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(early.as_mut().poll(&mut cx).is_pending());
        assert!(late.as_mut().poll(&mut cx).is_pending());
        assert_eq!(clock.next_deadline(), Some(5));
        assert_eq!(clock.advance_to(5), 1);
        assert!(early.as_mut().poll(&mut cx).is_ready());
        assert!(late.as_mut().poll(&mut cx).is_pending());
        assert_eq!(clock.next_deadline(), Some(10));
        drop(late);
        assert_eq!(clock.next_deadline(), None, "a dropped sleep leaves no timer behind");
        clock.advance_to(3);
        assert_eq!(clock.now_ms(), 5, "time never goes back");
    }
}

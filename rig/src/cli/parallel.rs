//! Independent jobs on every core, their results handed back in input order.
//!
//! A run builds its own single-threaded world (`Rc` inside), so it happens entirely on one
//! worker thread: only the job (a scenario, a policy, a seed: all `Sync`) crosses to the worker,
//! and only its result comes back. Results are handed on in input order, so what a command
//! prints, and every trace hash, is the same whatever the number of workers. A second callback
//! sees each result the moment it completes, in completion order: progress, and failures
//! printed as they happen.
//!
//! Every command that runs many jobs (`run`, `matrix`, `bench`, `sweep`, `explore`) goes
//! through [`map_ordered`] or [`for_each_ordered`].

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Condvar, Mutex};

/// How many jobs a worker may run ahead of the earliest result not yet handed on, per worker:
/// bounds the results held back for ordering when one job is much slower than the rest.
const AHEAD_PER_WORKER_MAX: usize = 64;
/// A worker's stack. A run's futures are deep; the main thread's 8 MiB is what `--jobs 1` has
/// always had, so every worker gets as much.
const WORKER_STACK_BYTES: usize = 8 << 20;

/// `--jobs`, shared by every command that runs many jobs.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct Jobs {
    /// How many runs at once, each on its own thread (default: one per core). Output and trace
    /// hashes are the same for every value.
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<NonZeroUsize>,
}

impl Jobs {
    /// The number of workers for `runs` runs: as asked, or one per core, and never more than
    /// there are runs (each worker is a thread with a large stack: `--jobs 100000` for three
    /// runs would spend seconds making threads that get nothing to do).
    pub fn workers(self, runs: u64) -> NonZeroUsize {
        let asked = self.jobs.unwrap_or_else(|| std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN));
        let runs = NonZeroUsize::new(usize::try_from(runs).unwrap_or(usize::MAX)).unwrap_or(NonZeroUsize::MIN);
        asked.min(runs)
    }
}

/// Runs `work` on every job on up to `workers` threads and returns the results in input order.
/// `finished(index, &result)` is called on the calling thread as each job completes, in
/// completion order.
pub(crate) fn map_ordered<J, R>(
    jobs: impl IntoIterator<Item = J, IntoIter: Send>,
    workers: NonZeroUsize,
    work: impl Fn(J) -> R + Sync,
    finished: impl FnMut(usize, &R),
) -> Vec<R>
where
    J: Send,
    R: Send,
{
    let mut results = Vec::new();
    for_each_ordered(jobs, workers, work, finished, |_, result| results.push(result));
    results
}

/// Runs `work` on every job on up to `workers` threads. `finished(index, &result)` sees each
/// result as its job completes (completion order); `in_order(index, result)` then receives it
/// in input order, as soon as every earlier job has completed. Both run on the calling thread.
///
/// Jobs are taken from `jobs` as workers get to them, so it may be long (or lazily made).
/// With one worker everything runs on the calling thread. A panic in a job stops the others
/// from starting new jobs and is resumed on the calling thread.
pub(crate) fn for_each_ordered<J, R>(
    jobs: impl IntoIterator<Item = J, IntoIter: Send>,
    workers: NonZeroUsize,
    work: impl Fn(J) -> R + Sync,
    mut finished: impl FnMut(usize, &R),
    mut in_order: impl FnMut(usize, R),
) where
    J: Send,
    R: Send,
{
    let jobs = jobs.into_iter();
    let workers = workers.get().min(jobs.size_hint().1.unwrap_or(usize::MAX));
    if workers <= 1 {
        for (index, job) in jobs.enumerate() {
            let result = work(job);
            finished(index, &result);
            in_order(index, result);
        }
        return;
    }
    let window = workers * AHEAD_PER_WORKER_MAX;
    let queue = Queue { state: Mutex::new(QueueState::new(jobs)), wake: Condvar::new() };
    let (sender, results) = mpsc::channel::<(usize, std::thread::Result<R>)>();
    let mut panicked = None;
    std::thread::scope(|scope| {
        let (queue, work) = (&queue, &work);
        let mut spawned = 0;
        for worker in 0..workers {
            let sender = sender.clone();
            let spawn = std::thread::Builder::new()
                .name(format!("rig-worker-{worker}"))
                .stack_size(WORKER_STACK_BYTES)
                .spawn_scoped(scope, move || {
                    while let Some((index, job)) = queue.claim(window) {
                        let result = catch_unwind(AssertUnwindSafe(|| work(job)));
                        if sender.send((index, result)).is_err() {
                            return;
                        }
                    }
                });
            // Fewer threads than asked still finish the work; none at all is handled below.
            if spawn.is_ok() {
                spawned += 1;
            }
        }
        drop(sender);
        if spawned == 0 {
            // No thread could be started: run on this one.
            while let Some((index, job)) = queue.claim(usize::MAX) {
                let result = work(job);
                finished(index, &result);
                in_order(index, result);
            }
            return;
        }
        let mut held_back: BTreeMap<usize, R> = BTreeMap::new();
        let mut next = 0;
        for (index, result) in results {
            match result {
                Ok(result) => {
                    finished(index, &result);
                    held_back.insert(index, result);
                }
                Err(payload) => {
                    panicked.get_or_insert(payload);
                    queue.stop();
                    continue;
                }
            }
            while let Some(result) = held_back.remove(&next) {
                in_order(next, result);
                next += 1;
            }
            queue.handed_on(next);
        }
    });
    if let Some(payload) = panicked {
        resume_unwind(payload);
    }
}

/// The jobs not yet started, shared by the workers.
struct Queue<I> {
    state: Mutex<QueueState<I>>,
    wake: Condvar,
}

struct QueueState<I> {
    jobs: std::iter::Enumerate<I>,
    /// The index of the next job to start.
    next: usize,
    /// How many results have been handed on in order.
    handed_on: usize,
    stopped: bool,
}

impl<I: Iterator> QueueState<I> {
    fn new(jobs: I) -> Self {
        Self { jobs: jobs.enumerate(), next: 0, handed_on: 0, stopped: false }
    }
}

impl<I: Iterator> Queue<I> {
    /// The next job, once it is no more than `window` ahead of the results handed on; `None`
    /// when there is none left or the work stopped.
    fn claim(&self, window: usize) -> Option<(usize, I::Item)> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while !state.stopped && state.next >= state.handed_on.saturating_add(window) {
            state = self.wake.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if state.stopped {
            return None;
        }
        let claimed = state.jobs.next()?;
        state.next += 1;
        Some(claimed)
    }

    fn handed_on(&self, count: usize) {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).handed_on = count;
        self.wake.notify_all();
    }

    fn stop(&self) {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).stopped = true;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn results_come_back_in_input_order_whatever_the_workers() {
        let jobs: Vec<u64> = (0..500).collect();
        // Uneven job lengths, so completion order differs from input order.
        let work = |n: u64| (0..(n * 7919) % 20_000).fold(n, |acc, x| acc.wrapping_mul(31).wrapping_add(x));
        let one = map_ordered(jobs.clone(), workers(1), work, |_, _| {});
        for count in [2, 3, 8] {
            let mut finished = Vec::new();
            let many = map_ordered(jobs.clone(), workers(count), work, |index, _| finished.push(index));
            assert_eq!(one, many, "{count} workers");
            finished.sort_unstable();
            assert_eq!(finished, (0..500).collect::<Vec<_>>(), "every job finished once");
        }
    }

    #[test]
    fn in_order_receives_indices_in_sequence() {
        let mut seen = Vec::new();
        for_each_ordered(0..100, workers(4), |n: usize| n * 2, |_, _| {}, |i, r| seen.push((i, r)));
        assert_eq!(seen, (0..100).map(|i| (i, i * 2)).collect::<Vec<_>>());
    }

    #[test]
    fn jobs_are_taken_lazily_and_a_filter_hides_the_length() {
        // An endless source, cut short: only what is taken is made.
        let evens = (0u64..).filter(|n| n % 2 == 0).take(300);
        let doubled = map_ordered(evens, workers(3), |n| n * 2, |_, _| {});
        assert_eq!(doubled, (0..300).map(|n| n * 4).collect::<Vec<_>>());
    }

    #[test]
    fn no_jobs_is_no_results() {
        assert!(map_ordered(Vec::<u8>::new(), workers(4), |n| n, |_, _| {}).is_empty());
    }

    #[test]
    fn a_panicking_job_panics_the_caller_without_hanging() {
        let outcome = std::panic::catch_unwind(|| {
            map_ordered(0..1000, workers(3), |n: u32| assert!(n != 5, "job 5 fails"), |_, _| {})
        });
        assert!(outcome.is_err());
    }

    #[test]
    fn workers_are_never_more_than_the_runs() {
        let asked = |n: usize| Jobs { jobs: NonZeroUsize::new(n) };
        assert_eq!(asked(100_000).workers(3).get(), 3);
        assert_eq!(asked(2).workers(3).get(), 2);
        assert_eq!(asked(8).workers(0).get(), 1, "no runs still has one worker to find that out");
        assert_eq!(asked(4).workers(u64::MAX).get(), 4);
    }

    #[test]
    fn what_crosses_threads_is_send_and_sync() {
        fn shared<T: Send + Sync>() {}
        fn returned<T: Send>() {}
        shared::<crate::Scenario>();
        shared::<crate::PolicyRun>();
        shared::<std::sync::Arc<dyn crate::HarnessFactory>>();
        shared::<super::super::Harness>();
        returned::<super::super::Done>();
    }
}

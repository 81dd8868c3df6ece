//! Panics during a simulated run, caught where they would otherwise vanish.
//!
//! A worker's invocation, and every task a harness spawns, runs as a tokio task; a task that
//! panics is simply dropped by its runtime. What called it waits out its deadline, and the run
//! would show only an RPC `timeout` and `liveness`, however plain the panic was. So while a run
//! is simulated on a thread, a panic hook records every panic of that thread with the host whose
//! software was running; the run reports each one as a failure, naming the harness when it was a
//! harness host (any harness: a user's panics as well as ours). Other threads keep the hook they
//! had.

use std::cell::RefCell;
use std::sync::Once;

/// The most panics one run keeps; more are counted, not described.
const PANICS_MAX: usize = 16;

/// One panic of a run's thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panic {
    /// The simulated host whose software panicked, when one was running.
    pub host: Option<String>,
    pub message: String,
    /// Where, as `file:line:column`, with a dependency's registry path shortened to its crate.
    pub location: Option<String>,
}

#[derive(Default)]
struct Captured {
    panics: Vec<Panic>,
    more: usize,
}

thread_local! {
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Runs `f`, recording the panics of this thread meanwhile (what `f` returns is not affected:
/// the panics were caught by the tasks' runtimes already). The panics, and how many beyond
/// [`PANICS_MAX`] were left undescribed.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Vec<Panic>, usize) {
    install_hook();
    /// Puts back what the thread captured before, however `f` ends.
    struct Restore(Option<Option<Captured>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take().flatten();
            let _ = CAPTURE.try_with(|c| c.replace(outer));
        }
    }
    let mut restore = Restore(Some(CAPTURE.with(|c| c.replace(Some(Captured::default())))));
    let result = f();
    let outer = restore.0.take().flatten();
    let captured = CAPTURE.with(|c| c.replace(outer)).unwrap_or_default();
    (result, captured.panics, captured.more)
}

/// The run's failure line for a panic: the harness's, when it was on one of `harness_hosts`.
pub fn failure(panic: &Panic, harness_hosts: &[String]) -> String {
    let at = panic.location.as_deref().map(|l| format!(" (at {l})")).unwrap_or_default();
    match &panic.host {
        Some(host) if harness_hosts.contains(host) => {
            format!("the harness panicked on `{host}`: {}{at}", panic.message)
        }
        Some(host) => format!("the rig's `{host}` host panicked: {}{at}", panic.message),
        None => format!("a panic during the run: {}{at}", panic.message),
    }
}

fn install_hook() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !record(info) {
                previous(info);
            }
        }));
    });
}

/// Records a panic of a simulated host's software on a capturing thread: whether it did. A panic
/// of the rig's own loop unwinds out of the run and keeps the usual report.
fn record(info: &std::panic::PanicHookInfo<'_>) -> bool {
    let Some(host) = turmoil::current_host_name() else { return false };
    let message = match info.payload().downcast_ref::<&str>() {
        Some(text) => text.to_string(),
        None => info.payload().downcast_ref::<String>().cloned().unwrap_or_else(|| "(no message)".to_string()),
    };
    let location = info.location().map(|l| format!("{}:{}:{}", short_path(l.file()), l.line(), l.column()));
    let panic = Panic { host: Some(host), message, location };
    CAPTURE
        .try_with(|capture| {
            let Ok(mut capture) = capture.try_borrow_mut() else { return false };
            let Some(captured) = capture.as_mut() else { return false };
            if captured.panics.len() < PANICS_MAX {
                captured.panics.push(panic);
            } else {
                captured.more += 1;
            }
            true
        })
        .unwrap_or(false)
}

/// A source path as a reader wants it: a dependency's from its crate directory on.
fn short_path(file: &str) -> &str {
    match file.find("/registry/src/") {
        Some(at) => {
            let rest = &file[at + "/registry/src/".len()..];
            rest.split_once('/').map_or(rest, |(_, crate_path)| crate_path)
        }
        None => file,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_are_named_by_the_host_they_happened_on() {
        // Outside a simulated host nothing is captured: the rig's own panics keep their report.
        let ((), panics, more) = capture(|| {
            let caught = std::panic::catch_unwind(|| panic!("the rig itself"));
            assert!(caught.is_err());
        });
        assert_eq!((panics.len(), more), (0, 0));
        let panic = Panic { host: Some("harness".into()), message: "boom".into(), location: Some("x.rs:1:2".into()) };
        assert_eq!(failure(&panic, &["harness".into()]), "the harness panicked on `harness`: boom (at x.rs:1:2)");
        assert_eq!(failure(&panic, &[]), "the rig's `harness` host panicked: boom (at x.rs:1:2)");
    }

    #[test]
    fn a_dependencys_path_is_shortened_to_its_crate() {
        let file = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/serde_json-1.0.154/src/value/index.rs";
        assert_eq!(short_path(file), "serde_json-1.0.154/src/value/index.rs");
        assert_eq!(short_path("rig/src/run.rs"), "rig/src/run.rs");
    }
}

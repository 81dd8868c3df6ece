//! Planted bugs: the project's own measure of what the rig catches.
//!
//! A planted bug is a small, realistic change to the rig's own code (an oracle's sub-rule, a
//! capability derivation, the network's isolation), to the reference harness, or to another
//! harness of this repository, written where the correct code is and guarded by a switch:
//!
//! ```ignore
//! if rig::planted!("stranded-input-behind-an-ended-turn-waits") { return; }
//! ```
//!
//! Built without the `planted` feature (every ordinary build), [`active`] is a `const fn`
//! returning `false` and each switch compiles away. Built with it (`--features rig/planted`),
//! the environment variable [`VARIABLE`] (`RIG_PLANTED=<id>`), read once per process, turns on
//! the one bug of that id, so one build serves every bug of the set. The set is checked in with
//! a line each (`.cargo/planted.toml`), `rig/tests/planted.rs` holds the list and the switches in
//! the code to each other, and `.ci/planted` (`just planted`) measures which of them the
//! catalogue, sweep and explore, and the crates' tests catch.

/// The environment variable naming the one planted bug to turn on.
pub const VARIABLE: &str = "RIG_PLANTED";

#[cfg(feature = "planted")]
thread_local! {
    /// The bug this thread's code runs with while [`scoped`] says so (`Some(None)`: none),
    /// whatever `RIG_PLANTED` names.
    static SCOPED: std::cell::RefCell<Option<Option<String>>> = const { std::cell::RefCell::new(None) };
}

/// Whether the planted bug `id` is on: the bug of the innermost [`scoped`] call on this thread,
/// else the one `RIG_PLANTED` names (read once per process).
#[cfg(feature = "planted")]
pub fn active(id: &str) -> bool {
    use std::sync::OnceLock;
    static ACTIVE: OnceLock<Option<String>> = OnceLock::new();
    if let Some(on) = SCOPED.with(|scoped| scoped.borrow().as_ref().map(|bug| bug.as_deref() == Some(id))) {
        return on;
    }
    ACTIVE.get_or_init(|| std::env::var(VARIABLE).ok().filter(|id| !id.is_empty())).as_deref() == Some(id)
}

/// Runs `f` with the planted bug `bug` on (`None`: with none) on this thread, whatever
/// `RIG_PLANTED` names, then puts back what was on before. A run happens entirely on one thread
/// (rig/src/cli/parallel.rs), so `rig explore-bench` hunts one bug with it and checks each
/// finding against the same run with no bug, in one process.
#[cfg(feature = "planted")]
pub fn scoped<R>(bug: Option<&str>, f: impl FnOnce() -> R) -> R {
    /// Puts the thread's previous bug back, on a panic too.
    struct Restore(Option<Option<String>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            SCOPED.with(|scoped| *scoped.borrow_mut() = previous);
        }
    }
    let previous = SCOPED.with(|scoped| scoped.borrow_mut().replace(bug.map(str::to_string)));
    let _restore = Restore(previous);
    f()
}

/// Runs `f`: a build without the `planted` feature has no bug to turn on or off ([`BUILT_IN`]
/// says so; `rig explore-bench` refuses a planted bug then).
#[cfg(not(feature = "planted"))]
pub fn scoped<R>(_bug: Option<&str>, f: impl FnOnce() -> R) -> R {
    f()
}

/// Whether the planted bug `id` is on: never, in a build without the `planted` feature.
#[cfg(not(feature = "planted"))]
#[inline(always)]
pub const fn active(_id: &str) -> bool {
    false
}

/// Whether this build can plant bugs at all (the `planted` feature).
pub const BUILT_IN: bool = cfg!(feature = "planted");

/// `planted!("id")`: whether the planted bug `id` is on (see [`crate::planted`]). Its id must
/// be listed in `.cargo/planted.toml` (rig/tests/planted.rs checks it).
#[macro_export]
macro_rules! planted {
    ($id:literal) => {
        $crate::planted::active($id)
    };
}

#[cfg(all(test, feature = "planted"))]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_bug_is_on_for_its_thread_only_and_what_was_on_before_comes_back() {
        assert!(!active("a-bug"), "no bug is named (the tests run without RIG_PLANTED)");
        scoped(Some("a-bug"), || {
            assert!(active("a-bug") && !active("another"));
            std::thread::spawn(|| assert!(!active("a-bug"), "another thread")).join().unwrap();
            scoped(None, || assert!(!active("a-bug"), "turned off inside"));
            assert!(active("a-bug"), "back on once the inner scope is over");
        });
        assert!(!active("a-bug"));
        let caught = std::panic::catch_unwind(|| scoped(Some("a-bug"), || panic!("a run that panics")));
        assert!(caught.is_err());
        assert!(!active("a-bug"), "put back on a panic too");
    }
}

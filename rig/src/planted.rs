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

/// Whether the planted bug `id` is on: `RIG_PLANTED` names it (read once per process).
#[cfg(feature = "planted")]
pub fn active(id: &str) -> bool {
    use std::sync::OnceLock;
    static ACTIVE: OnceLock<Option<String>> = OnceLock::new();
    ACTIVE.get_or_init(|| std::env::var(VARIABLE).ok().filter(|id| !id.is_empty())).as_deref() == Some(id)
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

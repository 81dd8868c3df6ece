//! The README checked as a doctest (rig patch: upstream used the `doc_comment` crate, which is
//! not a dependency here; `include_str!` needs none), so `cargo test --doc` over the workspace,
//! which takes this package in as a member, compiles it like the rest.
#![doc = include_str!("../README.md")]

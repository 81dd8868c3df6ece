pub(crate) mod listener;

// Rig patch: a stream socket's channel to its reader (see the module).
pub(crate) mod segments;

mod split_owned;
pub use split_owned::{OwnedReadHalf, OwnedWriteHalf, ReuniteError};

pub(crate) mod stream;

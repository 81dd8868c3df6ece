//! `rig harness`: the reference harness as an external process, for `rig live`.

use super::bad_input;
use crate::{serve_harness, HarnessProcess};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct HarnessArgs {
    /// The engine to connect to, as `rig live` prints it: ws://HOST:PORT (a path picks the URL
    /// exactly; without one, `harness` connects at / and any other host at /HOST).
    #[arg(long)]
    pub connect: String,
    /// Behave as this policy; by default as the policy the run is judged by.
    #[arg(long)]
    pub policy: Option<String>,
    /// The harness host to serve (`harness`, or `replacement` in a harness switch).
    #[arg(long, default_value = "harness")]
    pub host: String,
}

pub fn command(args: HarnessArgs) -> ExitCode {
    let process = HarnessProcess { url: args.connect, host: args.host, policy: args.policy };
    match serve_harness(&process) {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => bad_input(&why),
    }
}

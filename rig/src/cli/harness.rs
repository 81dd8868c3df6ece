//! `rig harness`: the reference harness as an external process, for `rig live`.

use super::bad_input;
use crate::{serve_harness, HarnessProcess};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct HarnessArgs {
    /// The engine to connect to, as `rig live` prints it: ws://HOST:PORT (a path picks the URL
    /// exactly; without one, `harness` connects at / and any other host at /HOST). By default
    /// III_URL, as `rig live --spawn` sets it.
    #[arg(long)]
    pub connect: Option<String>,
    /// Behave as this policy; by default as the policy the run is judged by.
    #[arg(long)]
    pub policy: Option<String>,
    /// The harness host to serve (`harness`, or `replacement` in a harness switch). By default
    /// RIG_HOST, as `rig live --spawn` sets it, else `harness`.
    #[arg(long)]
    pub host: Option<String>,
}

pub fn command(args: HarnessArgs) -> ExitCode {
    let from_env = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    let Some(url) = args.connect.or_else(|| from_env(crate::URL_VARIABLE)) else {
        return bad_input(&format!("give the engine's URL: --connect ws://HOST:PORT, or {}", crate::URL_VARIABLE));
    };
    let host = args.host.or_else(|| from_env(crate::HOST_VARIABLE)).unwrap_or_else(|| "harness".into());
    let process = HarnessProcess { url, host, policy: args.policy };
    match serve_harness(&process) {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => bad_input(&why),
    }
}

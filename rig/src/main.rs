//! The `rig` command line: the reference harness's, plus live runs and the drop-proxy.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// See `rig/Cargo.toml`: malloc and free of small buffers were a fifth of a simulated run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (its index in `mi_option_e`; a test checks it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// By default mimalloc hands memory that stayed free for a second back to the OS. A batch of runs
/// frees and takes back the same few MiB run after run, and faulting them in again showed in the
/// profile (85,000 page faults for 1,490 runs; 350 without purging). The binary keeps what it
/// freed: its peak is a few tens of MiB.
fn keep_freed_memory() {
    // SAFETY: sets a plain integer option; mimalloc reads options at the time it purges.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

#[derive(Parser)]
#[command(
    name = "rig",
    version,
    about = "A deterministic fault-injection test rig for durable agent harnesses. `run`, `matrix`, `sweep`, \
             `explore` and `bench` run the reference harness; give a harness of yours this command set with \
             rig::cli::main in a binary of its crate."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Reference(rig::cli::Command),
    /// Put the frame-aware WebSocket drop-proxy between two real processes.
    Proxy(proxy::ProxyArgs),
    /// Run scenario files live: engine, doubles and cuts on real sockets in real time, against
    /// harness processes that connect (any language; no bit-for-bit replay).
    Live(rig::cli::live::LiveArgs),
    /// Run the reference harness as an external process for `rig live`.
    Harness(rig::cli::harness::HarnessArgs),
}

fn main() -> ExitCode {
    keep_freed_memory();
    rig::cli::init_logging();
    let reference = rig::cli::Harness::new(rig::reference());
    let code = match Cli::parse().command {
        Command::Reference(command) => command.execute(&reference),
        Command::Proxy(args) => ExitCode::from(u8::try_from(proxy::run(args)).unwrap_or(1)),
        Command::Live(args) => rig::cli::live::command(args, &reference),
        Command::Harness(args) => rig::cli::harness::command(args),
    };
    rig::cli::output::finish(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // 1,000 ms is purge_delay's default (mimalloc v3 `options.c`); a shifted index would read
        // another option.
        // SAFETY: reads a plain integer option.
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }, 1000);
    }
}

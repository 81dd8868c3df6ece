//! The `rig` command line.

#[macro_use]
mod cli;

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
#[command(name = "rig", version, about = "A deterministic fault-injection test rig for durable agent harnesses")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenario files (or every .toml file under a folder) and report each run.
    Run(cli::run::RunArgs),
    /// Run many seeds, one shard of them, for CI: failing pairs with a repro each, JUnit XML.
    Matrix(cli::matrix::MatrixArgs),
    /// Try every cut at every place one uncut run offers (and pairs); write each finding as a scenario.
    Sweep(cli::sweep::SweepArgs),
    /// Draw a random fault mix per seed, shrink every failure, write it as a scenario.
    Explore(cli::explore::ExploreArgs),
    /// Measure the rig: runs per second and simulated-to-wall time per scenario file.
    Bench(cli::bench::BenchArgs),
    /// Put the frame-aware WebSocket drop-proxy between two real processes.
    Proxy(proxy::ProxyArgs),
    /// Run scenario files live: engine, doubles and cuts on real sockets in real time, against
    /// harness processes that connect (any language; no bit-for-bit replay).
    Live(cli::live::LiveArgs),
    /// Run the reference harness as an external process for `rig live`.
    Harness(cli::harness::HarnessArgs),
}

fn main() -> ExitCode {
    keep_freed_memory();
    // Colour only for a person at a terminal; logs captured by CI stay plain text.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .init();
    let code = match Cli::parse().command {
        Command::Run(args) => cli::run::command(args),
        Command::Matrix(args) => cli::matrix::command(args),
        Command::Bench(args) => cli::bench::command(args),
        Command::Sweep(args) => cli::sweep::command(args),
        Command::Explore(args) => cli::explore::command(args),
        Command::Proxy(args) => ExitCode::from(u8::try_from(proxy::run(args)).unwrap_or(1)),
        Command::Live(args) => cli::live::command(args),
        Command::Harness(args) => cli::harness::command(args),
    };
    cli::output::finish(code)
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

//! The `proxy` binary: a frame-aware WebSocket fault proxy between two real processes.

use clap::Parser;

/// Forward WebSocket frames between clients and an upstream, cutting the ones the rules select.
#[derive(Parser)]
#[command(name = "proxy", version)]
struct Cli {
    #[command(flatten)]
    args: proxy::ProxyArgs,
}

fn main() {
    // clap exits with code 2 on bad arguments, as the proxy does on bad rules.
    std::process::exit(proxy::run(Cli::parse().args));
}

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
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("proxy: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(proxy::serve(cli.args)) {
        eprintln!("proxy: {e}");
        std::process::exit(e.exit_code());
    }
}

//! `rig live`: scenario files against real harness processes, on real sockets in real time.

use super::{
    bad_input, load_scenarios, output, selected_runs, trace_lines, trace_sink, Harness, EXIT_BAD_INPUT, EXIT_FAILED,
};
use crate::capability::Capabilities;
use crate::report;
use crate::{prepare_live, run_live, LiveListener, LiveOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// What every live run says about replaying it.
const NO_REPLAY: &str = "live runs depend on real time and on an external process: the trace is recorded as in \
                         the simulation, but a live run cannot be replayed bit for bit";

#[derive(clap::Args)]
pub struct LiveArgs {
    /// Scenario files or folders (searched recursively for .toml files).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Where the engine listens for harness workers: a worker connects at ws://ADDRESS/ as the
    /// `harness` host (the iii SDKs' default engine URL is ws://127.0.0.1:49134).
    #[arg(long, default_value = "127.0.0.1:49134")]
    pub listen: String,
    /// Listen on an address other than loopback (the bus has no authentication).
    #[arg(long)]
    pub allow_remote: bool,
    /// The policy the external harness is judged by: its `[policy.NAME]` expectations.
    #[arg(long, default_value = "reference")]
    pub policy: String,
    /// Multiply every timing of the scenarios by this (0.25 runs them four times faster).
    /// Without it, a scenario with a timing impractical in real time is refused.
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// The seed of the rig's own draws (ids, handshake keys, proxy rule chances).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How long to wait for harness workers to register, at the start and after a restart (ms).
    #[arg(long, default_value_t = 30_000)]
    pub connect_timeout_ms: u64,
    /// How long nothing must happen before a healed world whose turns have ended is settled (ms).
    #[arg(long, default_value_t = 1_000)]
    pub quiet_ms: u64,
    /// One JSON object per line per run instead of the human report.
    #[arg(long)]
    pub json: bool,
    /// Write the full trace of every run as JSON lines to this file (`-`: standard output).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The capabilities the external harness serves, comma-separated (`switch,send,...`;
    /// `turns` is implied); the files that need others are skipped with the reason. By default
    /// all of them.
    #[arg(long, value_parser = Capabilities::parse)]
    pub capabilities: Option<Capabilities>,
}

/// `rig live`. The external harness is judged by the reference harness's policies; `rig` names
/// the binary for the command that runs a scenario again.
pub fn command(args: LiveArgs, rig: &Harness) -> ExitCode {
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let selected = match selected_runs(&scenarios, Some(&args.policy), rig) {
        Ok(selected) => selected,
        Err(message) => return bad_input(&message),
    };
    // Everything is checked before anything runs: one refusal stops the whole command.
    let mut prepared = Vec::new();
    let mut refused = false;
    let declared = args.capabilities.clone().unwrap_or_else(Capabilities::all);
    let mut skipped = 0u64;
    for super::Pair { scenario, policy_run: run, .. } in selected {
        if let Some(skip) = scenario.requirements(&run.policy).unmet("live", &declared) {
            out!("{}", report::skip_line(&scenario.path.display().to_string(), &run.policy, &skip));
            skipped += 1;
            continue;
        }
        match prepare_live(scenario, args.time_scale) {
            Ok(ready) => prepared.push((ready, run)),
            Err(why) => {
                err!("error: {why}");
                refused = true;
            }
        }
    }
    if refused {
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    if prepared.is_empty() {
        return bad_input("every run was skipped: the harness lacks what they need, so nothing was tested");
    }
    let address: SocketAddr = match args.listen.parse() {
        Ok(address) => address,
        Err(_) => return bad_input(&format!("--listen `{}`: expected IP:PORT, such as 127.0.0.1:49134", args.listen)),
    };
    if !address.ip().is_loopback() && !args.allow_remote {
        return bad_input(&format!(
            "--listen {address} is not a loopback address; the bus has no authentication, so pass --allow-remote to \
             listen there anyway"
        ));
    }
    let listener = match LiveListener::bind(address) {
        Ok(listener) => listener,
        Err(error) => return bad_input(&format!("cannot listen on {address}: {error}")),
    };
    let mut trace_out = match args.trace.as_deref().map(trace_sink).transpose() {
        Ok(sink) => sink,
        Err(code) => return code,
    };
    let scale = args.time_scale.unwrap_or(1.0);
    // The first line on stderr, so a script starting `rig live` on port 0 can read the address.
    err!("rig live: listening on {}", listener.url("harness"));
    err!(
        "rig live: connect the harness there (ws://{}/HOST for another harness host); real time{}; {NO_REPLAY}",
        listener.address(),
        if scale == 1.0 { String::new() } else { format!(", every scenario timing scaled by {scale}") }
    );
    let (mut passed, mut failed) = (0u64, 0u64);
    let total = prepared.len();
    for (index, (ready, run)) in prepared.iter().enumerate() {
        if output::lost() {
            break;
        }
        for ignored in &ready.ignored {
            err!("rig live: {}: {ignored}", ready.scenario.path.display());
        }
        let options = LiveOptions {
            policy: run.policy.clone(),
            seed: args.seed,
            time_scale: scale,
            connect_timeout_ms: args.connect_timeout_ms,
            quiet_ms: args.quiet_ms,
            command: rerun_command(&args, &rig.program, &ready.scenario.path.display().to_string(), address),
        };
        let outcome = match run_live(&listener, ready, run, &options) {
            Ok(outcome) => outcome,
            Err(why) => {
                err!("error: {}: {why}", ready.scenario.path.display());
                failed += 1;
                continue;
            }
        };
        if args.json {
            let mut line = report::json_line(&outcome);
            line["live"] =
                serde_json::json!({ "listen": address.to_string(), "time_scale": scale, "replay": NO_REPLAY });
            out!("{line}");
        } else {
            out!("{}\n    live: time scale {scale}; no bit-for-bit replay", report::human(&outcome));
        }
        if let Some(sink) = trace_out.as_mut() {
            sink.write(trace_lines(&outcome).as_bytes());
        }
        if outcome.passed {
            passed += 1;
        } else {
            failed += 1;
            // No worker at all: the runs after this one would wait as long for nothing.
            if outcome.failures.first().is_some_and(|f| f.starts_with("no worker registered")) && index + 1 < total {
                let skipped = total - index - 1;
                err!("rig live: stopping: no harness worker came; {skipped} more run(s) not run");
                failed += skipped as u64;
                break;
            }
        }
    }
    if let Err(code) = trace_out.map_or(Ok(()), |sink| sink.finish()) {
        return code;
    }
    if !args.json {
        out!("{passed} passed, {failed} failed, {skipped} skipped (live)");
    }
    if failed > 0 {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// The command that runs a scenario live again, as this run did (not a replay).
fn rerun_command(args: &LiveArgs, program: &str, scenario: &str, address: SocketAddr) -> String {
    let mut command = format!("{program} live {scenario} --listen {address} --policy {}", args.policy);
    if let Some(scale) = args.time_scale {
        command.push_str(&format!(" --time-scale {scale}"));
    }
    command
}

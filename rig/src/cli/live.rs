//! `rig live`: scenario files against real harness processes, on real sockets in real time.

use super::baseline::BaselineArgs;
use super::{
    bad_input, load_scenarios, output, selected_runs, trace_lines, trace_sink, Harness, EXIT_BAD_INPUT, EXIT_FAILED,
};
use crate::baseline::Failures;
use crate::capability::{Capabilities, Skip};
use crate::live::{check_time_scale, wait_for_time_kept};
use crate::report::{self, SkippedRun};
use crate::run::RunOutcome;
use crate::{
    late_ms_max, prepare_live, run_live, slower, LiveListener, LiveOptions, LiveRuns, LiveSweepOptions, Processes,
    SpawnOptions, VOID_RETRIES,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// The harness skip lines name: whatever process connects.
const LIVE: &str = "live";

/// What every live run says about replaying it.
const NO_REPLAY: &str = "live runs depend on real time and on an external process: the trace is recorded as in \
                         the simulation, but a live run cannot be replayed bit for bit";

#[derive(clap::Args)]
pub struct LiveArgs {
    /// Scenario files or folders (searched recursively for .toml files).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Where the engine listens for harness workers: a worker connects at ws://ADDRESS/ as the
    /// `harness` host (the iii SDKs' default engine URL is ws://127.0.0.1:49134, the default;
    /// with --spawn, a free port).
    #[arg(long)]
    pub listen: Option<String>,
    /// Start the harness yourself: this shell command, once per harness host of each run, with
    /// III_URL set to the engine's URL for the host and RIG_HOST to the host. A crash kills its
    /// process group (SIGKILL), a restart runs the command again, a pause stops it (SIGSTOP)
    /// and continues it (SIGCONT).
    #[arg(long, value_name = "CMD")]
    pub spawn: Option<String>,
    /// Where the started processes' output goes, a file per process start (default: beside the
    /// --trace file, in STEM.processes/; else a fresh folder in the system's temporary folder).
    #[arg(long, requires = "spawn")]
    pub logs: Option<PathBuf>,
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
    #[arg(long, default_value_t = 0, value_parser = super::parse_seed, allow_hyphen_values = true)]
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
    /// Known failures, as for `rig run` (a baseline of harness `live`).
    #[command(flatten)]
    pub baseline: BaselineArgs,
}

/// `rig live`. The external harness is judged by the reference harness's policies; `rig` names
/// the binary for the command that runs a scenario again.
pub fn command(args: LiveArgs, rig: &Harness) -> ExitCode {
    crate::interrupt::wind_down();
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let selected = match selected_runs(&scenarios, Some(&args.policy), rig) {
        Ok(selected) => selected,
        Err(message) => return bad_input(&message),
    };
    if let Some(Err(why)) = args.time_scale.map(check_time_scale) {
        return bad_input(&why);
    }
    let known = match args.baseline.load(LIVE) {
        Ok(known) => known,
        Err(code) => return code,
    };
    let mut ledger = Failures::new(known.judged.iter().chain(known.write.iter()));
    // Everything is checked before anything runs: what live mode cannot run, or the harness
    // does not serve, is skipped with the reason, and the rest runs.
    let processes = if args.spawn.is_some() { Processes::Owned } else { Processes::Connected };
    let mut prepared = Vec::new();
    let declared = args.capabilities.clone().unwrap_or_else(Capabilities::all);
    let mut skipped = 0u64;
    for super::Pair { scenario, policy_run: run, .. } in selected {
        let skip = match scenario.requirements(&run.policy, false).unmet(LIVE, &declared) {
            Some(skip) => skip,
            None => match prepare_live(scenario, Some(&run.policy), args.time_scale, processes) {
                Ok(ready) => {
                    prepared.push((ready, scenario, run));
                    continue;
                }
                Err(reasons) => Skip::not_live(LIVE, reasons),
            },
        };
        let skipped_run = SkippedRun {
            scenario: scenario.path.display().to_string(),
            policy: run.policy.clone(),
            seed: args.seed,
            skip,
        };
        if args.json {
            out!("{}", report::skip_json(&skipped_run));
        } else {
            out!("{}", report::skip_line(&skipped_run.scenario, &skipped_run.policy, &skipped_run.skip));
        }
        skipped += 1;
    }
    if prepared.is_empty() {
        return bad_input("every run was skipped (see why above), so nothing was tested");
    }
    let listen = args
        .listen
        .clone()
        .unwrap_or_else(|| if args.spawn.is_some() { "127.0.0.1:0" } else { "127.0.0.1:49134" }.to_string());
    let address: SocketAddr = match listen.parse() {
        Ok(address) => address,
        Err(_) => return bad_input(&format!("--listen `{listen}`: expected IP:PORT, such as 127.0.0.1:49134")),
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
    let spawn = match args.spawn.as_ref().map(|command| spawn_options(command, &args)).transpose() {
        Ok(spawn) => spawn,
        Err(message) => return bad_input(&message),
    };
    let scale = args.time_scale.unwrap_or(1.0);
    // The first line on stderr, so a script starting `rig live` on port 0 can read the address.
    err!("rig live: listening on {}", listener.url("harness"));
    let timing = if scale == 1.0 { String::new() } else { format!(", every scenario timing scaled by {scale}") };
    match &spawn {
        Some(spawn) => err!(
            "rig live: starting `{}` for each harness host of each run (III_URL, RIG_HOST), its output in {}; real \
             time{timing}; {NO_REPLAY}",
            spawn.command,
            spawn.logs.display()
        ),
        None => err!(
            "rig live: connect the harness there (ws://{}/HOST for another harness host); real time{timing}; {NO_REPLAY}",
            listener.address()
        ),
    }
    let (mut passed, mut failed, mut void, mut again) = (0u64, 0u64, 0u64, 0u64);
    // Runs that failed before they could be judged: no baseline lists those.
    let mut not_made = 0u64;
    let total = prepared.len();
    let mut made = 0u64;
    'runs: for (index, (first, original, run)) in prepared.iter().enumerate() {
        if output::lost() || crate::interrupt::requested() {
            break;
        }
        for ignored in &first.ignored {
            err!("rig live: {}: {ignored}", first.scenario.path.display());
        }
        // A void run is made again, slower, up to VOID_RETRIES times (rig/docs/live.md).
        let (mut attempt, mut attempt_scale, mut slower_ready) = (0, scale, None);
        let outcome = loop {
            attempt += 1;
            let ready = slower_ready.as_ref().unwrap_or(first);
            let path = ready.scenario.path.display().to_string();
            let options = LiveOptions {
                policy: run.policy.clone(),
                seed: args.seed,
                time_scale: attempt_scale,
                connect_timeout_ms: args.connect_timeout_ms,
                quiet_ms: args.quiet_ms,
                command: rerun_command(&args, &rig.program, &path, address, attempt_scale),
                spawn: spawn.clone(),
            };
            let outcome = match run_live(&listener, ready, run, &options) {
                Ok(outcome) => outcome,
                Err(why) => {
                    err!("error: {path}: {why}");
                    failed += 1;
                    not_made += 1;
                    continue 'runs;
                }
            };
            print_outcome(&outcome, &args, address, spawn.as_ref(), (attempt, attempt_scale));
            if let Some(sink) = trace_out.as_mut() {
                sink.write(trace_lines(&outcome).as_bytes());
            }
            if outcome.void.is_none() || crate::interrupt::requested() || attempt > VOID_RETRIES {
                break outcome;
            }
            let (next, ready) = slower(original, &run.policy, (scale, attempt_scale), processes);
            let Some(ready) = ready else { break outcome };
            let waited = wait_for_time_kept(late_ms_max(&ready.scenario));
            err!(
                "rig live: {path} [{}] was void; making it again at time scale {next} (the machine kept time again \
                 after {waited} ms)",
                run.policy
            );
            again += 1;
            (attempt_scale, slower_ready) = (next, Some(ready));
        };
        made += 1;
        // A void run says nothing of the harness: it neither keeps nor contradicts a baseline entry.
        if known.any() && outcome.void.is_none() {
            ledger.record(&outcome);
        }
        if outcome.void.is_some() {
            void += 1;
        } else if outcome.passed {
            passed += 1;
        } else {
            failed += 1;
            // No worker at all: the runs after this one would wait as long for nothing.
            if outcome.failures.first().is_some_and(|f| f.starts_with("no worker registered")) && index + 1 < total {
                let skipped = total - index - 1;
                err!("rig live: stopping: no harness worker came; {skipped} more run(s) not run");
                failed += skipped as u64;
                not_made += skipped as u64;
                break;
            }
        }
    }
    if let Err(code) = trace_out.map_or(Ok(()), |sink| sink.finish()) {
        return code;
    }
    let json = args.json;
    let judged = match known.failures_end(&ledger, &mut |line| if json { err!("{line}") } else { out!("{line}") }) {
        Ok(judged) => judged,
        Err(code) => return code,
    };
    if args.json {
        if let Some(line) = super::interrupted_json(made, total as u64) {
            out!("{line}");
        }
    } else {
        let retried = if again > 0 { format!("; {again} void run(s) made again, slower") } else { String::new() };
        out!("{passed} passed, {failed} failed, {skipped} skipped, {void} void (live){retried}");
        if let Some(line) = super::interrupted(made, total as u64) {
            out!("{line}");
        }
    }
    // With a baseline, its verdict replaces "anything failed"; a run that could not be made fails either way.
    let failing = match judged {
        Some(clean) => !clean || not_made > 0,
        None => failed > 0,
    };
    if failing {
        ExitCode::from(EXIT_FAILED)
    } else if void > 0 {
        err!("rig live: {void} run(s) void after every retry: the machine did not keep real time, so they say nothing");
        ExitCode::from(EXIT_VOID)
    } else {
        ExitCode::SUCCESS
    }
}

/// The exit status of `rig live` when a run was void after every retry and none failed:
/// nothing failed, and not everything was tested (75: `EX_TEMPFAIL`, "try again later").
pub const EXIT_VOID: u8 = 75;

/// A live run's report: its line (or JSON object), saying which attempt it was and its time scale.
fn print_outcome(
    outcome: &RunOutcome,
    args: &LiveArgs,
    address: SocketAddr,
    spawn: Option<&SpawnOptions>,
    (attempt, scale): (u32, f64),
) {
    if args.json {
        let mut line = report::json_line(outcome);
        line["live"] = serde_json::json!({
            "listen": address.to_string(), "time_scale": scale, "attempt": attempt, "replay": NO_REPLAY
        });
        if let Some(spawn) = spawn {
            line["live"]["spawn"] = serde_json::json!({ "command": spawn.command, "output": spawn.logs });
        }
        out!("{line}");
    } else {
        let output = spawn.map(|s| format!("; process output in {}", s.logs.display())).unwrap_or_default();
        let attempt = if attempt > 1 { format!("; attempt {attempt}") } else { String::new() };
        out!("{}\n    live: time scale {scale}{attempt}; no bit-for-bit replay{output}", report::human(outcome));
    }
}

/// The command that runs a scenario live again, as this run did (not a replay), at `scale`.
fn rerun_command(args: &LiveArgs, program: &str, scenario: &str, address: SocketAddr, scale: f64) -> String {
    let mut command = match &args.spawn {
        Some(spawn) => format!("{program} live {scenario} --spawn {} --policy {}", shell_quoted(spawn), args.policy),
        None => format!("{program} live {scenario} --listen {address} --policy {}", args.policy),
    };
    if args.time_scale.is_some() || scale != 1.0 {
        command.push_str(&format!(" --time-scale {scale}"));
    }
    command
}

/// `text` as one word for a POSIX shell.
fn shell_quoted(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// How to start the harness processes; their output folder, made now, so a bad one is bad
/// input before anything runs.
fn spawn_options(command: &str, args: &LiveArgs) -> Result<SpawnOptions, String> {
    if command.trim().is_empty() {
        return Err("--spawn: expected the command that starts your harness".into());
    }
    let logs = match (&args.logs, &args.trace) {
        (Some(folder), _) => folder.clone(),
        (None, Some(trace)) if trace != Path::new("-") => {
            let stem = trace.file_stem().map_or_else(|| "trace".into(), |s| s.to_string_lossy().into_owned());
            trace.with_file_name(format!("{stem}.processes"))
        }
        _ => std::env::temp_dir().join(format!("rig-live-{}", std::process::id())),
    };
    std::fs::create_dir_all(&logs)
        .map_err(|e| format!("cannot write the processes' output to {}: {e}", logs.display()))?;
    Ok(SpawnOptions { command: command.to_string(), logs })
}

/// `--live --spawn CMD` of `rig sweep` and `rig explore`: every run of the sweep or the
/// exploration made live against the harness process the command starts.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LiveSweepArgs {
    /// Make every run live, against the harness process --spawn starts for it (each run on a
    /// loopback port of its own, so --jobs N runs N worlds at once).
    #[arg(long, requires = "spawn")]
    pub live: bool,
    /// With --live: the shell command that starts your harness, as for `rig live --spawn`.
    #[arg(long, value_name = "CMD", requires = "live")]
    pub spawn: Option<String>,
    /// With --live: multiply every timing of the scenarios by this, as for `rig live`.
    #[arg(long, requires = "live")]
    pub time_scale: Option<f64>,
    /// With --live: where the processes' output goes, a file per process start (default: in
    /// `processes/` under --out, else a fresh folder in the system's temporary folder).
    #[arg(long, requires = "live")]
    pub logs: Option<PathBuf>,
}

impl LiveSweepArgs {
    /// The live runs asked for, if any; bad input when they cannot be set up. Says on stderr
    /// what a live run is.
    pub(crate) fn runs(&self, rig: &Harness, out: Option<&Path>) -> Result<Option<LiveRuns>, ExitCode> {
        let Some(command) = self.spawn.as_deref().filter(|_| self.live) else { return Ok(None) };
        if let Some(Err(why)) = self.time_scale.map(check_time_scale) {
            return Err(bad_input(&why));
        }
        if command.trim().is_empty() {
            return Err(bad_input("--spawn: expected the command that starts your harness"));
        }
        let logs = match (&self.logs, out) {
            (Some(folder), _) => folder.clone(),
            (None, Some(out)) => out.join("processes"),
            (None, None) => std::env::temp_dir().join(format!("rig-live-{}", std::process::id())),
        };
        if let Err(e) = std::fs::create_dir_all(&logs) {
            return Err(bad_input(&format!("cannot write the processes' output to {}: {e}", logs.display())));
        }
        let spawn = SpawnOptions { command: command.to_string(), logs };
        let scale = self.time_scale.map(|s| format!(", every scenario timing scaled by {s}")).unwrap_or_default();
        err!(
            "rig: live: starting `{command}` for each harness host of each run (III_URL, RIG_HOST), its output in {}; \
             real time{scale}; {NO_REPLAY}",
            spawn.logs.display()
        );
        let options = LiveSweepOptions {
            spawn,
            time_scale: self.time_scale,
            connect_timeout_ms: 30_000,
            quiet_ms: 1_000,
            // `live` is a command of the `rig` binary only: a harness's own binary (rig::cli::main)
            // sweeps live, but its findings rerun live with `rig live`.
            program: if rig.name() == "reference" { rig.program.clone() } else { "rig".into() },
        };
        Ok(Some(LiveRuns::new(options, Arc::clone(&rig.factory))))
    }
}

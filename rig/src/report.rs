//! What a run looks like to a person (one line, plus the story when it failed), to a machine
//! (one JSON object per line), and to a snapshot (a readable summary without wall-clock figures).

use crate::run::RunOutcome;
use crate::trace::{Event, EventKind};
use serde_json::{json, Value};
use std::fmt::Write as _;

/// How many trace events a failure report shows.
const EXCERPT_EVENTS: usize = 25;
/// How long a payload may get in a one-line rendering before it is cut.
const PAYLOAD_CHARS_MAX: usize = 160;

/// One line per run; a failure adds what failed, a trace excerpt and the repro command.
pub fn human(outcome: &RunOutcome) -> String {
    let verdict = if outcome.passed { "PASS" } else { "FAIL" };
    let mut line = format!(
        "{verdict} {} [{}] seed={} sim={}ms wall={}us steps={} hash={}",
        outcome.scenario,
        outcome.policy.name(),
        outcome.seed,
        outcome.sim_ms,
        outcome.wall_us,
        outcome.steps,
        &outcome.trace_hash[..12]
    );
    if !outcome.violations.is_empty() {
        let fired = fired(outcome);
        let _ = write!(line, " violations={}", fired.join(","));
        if outcome.expected_violations.iter().all(|o| fired.contains(&o.name()))
            && !outcome.expected_violations.is_empty()
        {
            line.push_str(" (expected)");
        }
    }
    let unresolved: Vec<String> = outcome
        .unresolved()
        .map(|a| {
            format!(
                "{} {}/{} owner={}{}",
                a.class,
                a.session_id,
                a.action_id,
                a.owner,
                a.reason.as_ref().map_or(String::new(), |r| format!(" ({r})"))
            )
        })
        .collect();
    if !outcome.actions.is_empty() {
        let complete = outcome.actions.len() - unresolved.len();
        let _ = write!(line, "\n    actions: {complete} complete, {} unresolved", unresolved.len());
        for action in &unresolved {
            let _ = write!(line, "\n      {action}");
        }
    }
    if outcome.passed {
        return line;
    }
    for failure in &outcome.failures {
        let _ = write!(line, "\n    - {failure}");
    }
    let _ = write!(line, "\n    trace (last {EXCERPT_EVENTS} key events):");
    let key: Vec<&Event> = outcome.trace.events().iter().filter(|e| is_key_event(e)).collect();
    for event in &key[key.len().saturating_sub(EXCERPT_EVENTS)..] {
        let _ = write!(line, "\n      {}", render_event(event));
    }
    let _ = write!(line, "\n    repro: {}", outcome.repro());
    line
}

/// The `--json` object of one run.
pub fn json_line(outcome: &RunOutcome) -> Value {
    json!({
        "scenario": outcome.scenario,
        "policy": outcome.policy.name(),
        "seed": outcome.seed,
        "passed": outcome.passed,
        "trace_hash": outcome.trace_hash,
        "sim_ms": outcome.sim_ms,
        "wall_us": outcome.wall_us,
        "steps": outcome.steps,
        "effects": outcome.effects,
        "violations": fired(outcome),
        "violation_details": outcome.violations,
        "expected_violations": outcome.expected_violations.iter().map(|o| o.name()).collect::<Vec<_>>(),
        "failures": outcome.failures,
        "ledger": ledger(outcome),
        "actions": outcome.actions,
        "unresolved": outcome.unresolved().collect::<Vec<_>>(),
        "repro": outcome.repro(),
    })
}

/// The oracles that fired, each named once, in a fixed order.
fn fired(outcome: &RunOutcome) -> Vec<&'static str> {
    let fired: std::collections::BTreeSet<crate::oracle::Oracle> =
        outcome.violations.iter().map(|v| v.oracle).collect();
    fired.into_iter().map(|o| o.name()).collect()
}

/// Every line of the effect ledger: each request for an external effect and what became of it.
fn ledger(outcome: &RunOutcome) -> Vec<Value> {
    outcome
        .trace
        .events()
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Effect { .. }))
        .map(|e| {
            let mut line = e.to_json();
            if let Value::Object(fields) = &mut line {
                fields.remove("kind");
            }
            line
        })
        .collect()
}

/// Frames are the bulk of a trace and rarely the story; everything else is.
fn is_key_event(event: &Event) -> bool {
    !matches!(event.kind, EventKind::Frame { .. })
}

fn shorten(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= PAYLOAD_CHARS_MAX {
        return text;
    }
    let cut: String = text.chars().take(PAYLOAD_CHARS_MAX).collect();
    format!("{cut}…")
}

/// One event on one line: time, host, what.
pub fn render_event(event: &Event) -> String {
    let what = match &event.kind {
        EventKind::Frame { direction, peer, frame, function_id, .. } => {
            format!("frame {direction} {peer} {frame} {}", function_id.as_deref().unwrap_or(""))
        }
        EventKind::Call { function, payload, .. } => format!("call {function} {}", shorten(payload)),
        EventKind::Commit { scope, key, value, version } => {
            format!("commit {scope}/{key} v{version} {}", shorten(value))
        }
        EventKind::Effect { effect, action, idempotency_key, token, accepted, reason, .. } => format!(
            "effect {effect} action={action} key={} token={} {} ({reason})",
            idempotency_key.as_deref().unwrap_or("-"),
            token.map_or_else(|| "-".to_string(), |t| t.to_string()),
            if *accepted { "accepted" } else { "refused" }
        ),
        EventKind::Lease { domain, owner, token, expires_at_ms } => {
            format!("lease {domain} to {owner} token={token} until {expires_at_ms} ms")
        }
        EventKind::Fenced { scope, key, domain, token, accepted } => format!(
            "fenced write {scope}/{key} under {domain} token={token} {}",
            if *accepted { "accepted" } else { "rejected" }
        ),
        EventKind::Cut { cut, action, function } => format!("cut #{} {action} on {function}", cut + 1),
        EventKind::ProxyRule { rule, action, direction, frame } => {
            format!("proxy rule #{} {action} {direction} {}", rule + 1, shorten(frame))
        }
        EventKind::Rpc { name, function, outcome } => format!("rpc {name} ({function}) -> {}", shorten(outcome)),
        EventKind::Control { action, target } => format!("{action} {target}"),
        EventKind::Note { what, detail } => format!("note {what} {}", shorten(detail)),
        EventKind::Limit { what } => format!("LIMIT {what}"),
    };
    format!("{:>9} ms  {:<8} {what}", event.at_ms, event.host)
}

/// The snapshot section of one policy run: durable state, ledger, RPC outcomes, verdicts and
/// the key events. Simulated times only, so it is the same on every machine.
pub fn snapshot_section(outcome: &RunOutcome) -> String {
    let mut text = String::new();
    let expected: Vec<&str> = outcome.expected_violations.iter().map(|o| o.name()).collect();
    let _ = writeln!(text, "## policy {} (seed {})", outcome.policy.name(), outcome.seed);
    let _ = writeln!(text, "passed: {}", outcome.passed);
    let _ = writeln!(text, "expected violations: [{}]", expected.join(", "));
    for violation in &outcome.violations {
        let _ = writeln!(text, "violation {}: {}", violation.oracle.name(), violation.detail);
    }
    for failure in &outcome.failures {
        let _ = writeln!(text, "failure: {failure}");
    }
    let _ = writeln!(text, "sim_ms: {}", outcome.sim_ms);
    let _ = writeln!(text, "effects: {}", json!(outcome.effects));
    if !outcome.actions.is_empty() {
        let _ = writeln!(text, "actions:");
        for action in &outcome.actions {
            let reason = action.reason.as_ref().map_or(String::new(), |r| format!(" ({r})"));
            let _ = writeln!(
                text,
                "  {} {}/{} {} owner={}{reason}",
                action.class, action.session_id, action.action_id, action.tool, action.owner
            );
        }
    }
    let _ = writeln!(text, "rpc:");
    for (name, result) in &outcome.rpc {
        let _ = writeln!(text, "  {name}: {result}");
    }
    let _ = writeln!(text, "state:");
    for (scope, key, value) in &outcome.state {
        let _ = writeln!(text, "  {scope}/{key}: {value}");
    }
    let _ = writeln!(text, "events:");
    for event in outcome.trace.events().iter().filter(|e| is_key_event(e)) {
        let _ = writeln!(text, "  {}", render_event(event));
    }
    text
}

/// The runs of one scenario under one policy in a matrix, folded into what CI needs back.
pub struct MatrixCase {
    pub scenario: String,
    pub policy: &'static str,
    pub runs: u64,
    pub failed: u64,
    pub wall_us: u64,
    /// The lowest failing seed, its failures and its repro: the smallest case to look at first.
    pub first_failure: Option<(u64, Vec<String>, String)>,
}

impl MatrixCase {
    pub fn new(scenario: String, policy: &'static str) -> Self {
        Self { scenario, policy, runs: 0, failed: 0, wall_us: 0, first_failure: None }
    }

    pub fn record(&mut self, outcome: &RunOutcome) {
        self.runs += 1;
        self.wall_us += outcome.wall_us;
        if outcome.passed {
            return;
        }
        self.failed += 1;
        if self.first_failure.as_ref().is_none_or(|(seed, _, _)| outcome.seed < *seed) {
            self.first_failure = Some((outcome.seed, outcome.failures.clone(), outcome.repro()));
        }
    }
}

/// One line per failing scenario and policy (its lowest failing seed and a repro), then totals.
pub fn matrix_summary(cases: &[MatrixCase], (shard, shards): (u64, u64)) -> String {
    let mut text = String::new();
    for case in cases {
        if let Some((seed, failures, repro)) = &case.first_failure {
            let _ = writeln!(
                text,
                "FAIL {} [{}] {} of {} seeds failed; lowest seed {seed}",
                case.scenario, case.policy, case.failed, case.runs
            );
            for failure in failures.iter().take(3) {
                let _ = writeln!(text, "    - {}", failure.lines().next().unwrap_or_default());
            }
            let _ = writeln!(text, "    repro: {repro}");
        }
    }
    let runs: u64 = cases.iter().map(|c| c.runs).sum();
    let failed: u64 = cases.iter().map(|c| c.failed).sum();
    let _ = write!(text, "shard {shard}/{shards}: {} passed, {failed} failed", runs - failed);
    text
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A JUnit XML report: one test case per scenario and policy, failed if any of its seeds failed.
pub fn junit(cases: &[MatrixCase]) -> String {
    let failures = cases.iter().filter(|c| c.failed > 0).count();
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(xml, "<testsuites><testsuite name=\"rig\" tests=\"{}\" failures=\"{failures}\">", cases.len());
    for case in cases {
        let name = format!("{} [{}]", case.scenario, case.policy);
        let seconds = case.wall_us as f64 / 1e6;
        let _ = write!(xml, "  <testcase classname=\"rig\" name=\"{}\" time=\"{seconds:.3}\"", xml_escape(&name));
        match &case.first_failure {
            None => xml.push_str("/>\n"),
            Some((seed, failures, repro)) => {
                let message = format!("{} of {} seeds failed; lowest seed {seed}", case.failed, case.runs);
                let body = format!("{}\nrepro: {repro}", failures.join("\n"));
                let _ = writeln!(
                    xml,
                    "><failure message=\"{}\">{}</failure></testcase>",
                    xml_escape(&message),
                    xml_escape(&body)
                );
            }
        }
    }
    xml.push_str("</testsuite></testsuites>\n");
    xml
}

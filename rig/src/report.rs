//! What a run looks like to a person (one line, plus the story when it failed), to a machine
//! (one JSON object per line), and to a snapshot (a reviewable claim about the run: its
//! verdict, durable state and replies, and the events that carry meaning, without times).

use crate::capability::Skip;
use crate::run::RunOutcome;
use crate::trace::{Event, EventKind};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fmt::Write as _;

pub mod bounds;

/// How many trace events a failure report shows.
const EXCERPT_EVENTS: usize = 25;
/// Longer one-line JSON is printed indented over several lines in snapshots.
const INLINE_JSON_MAX: usize = 100;

/// One line per run; a failure adds what failed, a trace excerpt and the repro command. A void
/// run (see [`RunOutcome::void`]) is no verdict: `VOID`, and why.
pub fn human(outcome: &RunOutcome) -> String {
    if let Some(why) = &outcome.void {
        return format!(
            "VOID {} [{}] seed={} wall={}us: {why}; neither passed nor failed\n    again: {}",
            outcome.scenario,
            outcome.policy,
            outcome.seed,
            outcome.wall_us,
            outcome.repro()
        );
    }
    let verdict = if outcome.passed { "PASS" } else { "FAIL" };
    let mut line = format!(
        "{verdict} {} [{}] seed={} sim={}ms wall={}us steps={} hash={}",
        outcome.scenario,
        outcome.policy,
        outcome.seed,
        outcome.sim_ms,
        outcome.wall_us,
        outcome.steps,
        &outcome.trace_hash[..12]
    );
    if outcome.harness != "reference" {
        let _ = write!(line, " harness={}", outcome.harness);
    }
    if !outcome.violations.is_empty() {
        let fired = fired(outcome);
        let _ = write!(line, " violations={}", fired.join(","));
        if !outcome.expected_violations.is_empty()
            && outcome.expected_violations.iter().all(|o| fired.contains(&o.name()))
        {
            line.push_str(" (expected)");
        }
    }
    let unresolved: Vec<String> = outcome
        .unresolved()
        .map(|a| {
            let reason = a.reason.as_ref().map_or(String::new(), |r| format!(" ({r})"));
            format!("{} {}/{} owner={}{reason}", a.class, a.session_id, a.action_id, a.owner)
        })
        .collect();
    if let Some(summary) = outcome.recovery.as_ref().and_then(|r| r.summary()) {
        let _ = write!(line, "\n    {summary}");
    }
    if !outcome.actions.is_empty() {
        let complete = outcome.actions.len() - unresolved.len();
        let _ = write!(line, "\n    actions: {complete} complete, {} unresolved", unresolved.len());
        for action in &unresolved {
            let _ = write!(line, "\n      {action}");
        }
    }
    for note in &outcome.notes {
        let _ = write!(line, "\n    note: {note}");
    }
    if outcome.passed {
        return line;
    }
    for failure in bounds::failures(&outcome.failures) {
        let _ = write!(line, "\n    - {failure}");
    }
    let _ = write!(line, "\n    trace (last {EXCERPT_EVENTS} key events):");
    let key: Vec<&Event> = outcome.trace.events().iter().filter(|e| e.is_key()).collect();
    for event in &key[key.len().saturating_sub(EXCERPT_EVENTS)..] {
        let _ = write!(line, "\n      {}", bounds::text(&event.render()));
    }
    let _ = write!(line, "\n    repro: {}", outcome.repro());
    line
}

/// A run not made: its scenario needs what its harness does not declare.
#[derive(Debug, Clone)]
pub struct SkippedRun {
    pub scenario: String,
    pub policy: String,
    pub seed: u64,
    pub skip: Skip,
}

/// A skipped scenario and policy as one line: `SKIP path [policy]: needs ...`.
pub fn skip_line(scenario: &str, policy: &str, skip: &Skip) -> String {
    format!("SKIP {scenario} [{policy}]: {skip}")
}

/// The `--json` object of a skipped run: `passed` is null (neither passed nor failed),
/// `skipped` says why, `missing` names the capabilities lacking.
pub fn skip_json(run: &SkippedRun) -> Value {
    json!({
        "scenario": run.scenario,
        "harness": run.skip.harness,
        "policy": run.policy,
        "seed": run.seed,
        "passed": null,
        "skipped": run.skip.to_string(),
        "missing": run.skip.capabilities(),
        "cannot": run.skip.cannot,
    })
}

/// The `--json` object of one run (`skipped` is null: it ran). Its lists of messages are
/// bounded as the report's are (`failures`: a few per oracle, [`bounds::MESSAGES_MAX`] in all;
/// `violation_details`: [`bounds::ONE_ORACLE_LINES_MAX`] per oracle), with how many there were
/// in `failures_total` and `violation_details_total`; every string value longer than
/// [`bounds::VALUE_BYTES_MAX`] bytes is cut to its start and its length (`--trace` has them whole).
pub fn json_line(outcome: &RunOutcome) -> Value {
    let mut per_oracle: std::collections::BTreeMap<crate::oracle::Oracle, usize> = Default::default();
    let details: Vec<Value> = outcome
        .violations
        .iter()
        .filter(|v| {
            let seen = per_oracle.entry(v.oracle).or_default();
            *seen += 1;
            *seen <= bounds::ONE_ORACLE_LINES_MAX
        })
        .map(|v| json!({ "oracle": v.oracle, "detail": bounds::text(&v.detail) }))
        .collect();
    let line = json!({
        "scenario": outcome.scenario,
        "harness": outcome.harness,
        "policy": outcome.policy,
        "seed": outcome.seed,
        "passed": outcome.passed,
        "skipped": null,
        "trace_hash": outcome.trace_hash,
        "sim_ms": outcome.sim_ms,
        "wall_us": outcome.wall_us,
        "steps": outcome.steps,
        "effects": outcome.effects,
        "violations": fired(outcome),
        "violation_details": details,
        "violation_details_total": outcome.violations.len(),
        "expected_violations": outcome.expected_violations.iter().map(|o| o.name()).collect::<Vec<_>>(),
        "failures": bounds::failures(&outcome.failures),
        "failures_total": outcome.failures.len(),
        "notes": outcome.notes,
        "ledger": ledger(outcome),
        "actions": outcome.actions,
        "unresolved": outcome.unresolved().collect::<Vec<_>>(),
        "recovery": outcome.recovery.as_ref().map(recovery_json),
        "repro": outcome.repro(),
    });
    let mut line = bounds::json(&line);
    if let Some(why) = &outcome.void {
        // No verdict: `passed` is null, as for a skipped run, `void` says why, and nothing the
        // oracles or expectations saw of the run is shown: it says nothing of the harness.
        line["passed"] = Value::Null;
        line["void"] = json!(why);
        for field in ["violations", "violation_details", "expected_violations"] {
            line[field] = json!([]);
        }
        line["failures"] = json!([format!("void: {why}")]);
        line["failures_total"] = json!(1);
        line["violation_details_total"] = json!(0);
    }
    line
}

/// A run's work beyond its uncut workload, as `--json` shows it: per dimension the run's
/// count, its own repeats, the uncut run's count, the extra, the repeated beyond the uncut run's
/// and its bound; then the faults and turns. The uncut run's figures (and those made from them)
/// are null when it was not simulated: the run's own repeats were within the bound, so no uncut
/// run could have made it excessive.
fn recovery_json(recovery: &crate::recovery::Recovery) -> Value {
    let mut fields = serde_json::Map::new();
    let run = recovery.run.total.dimensions();
    let run_repeated = recovery.run.repeated.dimensions();
    let uncut = recovery.uncut.map(|u| u.total.dimensions());
    let (extra, repeated) = (recovery.extra().map(|w| w.dimensions()), recovery.repeated().map(|w| w.dimensions()));
    let bound = recovery.bound().dimensions();
    let at = |figures: Option<[(&str, u64); 3]>, index: usize| figures.map(|f| f[index].1);
    for index in 0..run.len() {
        let line = json!({ "run": run[index].1, "run_repeated": run_repeated[index].1, "uncut": at(uncut, index),
                           "extra": at(extra, index), "repeated": at(repeated, index), "bound": bound[index].1 });
        fields.insert(run[index].0.to_string(), line);
    }
    fields.insert("faults".into(), json!(recovery.faults));
    fields.insert("turns".into(), json!(recovery.turns));
    fields.insert("uncut_measured".into(), json!(recovery.uncut.is_some()));
    fields.insert("excessive".into(), json!(!recovery.excessive().is_empty()));
    Value::Object(fields)
}

/// The oracles that fired, each named once, in a fixed order.
fn fired(outcome: &RunOutcome) -> Vec<&'static str> {
    let fired: BTreeSet<crate::oracle::Oracle> = outcome.violations.iter().map(|v| v.oracle).collect();
    fired.into_iter().map(|o| o.name()).collect()
}

/// Every line of the effect ledger: each request for an external effect and what became of it.
fn ledger(outcome: &RunOutcome) -> Vec<Value> {
    outcome
        .trace
        .events()
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Effect(_)))
        .map(|e| {
            let mut line = e.to_json();
            if let Value::Object(fields) = &mut line {
                fields.remove("kind");
            }
            line
        })
        .collect()
}

/// Whether a field holds a moment in simulated time. Snapshots leave moments out: one extra
/// round trip would move them all, and the claim a snapshot makes is about what happened, not
/// when (scenario files assert the times that matter).
fn is_moment(field: &str) -> bool {
    field == "at_ms" || field.ends_with("_at") || field.ends_with("_at_ms") || field.ends_with("deadline_ms")
}

/// A copy of `value` with every moment in simulated time replaced by `"<time>"`.
fn without_moments(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| {
                    (k.clone(), if is_moment(k) && v.is_number() { json!("<time>") } else { without_moments(v) })
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_moments).collect()),
        other => other.clone(),
    }
}

/// JSON on one line when short, indented under `indent` when long; moments left out.
fn json_block(value: &Value, indent: &str) -> String {
    let value = without_moments(value);
    let compact = value.to_string();
    if compact.chars().count() <= INLINE_JSON_MAX {
        return compact;
    }
    let pretty = serde_json::to_string_pretty(&value).expect("JSON serializes");
    pretty.lines().map(|l| format!("\n{indent}{l}")).collect()
}

/// `label` and a value rendered by [`json_block`]: on the same line, or the block below it.
fn labelled(label: &str, block: &str) -> String {
    if block.starts_with('\n') {
        format!("{label}{block}")
    } else {
        format!("{label} {block}")
    }
}

/// An object's fields as `key=value` on one line (strings bare); a long one becomes a block.
fn fields_line(value: &Value, indent: &str) -> String {
    let value = without_moments(value);
    let Some(fields) = value.as_object() else { return json_block(&value, indent) };
    let line: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={}", proxy::value_text(v))).collect();
    let line = line.join(" ");
    if line.chars().count() <= INLINE_JSON_MAX + 40 {
        line
    } else {
        json_block(&value, indent)
    }
}

/// The events of a run that carry its story. Frames, calls and lease renewals are the bulk of a
/// trace and change with every round trip; the expectations in the scenario file count what
/// matters of them.
fn story_line(event: &Event, indent: &str, leases: &mut BTreeSet<(String, u64)>) -> Option<String> {
    let what = match &event.kind {
        EventKind::Frame { .. } | EventKind::Call { .. } => return None,
        EventKind::Fenced { accepted: true, .. } => return None,
        // A renewal repeats its grant's token: only grants tell the story.
        EventKind::Lease { domain, owner, token, .. } => {
            if !leases.insert((domain.clone(), *token)) {
                return None;
            }
            format!("lease {domain} granted to {owner}, token {token}")
        }
        EventKind::Commit { scope, key, value, .. } => {
            let summary = match value.as_object() {
                None => "deleted".to_string(),
                Some(fields) if fields.contains_key("turn_id") && fields.contains_key("status") => {
                    let step = fields.get("step").map_or(String::new(), |s| format!(" step={s}"));
                    format!("turn_id={} status={}{step}", value["turn_id"], value["status"])
                }
                Some(_) => fields_line(value, indent),
            };
            labelled(&format!("commit {scope}/{key}:"), &summary)
        }
        EventKind::Note { what, detail } => labelled(&format!("note {what}"), &fields_line(detail, indent)),
        EventKind::Rpc { name, outcome, .. } => {
            format!("rpc {name} answered {}", outcome["outcome"].as_str().unwrap_or("?"))
        }
        EventKind::ProxyRule { rule, action, direction, frame } => format!(
            "proxy rule #{} {action} {direction} {} {}",
            rule + 1,
            frame["type"].as_str().unwrap_or("frame"),
            frame["function_id"].as_str().unwrap_or("")
        ),
        other => other.describe(None),
    };
    Some(format!("  {:<8} {what}", event.host))
}

/// The body of one policy run's snapshot section (everything but its heading).
fn snapshot_body(outcome: &RunOutcome) -> String {
    let mut text = String::new();
    let expected: Vec<&str> = outcome.expected_violations.iter().map(|o| o.name()).collect();
    let fired = fired(outcome);
    let _ = writeln!(
        text,
        "verdict: {}; oracles fired: [{}], expected: [{}]",
        if outcome.passed { "passed" } else { "FAILED" },
        fired.join(", "),
        expected.join(", ")
    );
    let violations: Vec<String> =
        outcome.violations.iter().map(|v| format!("{}: {}", v.oracle.name(), v.detail)).collect();
    let grouped = outcome.violations.iter().zip(&violations).map(|(v, line)| (Some(v.oracle.name()), line.as_str()));
    for violation in bounds::messages(grouped) {
        let _ = writeln!(text, "  {violation}");
    }
    for failure in bounds::failures(&outcome.failures) {
        let _ = writeln!(text, "failure: {failure}");
    }
    for broken in bounds::failures(&outcome.broke) {
        let _ = writeln!(text, "broken on purpose: {broken}");
    }
    let effects: Vec<String> = outcome.effects.iter().map(|(kind, n)| format!("{kind}={n}")).collect();
    let _ = writeln!(text, "effects: [{}]", effects.join(", "));
    if !outcome.actions.is_empty() {
        let _ = writeln!(text, "actions:");
        for action in &outcome.actions {
            let reason = action.reason.as_ref().map_or(String::new(), |r| format!(" ({r})"));
            let _ = writeln!(
                text,
                "  {} {}/{} {} status={} owner={}{reason}",
                action.class, action.session_id, action.action_id, action.tool, action.status, action.owner
            );
        }
    }
    for (name, result) in &outcome.rpc {
        let _ = writeln!(text, "{}", labelled(&format!("rpc {name}:"), &json_block(&bounds::json(result), "  ")));
    }
    for (scope, key, value) in &outcome.state {
        let block = json_block(&bounds::json(value), "  ");
        let _ = writeln!(text, "{}", labelled(&format!("state {scope}/{key}:"), &block));
    }
    let _ = writeln!(text, "story:");
    let mut leases = BTreeSet::new();
    for line in outcome.trace.events().iter().filter_map(|e| story_line(e, "    ", &mut leases)) {
        let _ = writeln!(text, "{}", bounds::text(&line));
    }
    text
}

/// A scenario file's snapshot: its description, then one section per distinct policy outcome
/// (policies whose sections would read the same are listed together).
pub fn snapshot(about: &str, outcomes: &[&RunOutcome]) -> String {
    let mut sections: Vec<(Vec<&str>, u64, String)> = Vec::new();
    for outcome in outcomes {
        let body = snapshot_body(outcome);
        match sections.iter_mut().find(|(_, seed, b)| *b == body && *seed == outcome.seed) {
            Some((policies, _, _)) => policies.push(&outcome.policy),
            None => sections.push((vec![&outcome.policy], outcome.seed, body)),
        }
    }
    let mut text = format!("{about}\n");
    for (policies, seed, body) in sections {
        let _ = write!(text, "\n## {} (seed {seed})\n{body}", policies.join(", "));
    }
    text
}

/// A failed run as one line (and its repro), printed the moment it fails.
pub fn failure_line(outcome: &RunOutcome) -> String {
    let first = outcome.failures.first().map_or("", |f| f.lines().next().unwrap_or_default());
    format!(
        "FAIL {} [{}] seed={}: {}\n    repro: {}",
        outcome.scenario,
        outcome.policy,
        outcome.seed,
        bounds::text(first),
        outcome.repro()
    )
}

/// How many seeds a line lists before it says how many more there are.
pub const SEEDS_LISTED_MAX: usize = 20;

/// `3, 5, 8`, or `3, 5, 8 and 17 more` when `total` is more than the seeds listed.
pub fn seed_list(seeds: &[u64], total: u64) -> String {
    let listed: Vec<String> = seeds.iter().take(SEEDS_LISTED_MAX).map(u64::to_string).collect();
    let more = total.saturating_sub(listed.len() as u64);
    if more == 0 {
        listed.join(", ")
    } else {
        format!("{} and {more} more", listed.join(", "))
    }
}

/// The runs of one scenario under one policy in a matrix, folded into what CI needs back.
pub struct MatrixCase {
    pub scenario: String,
    pub policy: String,
    pub runs: u64,
    pub failed: u64,
    /// The first failing seeds, lowest first (up to [`SEEDS_LISTED_MAX`]; `failed` counts them all).
    pub failing_seeds: Vec<u64>,
    /// Runs not made, and why: the harness lacks what the scenario needs.
    pub skipped: u64,
    pub skip: Option<String>,
    pub wall_us: u64,
    /// The lowest failing seed: the smallest case to look at first.
    pub first_failure: Option<FirstFailure>,
    /// The baseline that lists everything this case failed on (`--baseline`): a known failure,
    /// which a quiet summary leaves out and JUnit reports skipped.
    pub known: Option<String>,
}

/// The lowest failing seed of a matrix case, what failed and how to replay it.
pub struct FirstFailure {
    pub seed: u64,
    pub failures: Vec<String>,
    pub repro: String,
    pub trace_hash: String,
    /// Where its timeline, trace and repro were written, when they were.
    pub artifacts: Vec<String>,
}

impl MatrixCase {
    pub fn new(scenario: String, policy: String) -> Self {
        Self {
            scenario,
            policy,
            runs: 0,
            failed: 0,
            failing_seeds: Vec::new(),
            skipped: 0,
            skip: None,
            wall_us: 0,
            first_failure: None,
            known: None,
        }
    }

    /// A run of this case not made, because of `skip`.
    pub fn record_skip(&mut self, skip: &Skip) {
        self.skipped += 1;
        self.skip.get_or_insert_with(|| skip.to_string());
    }

    pub fn record(&mut self, outcome: &RunOutcome) {
        self.runs += 1;
        self.wall_us += outcome.wall_us;
        if outcome.passed {
            return;
        }
        self.failed += 1;
        if self.failing_seeds.len() < SEEDS_LISTED_MAX {
            self.failing_seeds.push(outcome.seed);
        }
        if self.first_failure.as_ref().is_none_or(|first| outcome.seed < first.seed) {
            self.first_failure = Some(FirstFailure {
                seed: outcome.seed,
                failures: outcome.failures.clone(),
                repro: outcome.repro(),
                trace_hash: outcome.trace_hash.clone(),
                artifacts: Vec::new(),
            });
        }
    }
}

/// One line per skipped (unless `failures_only`) and per failing scenario and policy (its
/// failing seeds, what failed at the lowest, a repro and where its timeline is), then totals,
/// naming the harness.
pub fn matrix_summary(cases: &[MatrixCase], (shard, shards): (u64, u64), harness: &str, failures_only: bool) -> String {
    let mut text = String::new();
    for case in cases.iter().filter(|_| !failures_only) {
        if let Some(skip) = &case.skip {
            let _ = writeln!(text, "SKIP {} [{}] {} runs: {skip}", case.scenario, case.policy, case.skipped);
        }
    }
    for case in cases.iter().filter(|case| !(failures_only && case.known.is_some())) {
        if let Some(first) = &case.first_failure {
            let known = case.known.as_ref().map(|b| format!(" (known: the baseline {b} lists it)")).unwrap_or_default();
            let _ = writeln!(
                text,
                "FAIL {} [{}] {} of {} seeds failed; lowest seed {}{known}",
                case.scenario, case.policy, case.failed, case.runs, first.seed
            );
            let _ = writeln!(text, "    failing seeds: {}", seed_list(&case.failing_seeds, case.failed));
            for failure in bounds::failures(&first.failures).iter().take(3) {
                let _ = writeln!(text, "    - {}", failure.lines().next().unwrap_or_default());
            }
            let _ = writeln!(text, "    repro: {}", first.repro);
            for artifact in &first.artifacts {
                let _ = writeln!(text, "    wrote: {artifact}");
            }
        }
    }
    let runs: u64 = cases.iter().map(|c| c.runs).sum();
    let failed: u64 = cases.iter().map(|c| c.failed).sum();
    let skipped: u64 = cases.iter().map(|c| c.skipped).sum();
    let _ = write!(
        text,
        "shard {shard}/{shards}: {} passed, {failed} failed, {skipped} skipped (harness {harness})",
        runs - failed
    );
    text
}

/// What a matrix's JUnit suite says about the run it reports, beyond its cases.
pub struct JunitSuite<'a> {
    /// The harness that ran.
    pub harness: &'a str,
    pub shard: (u64, u64),
    pub seeds: &'a std::ops::Range<u64>,
    pub policy: Option<&'a str>,
    /// When the matrix started, and how long it took (wall clock: this is about CI, not the runs).
    pub started: std::time::SystemTime,
    pub elapsed: std::time::Duration,
    /// What stopped the matrix early, if a signal did (`interrupted by SIGTERM: ...`).
    pub interrupted: Option<&'a str>,
}

/// A JUnit XML report, as nextest writes it: one suite per shard, named with the shard and
/// seeds, so the reports of several shards and nights merge with distinct names; one test case
/// per scenario and policy (class name: the scenario's folder), failed when any of its seeds
/// failed, with the lowest failing seed, its failures and its repro in the failure element.
pub fn junit(cases: &[MatrixCase], suite: &JunitSuite<'_>) -> Result<String, String> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let (shard, shards) = suite.shard;
    let name = format!("rig matrix shard {shard}/{shards} seeds {}..{}", suite.seeds.start, suite.seeds.end);
    let started = chrono::DateTime::<chrono::Utc>::from(suite.started).fixed_offset();
    let mut test_suite = TestSuite::new(name.as_str());
    test_suite.set_timestamp(started).set_time(suite.elapsed);
    test_suite.add_property(("seeds", format!("{}..{}", suite.seeds.start, suite.seeds.end).as_str()));
    test_suite.add_property(("shard", format!("{shard}/{shards}").as_str()));
    test_suite.add_property(("harness", suite.harness));
    if let Some(policy) = suite.policy {
        test_suite.add_property(("policy", policy));
    }
    if let Some(interrupted) = suite.interrupted {
        // A report of part of the shard: a property for tools, and an errored case for people,
        // so a stopped night never reads as a green one.
        test_suite.add_property(("interrupted", interrupted));
        let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
        status.set_message(interrupted).set_type("interrupted");
        let mut case = TestCase::new("(the matrix was interrupted)", status);
        case.set_classname("rig matrix");
        test_suite.add_test_case(case);
    }
    for case in cases {
        let status = match (&case.first_failure, &case.skip) {
            (None, Some(skip)) if case.runs == 0 => {
                let mut status = TestCaseStatus::skipped();
                status.set_message(skip.as_str()).set_type("capability lacking");
                status
            }
            (None, _) => TestCaseStatus::success(),
            (Some(first), _) if case.known.is_some() => {
                let mut status = TestCaseStatus::skipped();
                let baseline = case.known.as_deref().unwrap_or_default();
                status
                    .set_message(format!(
                        "known failure, listed in the baseline {baseline}: {} of {} seeds failed; lowest seed {}",
                        case.failed, case.runs, first.seed
                    ))
                    .set_type("known failure");
                status
            }
            (Some(first), _) => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                let mut description = bounds::failures(&first.failures).join("\n");
                let _ = write!(description, "\nfailing seeds: {}", seed_list(&case.failing_seeds, case.failed));
                let _ = write!(description, "\nrepro: {}", first.repro);
                for artifact in &first.artifacts {
                    let _ = write!(description, "\nwrote: {artifact}");
                }
                status
                    .set_message(format!("{} of {} seeds failed; lowest seed {}", case.failed, case.runs, first.seed))
                    .set_type("rig run failed")
                    .set_description(description);
                status
            }
        };
        let path = std::path::Path::new(&case.scenario);
        let file = path.file_name().map_or_else(|| case.scenario.clone(), |f| f.to_string_lossy().into_owned());
        let folder = path.parent().map_or_else(String::new, |p| p.display().to_string());
        let mut test_case = TestCase::new(format!("{file} [{}]", case.policy), status);
        test_case.set_classname(folder).set_time(std::time::Duration::from_micros(case.wall_us));
        test_suite.add_test_case(test_case);
    }
    let mut report = Report::new("rig");
    report.set_time(suite.elapsed);
    report.add_test_suite(test_suite);
    report.to_string().map(without_root_skipped).map_err(|error| error.to_string())
}

/// quick-junit writes `skipped` on the root `<testsuites>` too; the JUnit schema CI tools
/// validate against (junit-10.xsd, Jenkins xUnit's) allows it only on a `<testsuite>`, which
/// carries the same count. So the root's copy goes.
fn without_root_skipped(xml: String) -> String {
    let Some(root) = xml.find("<testsuites") else { return xml };
    let tag_end = root + xml[root..].find('>').unwrap_or(0);
    let Some(attribute) = xml[root..tag_end].find(" skipped=\"").map(|at| root + at) else { return xml };
    let value_start = attribute + " skipped=\"".len();
    let Some(value_len) = xml[value_start..tag_end].find('"') else { return xml };
    format!("{}{}", &xml[..attribute], &xml[value_start + value_len + 1..])
}

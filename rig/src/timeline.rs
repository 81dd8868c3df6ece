//! A picture of one run: hosts as lanes, simulated time down the side, frames as arrows between
//! the lanes, cuts and dropped frames in red, durable commits, ledger effects and lease tokens
//! where they happened, the oracles that fired at their moment, and long quiet stretches (where
//! the clock skipped ahead) drawn as breaks rather than as empty pages.
//!
//! Two renderings of the same rows: [`html`], one self-contained file with an inline SVG (no
//! script, no network), and [`mermaid`], a sequence diagram that renders in a pull request.
//! Both are read from the run's outcome and trace only, so they work for any harness.

use crate::run::RunOutcome;
use crate::trace::{Event, EventKind};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// A quiet stretch at least this long is drawn as a break.
const BREAK_MS_MIN: u64 = 1_000;
/// At most this many rows are drawn; the rest of the trace is counted, not drawn.
const ROWS_MAX: usize = 2_000;
/// Lanes in the order a reader follows a turn: the client, the workers, the wire, the services.
const LANE_ORDER: [&str; 10] =
    ["driver", "harness", "replacement", "proxy", "engine", "queue", "store", "session", "model", "tickets"];

/// The red of cuts and dropped frames (the browser test looks for it).
pub const CUT_RED: &str = "#d62728";
/// The grey of the lanes' lines (the browser test looks for them).
pub const LANE_GREY: &str = "#8a9bb0";

const FRAME_INK: &str = "#42536b";
const COMMIT_BLUE: &str = "#1f63b4";
const EFFECT_GREEN: &str = "#248a3d";
const REFUSED_ORANGE: &str = "#e07b00";
const LEASE_GOLD: &str = "#a88400";
const NOTE_GREY: &str = "#6b6b6b";
const HEAL_GREEN: &str = "#2a9d55";
const ORACLE_PURPLE: &str = "#7b2fbf";

/// What a row shows.
#[derive(Debug, Clone, PartialEq)]
enum Mark {
    /// A frame between two lanes; `cut` when a proxy rule took it (`dropped`: it never arrived).
    Arrow { from: usize, to: usize, cut: bool, dropped: bool },
    /// Something that happened on one lane.
    Dot { lane: usize, shape: Shape },
    /// A link between two lanes was cut or mended.
    Link { a: usize, b: usize },
    /// Something about the whole world: a heal, a limit, an oracle that fired.
    Band,
    /// A quiet stretch of `ms` with nothing in it.
    Break { ms: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    Square,
    Diamond,
    Circle,
    Cross,
}

/// One row of the picture: when, what mark, in which colour, and what it says.
#[derive(Debug, Clone)]
struct Row {
    at_ms: u64,
    mark: Mark,
    ink: &'static str,
    /// The short label drawn beside the mark (a token, a frame kind), if any.
    tag: String,
    /// The row's line in the description column.
    text: String,
}

/// The lanes and rows of one run.
struct Picture {
    lanes: Vec<String>,
    rows: Vec<Row>,
    /// Rows not drawn beyond [`ROWS_MAX`].
    omitted: usize,
}

/// Runs as one self-contained HTML page: a section per run, each with its inline SVG timeline.
pub fn html(outcomes: &[&RunOutcome]) -> String {
    let title = match outcomes {
        [one] => title(one),
        _ => format!("{} runs", outcomes.len()),
    };
    let mut page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>{STYLE}</style></head>\n<body>\n",
        escape(&title)
    );
    for (index, outcome) in outcomes.iter().enumerate() {
        let picture = Picture::of(outcome);
        let layout = Layout::for_lanes(picture.lanes.len());
        let _ = writeln!(page, "<section id=\"run-{}\">", index + 1);
        page.push_str(&header(outcome));
        let _ = writeln!(page, "<div class=\"lanes\">{}</div>", lanes_svg(&picture, &layout));
        page.push_str(&rows_svg(&picture, &layout));
        page.push_str("</section>\n");
    }
    page.push_str("</body></html>\n");
    page
}

fn title(outcome: &RunOutcome) -> String {
    format!("{} · {} · seed {}", outcome.scenario, who(outcome), outcome.seed)
}

/// Runs as Mermaid sequence diagrams in one Markdown file, a section per run.
pub fn mermaid(outcomes: &[&RunOutcome]) -> String {
    outcomes.iter().map(|outcome| mermaid_section(outcome)).collect::<Vec<_>>().join("\n")
}

fn mermaid_section(outcome: &RunOutcome) -> String {
    let picture = Picture::of(outcome);
    let mut text = format!("# {}: {}\n\n", title(outcome), if outcome.passed { "passed" } else { "FAILED" });
    for failure in crate::report::bounds::failures(&outcome.failures) {
        let _ = writeln!(text, "- {}", failure.lines().next().unwrap_or_default());
    }
    let _ = writeln!(text, "\nRepro: `{}`\n\n```mermaid\nsequenceDiagram", outcome.repro());
    for (index, lane) in picture.lanes.iter().enumerate() {
        let _ = writeln!(text, "    participant L{index} as {}", mermaid_text(lane));
    }
    let (first, last) = (0, picture.lanes.len().saturating_sub(1));
    for row in &picture.rows {
        text.push_str(&mermaid_row(row, first, last));
    }
    if picture.omitted > 0 {
        let _ = writeln!(text, "    Note over L{first},L{last}: {} more rows not drawn", picture.omitted);
    }
    text.push_str("```\n");
    text
}

fn mermaid_row(row: &Row, first: usize, last: usize) -> String {
    let label = mermaid_text(&format!("{} ms · {}", row.at_ms, crate::report::bounds::text(&row.text)));
    let red = row.ink == CUT_RED;
    let line = match &row.mark {
        Mark::Arrow { from, to, dropped, .. } => {
            let arrow = if *dropped { "-x" } else { "->>" };
            format!("    L{from}{arrow}L{to}: {label}\n")
        }
        Mark::Dot { lane, .. } => format!("    Note over L{lane}: {label}\n"),
        Mark::Link { a, b } => format!("    Note over L{},L{}: {label}\n", a.min(b), a.max(b)),
        Mark::Band => format!("    Note over L{first},L{last}: {label}\n"),
        Mark::Break { ms } => format!("    Note over L{first},L{last}: ⋯ {} of quiet ⋯\n", duration(*ms)),
    };
    match (red, row.ink == ORACLE_PURPLE) {
        (true, _) => format!("    rect rgb(255, 214, 214)\n{line}    end\n"),
        (_, true) => format!("    rect rgb(232, 214, 250)\n{line}    end\n"),
        _ => line,
    }
}

/// Mermaid reads `#`, `;` and angle brackets in labels; entity codes keep them text.
fn mermaid_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '#' => out.push_str("#35;"),
            ';' => out.push_str("#59;"),
            '<' => out.push_str("#60;"),
            '>' => out.push_str("#62;"),
            '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

impl Picture {
    fn of(outcome: &RunOutcome) -> Self {
        let events = named_workers(outcome.trace.events());
        let events = &events[..];
        let lanes = lanes(events);
        let index = |host: &str| lanes.iter().position(|l| l == host);
        let mut rows = Vec::new();
        let mut registrations: Vec<&Event> = Vec::new();
        let mut leases = BTreeSet::new();
        for (position, event) in events.iter().enumerate() {
            if is_registration(event) {
                registrations.push(event);
                continue;
            }
            if !registrations.is_empty() {
                rows.push(registration_row(&registrations, &events[position..], &lanes));
                registrations.clear();
            }
            rows.extend(row(event, &events[..position], &index, &mut leases));
        }
        if !registrations.is_empty() {
            rows.push(registration_row(&registrations, &[], &lanes));
        }
        place_oracles(outcome, &mut rows);
        let rows = with_breaks(rows);
        let omitted = rows.len().saturating_sub(ROWS_MAX);
        Self { lanes, rows: rows.into_iter().take(ROWS_MAX).collect(), omitted }
    }
}

/// The events with each connection the engine had not yet heard named (`worker-7`: before its
/// `engine::workers::register`, or after it was gone) under the lane name the same connection
/// has elsewhere in the trace, so notes and lanes name a worker alike.
fn named_workers(events: &[Event]) -> Vec<Event> {
    let names = worker_names(events);
    events
        .iter()
        .map(|event| {
            let mut event = event.clone();
            if let EventKind::Frame { peer, .. } = &mut event.kind {
                if let Some(name) = names.get(peer.as_str()) {
                    *peer = name.as_str().into();
                }
            }
            event
        })
        .collect()
}

/// `worker-N` is the engine's name for a connection it has no other name for.
fn is_unnamed(peer: &str) -> bool {
    peer.strip_prefix("worker-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What each unnamed connection is called elsewhere in the trace: the same connection shows
/// under both names in the two frames of one invocation on one side of the engine (a call it
/// made and its result, or a call it was given and its answer), as when a worker's result
/// comes back after its connection was gone.
fn worker_names(events: &[Event]) -> std::collections::BTreeMap<String, String> {
    let mut sides: std::collections::BTreeMap<(&str, bool), BTreeSet<&str>> = Default::default();
    for event in events {
        let EventKind::Frame { direction, peer, frame, invocation_id: Some(id), .. } = &event.kind else { continue };
        // `true`: the side that made the call (it sent the invocation, it gets the result).
        let caller = (*frame == "invokefunction") != (*direction == "out");
        sides.entry((id.as_str(), caller)).or_default().insert(peer.as_str());
    }
    let mut names = std::collections::BTreeMap::new();
    for peers in sides.values() {
        let (unnamed, named): (Vec<&str>, Vec<&str>) = peers.iter().partition(|p| is_unnamed(p));
        if let ([worker], [name]) = (&unnamed[..], &named[..]) {
            names.entry(worker.to_string()).or_insert_with(|| name.to_string());
        }
    }
    names
}

/// Every host the trace names, in reading order; commits and leases live on `store`.
fn lanes(events: &[Event]) -> Vec<String> {
    let mut hosts = BTreeSet::new();
    for event in events.iter().filter(|e| !is_registration(e)) {
        match &event.kind {
            EventKind::Frame { peer, .. } => {
                hosts.insert(peer.to_string());
                hosts.insert(event.host.to_string());
            }
            EventKind::Commit { .. } | EventKind::Lease { .. } | EventKind::Fenced { .. } => {
                hosts.insert("store".to_string());
            }
            EventKind::Control { action, .. } if action == "heal" => {}
            EventKind::Control { target, .. } => hosts.extend(target.split("<->").map(lane_of_target)),
            _ => {
                hosts.insert(event.host.to_string());
            }
        }
    }
    hosts.insert("engine".to_string());
    hosts.remove("rig");
    let mut lanes: Vec<String> = LANE_ORDER.iter().filter(|l| hosts.remove(**l)).map(|l| l.to_string()).collect();
    lanes.extend(hosts);
    lanes
}

/// `harness until 900 ms` names the lane `harness`.
fn lane_of_target(target: &str) -> String {
    target.split_whitespace().next().unwrap_or(target).to_string()
}

/// The frames by which a worker connects and registers its functions: folded into one row.
fn is_registration(event: &Event) -> bool {
    match &event.kind {
        EventKind::Frame { frame, function_id, .. } => {
            matches!(*frame, "workerregistered" | "registerfunction")
                || function_id.as_deref() == Some("engine::workers::register")
        }
        _ => false,
    }
}

/// The workers that registered in one go, named by the lanes the engine later routes their
/// functions to (a worker is named only once it calls `engine::workers::register`).
fn registration_row(frames: &[&Event], after: &[Event], lanes: &[String]) -> Row {
    let mut functions: BTreeSet<&str> = BTreeSet::new();
    let mut workers = BTreeSet::new();
    for event in frames {
        if let EventKind::Frame { frame: "registerfunction", peer, function_id, .. } = &event.kind {
            functions.extend(function_id.as_deref());
            workers.insert(peer.as_str());
        }
    }
    let mut named: BTreeSet<usize> = BTreeSet::new();
    for event in after {
        if let EventKind::Frame { direction: "out", frame: "invokefunction", peer, function_id: Some(f), .. } =
            &event.kind
        {
            if functions.contains(f.as_str()) {
                named.extend(lanes.iter().position(|l| l == peer));
            }
        }
    }
    let text = if functions.is_empty() {
        format!("{} connection frames", frames.len())
    } else {
        let names: Vec<&str> = named.iter().map(|&l| lanes[l].as_str()).collect();
        let workers = match workers.len() {
            1 => "1 worker".to_string(),
            n => format!("{n} workers"),
        };
        match names.len() {
            0 => format!("{} functions registered by {workers}, none of them called", functions.len()),
            _ => format!("{} functions registered by {workers}, called later at {}", functions.len(), names.join(", ")),
        }
    };
    let engine = lanes.iter().position(|l| l == "engine").unwrap_or(0);
    Row {
        at_ms: frames.last().map_or(0, |e| e.at_ms),
        mark: Mark::Dot { lane: engine, shape: Shape::Circle },
        ink: FRAME_INK,
        tag: String::new(),
        text,
    }
}

/// The row an event draws, if it draws one. Calls are left out: the frames show them.
fn row(
    event: &Event,
    before: &[Event],
    index: &dyn Fn(&str) -> Option<usize>,
    leases: &mut BTreeSet<(String, u64)>,
) -> Option<Row> {
    let lane = |host: &str| index(host).unwrap_or(0);
    let dot = |host: &str, shape, ink, tag: String, text: String| Row {
        at_ms: event.at_ms,
        mark: Mark::Dot { lane: lane(host), shape },
        ink,
        tag,
        text,
    };
    let row = match &event.kind {
        EventKind::Frame { direction, peer, frame, function_id, .. } => {
            let (from, to) =
                if *direction == "in" { (lane(peer), lane("engine")) } else { (lane("engine"), lane(peer)) };
            let text = format!("{frame} {}", function_id.as_deref().unwrap_or("")).trim_end().to_string();
            Row {
                at_ms: event.at_ms,
                mark: Mark::Arrow { from, to, cut: false, dropped: false },
                ink: FRAME_INK,
                tag: text.clone(),
                text,
            }
        }
        EventKind::ProxyRule { rule, action, direction, frame } => {
            proxy_row(event, before, index, (rule, action, direction, frame))
        }
        EventKind::Cut { cut, action, function } => {
            dot(&event.host, Shape::Cross, CUT_RED, action.clone(), format!("cut #{} {action} on {function}", cut + 1))
        }
        EventKind::Interrupt { interrupt, worker, point, action } => dot(
            worker,
            Shape::Cross,
            CUT_RED,
            action.clone(),
            format!("interrupt #{} {action} {worker} at {point}", interrupt + 1),
        ),
        EventKind::Commit { scope, key, value, version } => {
            let what = if value.is_null() { "deleted".to_string() } else { summary(value) };
            let by = if event.host == "store" { String::new() } else { format!(" (put by {})", event.host) };
            dot(
                "store",
                Shape::Square,
                COMMIT_BLUE,
                format!("v{version}"),
                format!("commit {scope}/{key} v{version} {what}{by}"),
            )
        }
        EventKind::Effect(ledgered) => {
            let crate::trace::EffectEvent { effect, action, idempotency_key, token, accepted, reason, .. } =
                &**ledgered;
            dot(
                &event.host,
                Shape::Diamond,
                if *accepted { EFFECT_GREEN } else { REFUSED_ORANGE },
                if *accepted { "effect".into() } else { "refused".into() },
                format!(
                    "ledger: {effect} action={action} key={} token={} {} ({reason})",
                    idempotency_key.as_deref().unwrap_or("-"),
                    token.map_or_else(|| "-".to_string(), |t| t.to_string()),
                    if *accepted { "accepted" } else { "refused" }
                ),
            )
        }
        EventKind::Lease { domain, owner, token, expires_at_ms } => {
            let verb = if leases.insert((domain.clone(), *token)) { "granted" } else { "renewed" };
            dot(
                "store",
                Shape::Circle,
                LEASE_GOLD,
                format!("token {token}"),
                format!("lease {domain} {verb} to {owner}, token {token}, until {expires_at_ms} ms"),
            )
        }
        EventKind::Fenced { scope, key, domain, token, accepted } => dot(
            "store",
            Shape::Square,
            if *accepted { COMMIT_BLUE } else { REFUSED_ORANGE },
            format!("token {token}"),
            format!(
                "fenced write {scope}/{key} under {domain} token {token} {}",
                if *accepted { "accepted" } else { "rejected" }
            ),
        ),
        EventKind::Rpc { name, outcome, .. } => dot(
            &event.host,
            Shape::Circle,
            FRAME_INK,
            String::new(),
            format!("reply to `{name}`: {}", outcome["outcome"].as_str().unwrap_or("?")),
        ),
        EventKind::Control { action, target } => return Some(control_row(event.at_ms, action, target, index)),
        EventKind::Note { what, detail } => {
            let reason = detail["reason"].as_str().map_or(String::new(), |r| format!(": {r}"));
            dot(&event.host, Shape::Circle, NOTE_GREY, what.clone(), format!("{} {what}{reason}", event.host))
        }
        EventKind::Limit { what } => Row {
            at_ms: event.at_ms,
            mark: Mark::Band,
            ink: CUT_RED,
            tag: String::new(),
            text: format!("limit reached: {what}"),
        },
        EventKind::Call { .. } => return None,
    };
    Some(row)
}

/// A frame a proxy rule took: drawn from the frame's sender to the proxy, in red; a dropped
/// frame ends there with a cross. The sender is the peer of the engine's frame with the same
/// invocation id.
fn proxy_row(
    event: &Event,
    before: &[Event],
    index: &dyn Fn(&str) -> Option<usize>,
    (rule, action, direction, frame): (&usize, &String, &String, &Value),
) -> Row {
    let proxy = index("proxy").unwrap_or(0);
    let worker = frame["invocation_id"].as_str().and_then(|id| {
        before.iter().rev().find_map(|e| match &e.kind {
            EventKind::Frame { peer, invocation_id: Some(i), .. } if i == id => index(peer),
            _ => None,
        })
    });
    let engine = index("engine").unwrap_or(0);
    let (from, to) = if direction == "up" { (worker.unwrap_or(proxy), proxy) } else { (engine, proxy) };
    let dropped = action == "drop";
    let kind = frame["type"].as_str().unwrap_or("frame");
    let function = frame["function_id"].as_str().unwrap_or("");
    Row {
        at_ms: event.at_ms,
        mark: Mark::Arrow { from, to, cut: true, dropped },
        ink: CUT_RED,
        tag: [kind, function, if dropped { "dropped" } else { action.as_str() }]
            .iter()
            .filter(|word| !word.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" "),
        text: format!("proxy rule #{} {action}s {direction} {kind} {function}", rule + 1),
    }
}

/// Crashes, partitions and holds are cuts (red); restarts, repairs, releases and heals mend.
fn control_row(at_ms: u64, action: &str, target: &str, index: &dyn Fn(&str) -> Option<usize>) -> Row {
    let cut = matches!(action, "crash" | "partition" | "hold" | "pause");
    let ink = if cut { CUT_RED } else { HEAL_GREEN };
    let text = format!("{action} {target}");
    let mark = match target.split_once("<->") {
        Some((a, b)) => Mark::Link { a: index(a).unwrap_or(0), b: index(b).unwrap_or(0) },
        None if action == "heal" => Mark::Band,
        None => Mark::Dot { lane: index(&lane_of_target(target)).unwrap_or(0), shape: Shape::Cross },
    };
    Row { at_ms, mark, ink, tag: action.to_string(), text }
}

/// A record in a few words: its status and step when it has them, else its JSON, cut short.
fn summary(value: &Value) -> String {
    let fields: Vec<String> = ["status", "step", "turn_id"]
        .iter()
        .filter_map(|f| {
            value
                .get(*f)
                .filter(|v| !v.is_null())
                .map(|v| format!("{f}={}", v.as_str().map_or(v.to_string(), str::to_string)))
        })
        .collect();
    if fields.is_empty() {
        shorten(&value.to_string(), 60)
    } else {
        fields.join(" ")
    }
}

fn shorten(text: &str, chars_max: usize) -> String {
    if text.chars().count() <= chars_max {
        return text.to_string();
    }
    format!("{}…", text.chars().take(chars_max).collect::<String>())
}

/// Each oracle that fired, as a band at its moment: the last `at N ms` its finding names, or
/// the end of the run for oracles that judge the final state (liveness, stranded work).
/// An oracle that fired many times is drawn as many bands as a report shows lines of it (see
/// [`crate::report::bounds`]); the last says how many more there were.
fn place_oracles(outcome: &RunOutcome, rows: &mut Vec<Row>) {
    use crate::report::bounds::{self, ONE_ORACLE_LINES_MAX};
    let mut drawn: std::collections::BTreeMap<crate::oracle::Oracle, usize> = Default::default();
    for violation in &outcome.violations {
        let seen = drawn.entry(violation.oracle).or_default();
        *seen += 1;
        if *seen > ONE_ORACLE_LINES_MAX {
            continue;
        }
        let all = outcome.violations.iter().filter(|v| v.oracle == violation.oracle).count();
        let more = match all - *seen {
            more if *seen == ONE_ORACLE_LINES_MAX && more > 0 => format!(" (and {more} more of this oracle)"),
            _ => String::new(),
        };
        let at_ms = moment(&violation.detail).unwrap_or(outcome.sim_ms);
        let expected = outcome.expected_violations.contains(&violation.oracle);
        let row = Row {
            at_ms,
            mark: Mark::Band,
            ink: ORACLE_PURPLE,
            tag: String::new(),
            text: format!(
                "oracle `{}` fired{}: {}{more}",
                violation.oracle.name(),
                if expected { " (expected under this policy)" } else { "" },
                bounds::text(&violation.detail)
            ),
        };
        let position = rows.iter().position(|r| r.at_ms > at_ms).unwrap_or(rows.len());
        rows.insert(position, row);
    }
}

/// The last moment (`at N ms`) a finding names.
fn moment(detail: &str) -> Option<u64> {
    detail
        .match_indices("at ")
        .filter(|(start, _)| *start == 0 || matches!(detail.as_bytes()[start - 1], b' ' | b'('))
        .filter_map(|(start, _)| detail[start + 3..].split_once(" ms").and_then(|(number, _)| number.parse().ok()))
        .last()
}

/// The rows with a break wherever nothing happened for [`BREAK_MS_MIN`] or more.
fn with_breaks(rows: Vec<Row>) -> Vec<Row> {
    let mut out = Vec::with_capacity(rows.len());
    let mut last_ms = 0;
    for row in rows {
        let gap = row.at_ms.saturating_sub(last_ms);
        if gap >= BREAK_MS_MIN {
            out.push(Row {
                at_ms: row.at_ms,
                mark: Mark::Break { ms: gap },
                ink: NOTE_GREY,
                tag: String::new(),
                text: format!("{} of quiet: simulated time skipped ahead", duration(gap)),
            });
        }
        last_ms = row.at_ms;
        out.push(row);
    }
    out
}

/// A span of simulated time as a person reads it: `850 ms`, `2.5 s`, `29 min 58.8 s`.
fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1e3),
        _ => format!("{} min {:.1} s", ms / 60_000, (ms % 60_000) as f64 / 1e3),
    }
}

/// `1800050` as `1,800,050`.
fn thousands(number: u64) -> String {
    let digits = number.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:16px;color:#1b1f24;background:#fff}\
h1{font-size:18px;margin:0 0 4px}.who{font-size:14px;margin:0 0 4px}\
.meta{font-family:monospace;font-size:12px;color:#444}\
.pass{color:#248a3d}.fail{color:#d62728}ul{margin:6px 0;font-size:13px}\
.legend span{display:inline-block;margin-right:14px;font-size:12px}\
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}\
.lanes{position:sticky;top:0;z-index:1;background:#fff}svg{display:block}\
svg text{font-family:monospace;font-size:11px}";

/// Who ran and under which policy, as the section's heading says it: the reference harness is
/// run as one of its policies; a user's harness is held to a policy's expectations.
fn who(outcome: &RunOutcome) -> String {
    if outcome.harness == "reference" {
        format!("policy {}", outcome.policy)
    } else {
        format!("harness {} (policy {})", outcome.harness, outcome.policy)
    }
}

fn header(outcome: &RunOutcome) -> String {
    let who = if outcome.harness == "reference" {
        format!("policy <b>{}</b> of the reference harness", escape(&outcome.policy))
    } else {
        format!(
            "harness <b>{}</b>, held to the <b>{}</b> policy's expectations",
            escape(&outcome.harness),
            escape(&outcome.policy)
        )
    };
    let expected: Vec<String> = outcome.expected_violations.iter().map(|o| format!("`{}`", o.name())).collect();
    let known_bad = match expected.is_empty() {
        true => String::new(),
        false => format!(" · known-bad: expected to trip {}", expected.join(", ")),
    };
    let mut text = format!(
        "<h1>{} · seed {} <span class=\"{}\">{}</span></h1>\n<div class=\"who\">{who}{known_bad}</div>\n\
         <div class=\"meta\">{} ms simulated · {} steps · trace {}<br>repro: {}</div>\n",
        escape(&outcome.scenario),
        outcome.seed,
        if outcome.passed { "pass" } else { "fail" },
        if outcome.passed { "PASS" } else { "FAIL" },
        outcome.sim_ms,
        outcome.steps,
        &outcome.trace_hash[..outcome.trace_hash.len().min(16)],
        escape(&outcome.repro())
    );
    if !outcome.failures.is_empty() {
        text.push_str("<ul>");
        for failure in crate::report::bounds::failures(&outcome.failures) {
            let _ = write!(text, "<li class=\"fail\">{}</li>", escape(failure.lines().next().unwrap_or_default()));
        }
        text.push_str("</ul>\n");
    }
    text.push_str("<p class=\"legend\">");
    for (ink, what) in [
        (FRAME_INK, "frame at the engine"),
        (CUT_RED, "cut, dropped frame, crash"),
        (COMMIT_BLUE, "durable commit"),
        (EFFECT_GREEN, "effect in the ledger"),
        (REFUSED_ORANGE, "refused effect or write"),
        (LEASE_GOLD, "lease token"),
        (ORACLE_PURPLE, "oracle fired"),
        (HEAL_GREEN, "heal, restart, repair"),
    ] {
        let _ = write!(text, "<span><i style=\"background:{ink}\"></i>{what}</span>");
    }
    text.push_str("</p>\n");
    text
}

/// The widest picture that fits a 1,280 px window: the body's margins and a scrollbar off.
pub const PAGE_WIDTH_MAX: usize = 1_232;
/// The band behind the lane names, which stay at the top of the window while the rows scroll.
pub const LANE_HEAD_BAND: &str = "#e8edf3";
const TIME_WIDTH: usize = 90;
const LANE_WIDTH_MIN: usize = 84;
const LANE_WIDTH_MAX: usize = 112;
/// The description column is never narrower than this; lanes narrow first (down to their least).
const TEXT_WIDTH_MIN: usize = 420;
const HEAD_HEIGHT: usize = 30;
const ROW_HEIGHT: usize = 18;
/// Each further line of a description that wraps.
const LINE_HEIGHT: usize = 13;
const LINES_MAX: usize = 2;
const BREAK_HEIGHT: usize = 30;
/// The advance of one monospace character at 11 px and at 9 px (0.6 em, rounded up).
const CHAR_PX: f64 = 6.7;
const SMALL_CHAR_PX: f64 = 5.5;

/// Where things go for a given number of lanes.
struct Layout {
    lane_width: usize,
    lanes_right: usize,
    width: usize,
    /// Characters of description per line.
    text_chars: usize,
}

impl Layout {
    fn for_lanes(lanes: usize) -> Self {
        let room = PAGE_WIDTH_MAX - TIME_WIDTH - TEXT_WIDTH_MIN;
        let lane_width = (room / lanes.max(1)).clamp(LANE_WIDTH_MIN, LANE_WIDTH_MAX);
        let lanes_right = TIME_WIDTH + lane_width * lanes;
        let width = PAGE_WIDTH_MAX.max(lanes_right + TEXT_WIDTH_MIN);
        let text_chars = ((width - lanes_right - 16) as f64 / CHAR_PX) as usize;
        Self { lane_width, lanes_right, width, text_chars }
    }

    fn lane_x(&self, lane: usize) -> usize {
        TIME_WIDTH + self.lane_width * lane + self.lane_width / 2
    }

    /// The row's description, wrapped to the column.
    fn lines(&self, row: &Row) -> Vec<String> {
        wrap(&row.text, self.text_chars, LINES_MAX)
    }

    fn height(&self, row: &Row) -> usize {
        match row.mark {
            Mark::Break { .. } => BREAK_HEIGHT,
            _ => ROW_HEIGHT + LINE_HEIGHT * (self.lines(row).len().max(1) - 1),
        }
    }
}

/// `text` in lines of at most `chars`, broken at spaces where it can, at most `lines_max` of
/// them (the last cut short with an ellipsis).
fn wrap(text: &str, chars: usize, lines_max: usize) -> Vec<String> {
    let chars = chars.max(8);
    let mut lines: Vec<String> = Vec::new();
    let mut rest: Vec<char> = text.chars().collect();
    while !rest.is_empty() && lines.len() < lines_max {
        if rest.len() <= chars {
            lines.push(rest.iter().collect());
            return lines;
        }
        if lines.len() + 1 == lines_max {
            lines.push(shorten(&rest.iter().collect::<String>(), chars - 1));
            return lines;
        }
        let cut = rest[..=chars].iter().rposition(|c| *c == ' ').filter(|&at| at > chars / 2).unwrap_or(chars);
        lines.push(rest[..cut].iter().collect::<String>().trim_end().to_string());
        rest.drain(..cut);
        while rest.first() == Some(&' ') {
            rest.remove(0);
        }
    }
    lines
}

/// A small label, kept off its neighbours' text: white behind it, so a lane line it crosses
/// does not cut through it.
fn label(x: usize, y: usize, anchor: &str, ink: &str, text: &str) -> String {
    format!(
        "<text x=\"{x}\" y=\"{y}\" text-anchor=\"{anchor}\" font-size=\"9\" fill=\"{ink}\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">{}</text>",
        escape(text)
    )
}

fn small_width(text: &str) -> usize {
    (text.chars().count() as f64 * SMALL_CHAR_PX).ceil() as usize
}

/// The lane names on their band: a picture of its own, kept in view while the rows scroll.
fn lanes_svg(picture: &Picture, layout: &Layout) -> String {
    let width = layout.width;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{HEAD_HEIGHT}\" viewBox=\"0 0 {width} {HEAD_HEIGHT}\">\n\
         <rect x=\"0\" y=\"0\" width=\"{}\" height=\"{HEAD_HEIGHT}\" fill=\"{LANE_HEAD_BAND}\"/>\n\
         <text x=\"8\" y=\"19\" font-weight=\"bold\">simulated time</text>\n",
        layout.lanes_right
    );
    for (index, lane) in picture.lanes.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"19\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>",
            layout.lane_x(index),
            escape(lane)
        );
    }
    let _ = writeln!(svg, "<text x=\"{}\" y=\"19\" font-weight=\"bold\">what happened</text>", layout.lanes_right + 12);
    svg.push_str("</svg>\n");
    svg
}

/// The rows under the lanes, and each row's description beside them.
fn rows_svg(picture: &Picture, layout: &Layout) -> String {
    let heights: Vec<usize> = picture.rows.iter().map(|r| layout.height(r)).collect();
    let height = heights.iter().sum::<usize>() + ROW_HEIGHT * (1 + usize::from(picture.omitted > 0));
    let (width, lanes_right) = (layout.width, layout.lanes_right);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">\n\
         <defs><marker id=\"head\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">\
         <path d=\"M0,0 L10,5 L0,10 z\" fill=\"{FRAME_INK}\"/></marker>\
         <marker id=\"cuthead\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">\
         <path d=\"M0,0 L10,5 L0,10 z\" fill=\"{CUT_RED}\"/></marker></defs>\n"
    );
    for index in 0..picture.lanes.len() {
        let x = layout.lane_x(index);
        let _ = writeln!(
            svg,
            "<line x1=\"{x}\" y1=\"0\" x2=\"{x}\" y2=\"{height}\" stroke=\"{LANE_GREY}\" stroke-width=\"3\"/>"
        );
    }
    let mut y = 0;
    let mut last_ms = None;
    for (row, height) in picture.rows.iter().zip(&heights) {
        let middle = y + ROW_HEIGHT / 2;
        let is_break = matches!(row.mark, Mark::Break { .. });
        if last_ms != Some(row.at_ms) && !is_break {
            let _ =
                writeln!(svg, "<text x=\"8\" y=\"{}\" fill=\"#555\">{} ms</text>", middle + 4, thousands(row.at_ms));
            last_ms = Some(row.at_ms);
        }
        if row.ink == CUT_RED && row.mark != Mark::Band {
            // A faint red stripe across the lanes, so a cut is found at a glance.
            let _ = writeln!(
                svg,
                "<rect x=\"{TIME_WIDTH}\" y=\"{y}\" width=\"{}\" height=\"{height}\" fill=\"{CUT_RED}\" fill-opacity=\"0.12\"/>",
                lanes_right - TIME_WIDTH
            );
        }
        let middle = if is_break { y + height / 2 } else { middle };
        svg.push_str(&mark_svg(row, layout, middle, (y, *height)));
        for (line, text) in layout.lines(row).iter().enumerate() {
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>",
                lanes_right + 12,
                middle + 4 + LINE_HEIGHT * line,
                row.ink,
                escape(text)
            );
        }
        y += height;
    }
    if picture.omitted > 0 {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\">{} more rows not drawn: the full trace is in --trace</text>",
            TIME_WIDTH,
            y + 13,
            picture.omitted
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The mark of one row, centred on `middle`; `(top, height)` is the row's band.
fn mark_svg(row: &Row, layout: &Layout, middle: usize, (top, height): (usize, usize)) -> String {
    let ink = row.ink;
    let lanes_right = layout.lanes_right;
    let tooltip = format!("<title>{} ms: {}</title>", row.at_ms, escape(&crate::report::bounds::text(&row.text)));
    match &row.mark {
        Mark::Arrow { from, to, cut, dropped } => {
            let (x1, x2) = (layout.lane_x(*from) as i64, layout.lane_x(*to) as i64);
            let toward = if x2 >= x1 { 1 } else { -1 };
            let end = x2 - toward * 4;
            let head = if *dropped {
                format!(
                    "<path d=\"M{} {} l10 10 M{} {} l-10 10\" stroke=\"{ink}\" stroke-width=\"3\"/>",
                    x2 - 5,
                    middle - 5,
                    x2 + 5,
                    middle - 5
                )
            } else {
                String::new()
            };
            let marker = match (dropped, cut) {
                (true, _) => "",
                (false, true) => " marker-end=\"url(#cuthead)\"",
                (false, false) => " marker-end=\"url(#head)\"",
            };
            let width = if *cut { 3 } else { 1 };
            // Centred over the arrow, but never out past the first or the last lane.
            let half = small_width(&row.tag).div_ceil(2);
            let centre = ((x1 + x2) / 2) as usize;
            let centre = centre.min(lanes_right.saturating_sub(half)).max(TIME_WIDTH + half);
            format!(
                "<g>{tooltip}<line x1=\"{x1}\" y1=\"{middle}\" x2=\"{end}\" y2=\"{middle}\" stroke=\"{ink}\" stroke-width=\"{width}\"{marker}/>{head}{}</g>\n",
                label(centre, middle - 3, "middle", ink, &row.tag)
            )
        }
        Mark::Dot { lane, shape } => {
            let x = layout.lane_x(*lane);
            let body = match shape {
                Shape::Square => format!("<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{ink}\"/>", x - 5, middle - 5),
                Shape::Diamond => format!(
                    "<path d=\"M{x} {} l6 6 l-6 6 l-6 -6 z\" fill=\"{ink}\"/>",
                    middle - 6
                ),
                Shape::Circle => format!("<circle cx=\"{x}\" cy=\"{middle}\" r=\"4\" fill=\"{ink}\"/>"),
                Shape::Cross => format!(
                    "<path d=\"M{} {} l12 12 M{} {} l-12 12\" stroke=\"{ink}\" stroke-width=\"4\"/>",
                    x - 6,
                    middle - 6,
                    x + 6,
                    middle - 6
                ),
            };
            // Right of the mark, or left of it where the right would reach the descriptions.
            let tag = match x + 9 + small_width(&row.tag) + 4 <= lanes_right {
                true => label(x + 9, middle + 3, "start", ink, &row.tag),
                false => label(x - 9, middle + 3, "end", ink, &row.tag),
            };
            format!("<g>{tooltip}{body}{tag}</g>\n")
        }
        Mark::Link { a, b } => format!(
            "<g>{tooltip}<line x1=\"{}\" y1=\"{middle}\" x2=\"{}\" y2=\"{middle}\" stroke=\"{ink}\" stroke-width=\"3\" stroke-dasharray=\"6 4\"/></g>\n",
            layout.lane_x(*a),
            layout.lane_x(*b)
        ),
        Mark::Band => format!(
            "<g>{tooltip}<rect x=\"{TIME_WIDTH}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{ink}\" fill-opacity=\"0.25\" stroke=\"{ink}\"/></g>\n",
            top + 2,
            lanes_right - TIME_WIDTH,
            height - 4
        ),
        Mark::Break { ms } => {
            // White paper over the lanes with torn edges: time that passed without anything in it.
            let (upper, lower) = (top + 6, top + height - 6);
            let edge = |y: usize| {
                let mut path = format!("M{TIME_WIDTH} {y}");
                let mut x = TIME_WIDTH;
                let mut up = true;
                while x < lanes_right {
                    x = (x + 8).min(lanes_right);
                    let _ = write!(path, " L{x} {}", if up { y - 4 } else { y });
                    up = !up;
                }
                path
            };
            let (top_edge, bottom_edge) = (edge(upper), edge(lower));
            format!(
                "<g>{tooltip}<rect x=\"{TIME_WIDTH}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff\"/>\
                 <path d=\"{top_edge}\" fill=\"none\" stroke=\"{NOTE_GREY}\"/><path d=\"{bottom_edge}\" fill=\"none\" stroke=\"{NOTE_GREY}\"/>\
                 <text x=\"8\" y=\"{}\" fill=\"{NOTE_GREY}\" font-style=\"italic\">⋯ {}</text></g>\n",
                upper - 2,
                lanes_right - TIME_WIDTH,
                lower - upper + 4,
                middle + 4,
                duration(*ms)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finding_names_its_last_moment() {
        assert_eq!(moment("turn t1 went from `failed` (at 369 ms) back to `running` at 1801160 ms"), Some(1_801_160));
        assert_eq!(moment("write to a/b with token 2 accepted at 50 ms after token 3 was granted for d"), Some(50));
        assert_eq!(moment("turn s1/t1 is still `running` at step 1 and the world went quiet"), None);
        assert_eq!(moment("a format 3 ms wide"), None, "only the word `at`");
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(2_500), "2.5 s");
        assert_eq!(duration(1_798_786), "29 min 58.8 s");
    }

    #[test]
    fn long_times_have_thousands_separators() {
        assert_eq!(thousands(7), "7");
        assert_eq!(thousands(1_800_050), "1,800,050");
        assert_eq!(thousands(100_000), "100,000");
    }

    fn frame(direction: &'static str, peer: &str, frame: &'static str, invocation: &str) -> Event {
        let kind = EventKind::Frame {
            direction,
            peer: peer.into(),
            frame,
            function_id: Some("model::generate".into()),
            invocation_id: Some(invocation.into()),
        };
        Event { at_ms: 1, host: "engine".into(), kind }
    }

    #[test]
    fn a_connection_without_a_name_is_named_by_its_other_frames() {
        // The harness's call, answered after its connection was gone (the engine names it anew).
        let events = [
            frame("in", "harness", "invokefunction", "a"),
            frame("out", "model", "invokefunction", "a"),
            frame("in", "model", "invocationresult", "a"),
            frame("out", "worker-7", "invocationresult", "a"),
            frame("out", "worker-8", "invocationresult", "b"),
        ];
        let names = worker_names(&events);
        assert_eq!(names.get("worker-7").map(String::as_str), Some("harness"));
        assert_eq!(names.get("worker-8"), None, "nothing says who worker-8 is: it keeps its name");
        assert!(!names.contains_key("model"));
        assert!(is_unnamed("worker-12") && !is_unnamed("worker-") && !is_unnamed("workers-1"));
    }

    #[test]
    fn descriptions_wrap_at_spaces_onto_two_lines_at_most() {
        assert_eq!(wrap("short", 20, 2), ["short"]);
        assert_eq!(
            wrap("commit harness_turn/s1 v2 status=failed", 24, 2),
            ["commit harness_turn/s1", "v2 status=failed"]
        );
        let long = wrap(&"word ".repeat(40), 20, 2);
        assert_eq!(long.len(), 2);
        assert!(long[1].ends_with('…') && long[1].chars().count() <= 20, "{long:?}");
    }

    #[test]
    fn a_label_on_the_last_lane_turns_left_of_the_descriptions() {
        let layout = Layout::for_lanes(7);
        let row = |tag: &str| Row {
            at_ms: 5,
            mark: Mark::Dot { lane: 6, shape: Shape::Cross },
            ink: CUT_RED,
            tag: tag.into(),
            text: String::new(),
        };
        assert!(mark_svg(&row("delay"), &layout, 9, (0, 18)).contains("text-anchor=\"start\""));
        assert!(mark_svg(&row("crash-after-effect"), &layout, 9, (0, 18)).contains("text-anchor=\"end\""));
        assert!(layout.width <= PAGE_WIDTH_MAX, "seven lanes fit a 1,280 px window");
    }

    #[test]
    fn mermaid_labels_keep_their_punctuation_as_text() {
        assert_eq!(mermaid_text("cut #1; a<b>"), "cut #35;1#59; a#60;b#62;");
    }
}

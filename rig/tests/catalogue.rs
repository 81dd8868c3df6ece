//! The scenario catalogue and its snapshots stay one-to-one: an empty fixture folder is an
//! error (the scenario test would silently run nothing), and every snapshot belongs to a scenario file.

use std::path::{Path, PathBuf};

fn files_under(folder: &Path, extension: &str, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(folder).expect("readable folder") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            files_under(&path, extension, found);
        } else if path.extension().is_some_and(|e| e == extension) {
            found.push(path);
        }
    }
}

fn stems(root: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    files_under(root, extension, &mut files);
    let mut stems: Vec<PathBuf> = files.iter().map(|f| f.strip_prefix(root).unwrap().with_extension("")).collect();
    stems.sort();
    stems
}

#[test]
fn every_scenario_has_its_snapshot_and_every_snapshot_its_scenario() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let scenarios = stems(&workspace.join("scenarios"), "toml");
    assert!(!scenarios.is_empty(), "no scenario files under scenarios/: the scenario test would run nothing");
    let snapshots = stems(&workspace.join("snapshots"), "snap");
    assert_eq!(scenarios, snapshots, "scenarios/ and snapshots/ must pair up by path and stem");
}

// What a file's shared `[expect]` may read: the harness contract (rig/docs/contract.md), which
// every correct harness keeps, and the world's own services, which are the rig's. Anything else
// is how the reference harness happens to keep the contract, and belongs in `[policy.reference]`
// ("What the contract decided"). Each list is the contract's section named beside it.

/// "The turn record": its fields (a budget's `used` counters are the harness's own; `budget`
/// judges what the services saw). `value` opens the record itself, as `state::get` answers it.
const TURN_FIELDS: &[&str] = &[
    "session_id",
    "turn_id",
    "status",
    "step",
    "held_reason",
    "input_keys",
    "budget.limits",
    "parent",
    "owner",
    "epoch",
    "cancellation",
];
/// "Control, budgets and delegation": the control record and a command's reply.
const CONTROL_FIELDS: &[&str] = &[
    "session_id",
    "commands.*.command",
    "commands.*.turn_id",
    "commands.*.state",
    "commands.*.why",
    "commands.*.outcome",
];
/// "Queued input and new turns", "Ownership".
const QUEUED_INPUT_FIELDS: &[&str] = &["session_id", "message"];
const LEASE_FIELDS: &[&str] = &["owner"];

/// The replies of a harness's functions, by function ("A turn delivery and its reply", "Switches",
/// "`send` and `status`", "Hooks", "Control"); an export's bundle is the harness's own.
fn reply_fields(function: &str) -> Option<&'static [&'static str]> {
    Some(match function {
        "turn" | "import" => &["session_id", "turn_id", "status", "skipped", "reason", "finalized"],
        "send" => &["session_id", "turn_id", "accepted", "queued", "deduplicated", "merged"],
        "status" => &[
            "session_id",
            "turn_id",
            "status",
            "step",
            "pending_calls",
            "pending_calls.*.id",
            "pending_calls.*.status",
            "pending_calls.*.reason",
            "pending_calls.*.expires_at_ms",
            "queued",
            "children",
        ],
        "stop" | "cancel" | "pause" | "resume" => &["session_id", "idempotency_key", "command", "state"],
        "resolve" => &["resolved"],
        "export" | "dead-letter" => &[],
        _ => return None,
    })
}

/// Hosts a harness's workers run as (`harness`, and `replacement` in switches).
const HARNESS_HOSTS: &[&str] = &["harness", "replacement"];

/// Whether `path` (dotted, as files write it) is `allowed` or lies under an allowed field; `*`
/// stands for one segment (an index, a command's key).
fn within(path: &str, allowed: &[&str]) -> bool {
    let segments: Vec<&str> = path.split('.').collect();
    allowed.iter().any(|field| {
        let field: Vec<&str> = field.split('.').collect();
        segments.len() >= field.len() && field.iter().zip(&segments).all(|(f, s)| *f == "*" || f == s)
    })
}

/// The contract's fields of a record at `scope`; `None` for a scope that is not the contract's.
fn record_fields(scope: &str) -> Option<&'static [&'static str]> {
    Some(match scope {
        "harness_turn" => TURN_FIELDS,
        "harness_control" => CONTROL_FIELDS,
        "harness_queue" => QUEUED_INPUT_FIELDS,
        "harness_owner" => LEASE_FIELDS,
        _ => return None,
    })
}

/// Reads of what the world's services saw that count how a harness works, not what it does: its
/// store traffic, its transcript reads and writes, its status calls (keyed, so repeats are harmless).
fn counts_harness_traffic(function: &str) -> bool {
    function.starts_with("state::") || function.starts_with("session::")
}

fn table_keys(value: &toml::Value) -> Vec<String> {
    value.as_table().map(|t| t.keys().cloned().collect()).unwrap_or_default()
}

/// The shared `[expect]` of one file, read against the contract: each finding is `what: why`.
fn reference_particulars(file: &toml::Table) -> Vec<String> {
    let mut found = Vec::new();
    let Some(expect) = file.get("expect").and_then(toml::Value::as_table) else { return found };
    // The function each named invocation called.
    let mut functions = std::collections::BTreeMap::new();
    for step in file.get("step").and_then(toml::Value::as_array).into_iter().flatten() {
        if let Some(invoke) = step.get("invoke") {
            if let (Some(name), Some(function)) =
                (invoke.get("name").and_then(|v| v.as_str()), invoke.get("function").and_then(|v| v.as_str()))
            {
                functions.insert(name.to_string(), function.to_string());
            }
        }
    }
    let record = |scope: &str, path: &str, what: String| match record_fields(scope) {
        None => Some(format!("{what}: scope `{scope}` is not a record of the contract")),
        Some(fields) if !within(path, fields) => {
            Some(format!("{what}: `{path}` is not a field of the contract's `{scope}` record"))
        }
        Some(_) => None,
    };
    for (key, fields) in expect.get("state").and_then(toml::Value::as_table).into_iter().flatten() {
        let scope = key.split('/').next().unwrap_or_default();
        for field in table_keys(fields) {
            found.extend(record(scope, &field, format!("state.\"{key}\"")));
        }
    }
    for key in expect.get("absent").and_then(toml::Value::as_array).into_iter().flatten().filter_map(|k| k.as_str()) {
        let scope = key.split('/').next().unwrap_or_default();
        found.extend(record(scope, "session_id", format!("absent \"{key}\"")));
    }
    for (name, fields) in expect.get("rpc").and_then(toml::Value::as_table).into_iter().flatten() {
        let Some(function) = functions.get(name) else { continue };
        let (host, local) = function.split_once("::").unwrap_or_default();
        if !HARNESS_HOSTS.contains(&host) {
            continue;
        }
        let allowed = reply_fields(local).unwrap_or(&[]);
        for field in table_keys(fields) {
            let reply = field.strip_prefix("result.");
            if reply.is_some_and(|path| !within(path, allowed)) {
                found.push(format!("rpc.{name} ({function}): `{field}` is not in the contract's reply"));
            }
        }
    }
    for function in expect.get("calls").map(table_keys).unwrap_or_default() {
        if counts_harness_traffic(&function) {
            found.push(format!("calls.\"{function}\": how often a harness reads or writes is its own"));
        }
    }
    for event in expect.get("events").and_then(toml::Value::as_array).into_iter().flatten() {
        let matches = [event.get("match"), event.get("after").and_then(|a| a.get("match"))];
        for condition in matches.into_iter().flatten().filter_map(toml::Value::as_table) {
            let text = |field: &str| condition.get(field).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            match text("kind").as_str() {
                "note" => {
                    let names: Vec<String> = match condition.get("what") {
                        Some(toml::Value::String(what)) => vec![what.clone()],
                        Some(other) => other
                            .get("one_of")
                            .and_then(|v| v.as_array())
                            .into_iter()
                            .flatten()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect(),
                        None => Vec::new(),
                    };
                    if names.is_empty() || !names.iter().all(|w| rig::is_rig_note(w)) {
                        found.push(format!("events: a note of the harness's own ({names:?})"));
                    }
                }
                "commit" => {
                    let scope = text("scope");
                    for field in condition.keys().filter_map(|k| k.strip_prefix("value.")) {
                        found.extend(record(&scope, field, format!("events: commit at `{scope}`")));
                    }
                }
                "call" if counts_harness_traffic(&text("function")) => {
                    found.push(format!("events: calls of `{}`, the harness's own traffic", text("function")));
                }
                _ => {}
            }
        }
    }
    found.extend(script_particulars(file, &record));
    found
}

/// A cut that must fire, or a step the script waits on, that names what only the reference
/// harness writes or sends never fires, or never comes, for another harness: its file then
/// fails as untested or stalls. Such a cut is `optional` (and its `[policy.reference]` expects
/// it to fire); such a wait is restated through the contract.
fn script_particulars(file: &toml::Table, record: &dyn Fn(&str, &str, String) -> Option<String>) -> Vec<String> {
    let mut found = Vec::new();
    let value_fields = |condition: &toml::Table| -> Vec<String> {
        condition.keys().filter_map(|k| k.strip_prefix("value.")).map(str::to_string).collect()
    };
    for (index, cut) in file.get("cut").and_then(toml::Value::as_array).into_iter().flatten().enumerate() {
        if cut.get("optional").and_then(toml::Value::as_bool) == Some(true) {
            continue;
        }
        let function = cut.get("function").and_then(|v| v.as_str()).unwrap_or_default();
        let what = format!("cut #{} (not optional)", index + 1);
        if function == "session::set-status" {
            found.push(format!("{what}: `session::set-status` is a call a harness may not make"));
        }
        let Some(condition) = cut.get("match").and_then(toml::Value::as_table) else { continue };
        if let Some(scope) = condition.get("scope").and_then(|v| v.as_str()) {
            for field in value_fields(condition) {
                found.extend(record(scope, &field, what.clone()));
            }
        }
    }
    for (index, step) in file.get("step").and_then(toml::Value::as_array).into_iter().flatten().enumerate() {
        let Some(condition) = step.get("wait_until").and_then(|w| w.get("match")).and_then(toml::Value::as_table)
        else {
            continue;
        };
        let what = format!("step #{} waits", index + 1);
        let text = |field: &str| condition.get(field).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        match text("kind").as_str() {
            "commit" => {
                for field in value_fields(condition) {
                    found.extend(record(&text("scope"), &field, what.clone()));
                }
            }
            "note" if condition.get("what").and_then(|v| v.as_str()).is_some_and(|w| !rig::is_rig_note(w)) => {
                found.push(format!("{what} on a note of the harness's own ({})", text("what")));
            }
            _ => {}
        }
    }
    found
}

#[test]
fn every_shared_expectation_reads_only_the_contract() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    files_under(&workspace.join("scenarios"), "toml", &mut files);
    files.sort();
    let mut particulars = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("readable scenario file");
        let file: toml::Table = toml::from_str(&text).expect("a scenario file is TOML");
        for finding in reference_particulars(&file) {
            particulars.push(format!("{}: {finding}", path.strip_prefix(workspace).unwrap().display()));
        }
    }
    assert!(
        particulars.is_empty(),
        "{} shared expectations read what only the reference harness shows; move them into \
         [policy.reference] or restate them through the contract (rig/docs/contract.md):\n{}",
        particulars.len(),
        particulars.join("\n")
    );
}

#[test]
fn the_contract_check_catches_a_reference_particular() {
    let file: toml::Table = toml::from_str(
        r#"
[[step]]
invoke = { function = "harness::turn", payload = {}, name = "turn" }
[[step]]
wait_until = { match = { kind = "commit", scope = "harness_turn", "value.predecessor" = "t1" }, within_ms = 10 }
[[step]]
wait_until = { match = { kind = "commit", scope = "harness_turn", "value.step" = 0 }, within_ms = 10 }
[[cut]]
function = "state::set"
match = { scope = "harness_turn", "value.calls.t1:1:0.status" = "complete" }
action = "reject"
[[cut]]
function = "session::set-status"
action = "crash-caller-before"
optional = true
[expect]
rpc.turn = { outcome = "ok", "result.status" = "completed", "result.next_step" = 2 }
state."harness_turn/s1" = { status = "completed", "calls.t1:1:0.status" = "complete", "budget.used.model_rounds" = 1 }
state."harness_control/s1" = { "commands.c1.state" = "applied" }
calls = { "model::generate" = 1, "state::set" = 3 }
events = [{ match = { kind = "note", what = "finalization_deferred" }, count = 1 }, { match = { kind = "note", what = "queue_ack" }, count = 1 }]
"#,
    )
    .unwrap();
    let found = reference_particulars(&file);
    let expected = [
        "`result.next_step`",
        "`calls.t1:1:0.status`",
        "`budget.used.model_rounds`",
        "calls.\"state::set\"",
        "finalization_deferred",
        "cut #1 (not optional): `calls.t1:1:0.status`",
        "step #2 waits: `predecessor`",
    ];
    for what in expected {
        assert!(found.iter().any(|f| f.contains(what)), "{what} not found in {found:#?}");
    }
    assert_eq!(found.len(), expected.len(), "nothing else is a particular: {found:#?}");
}

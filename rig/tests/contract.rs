//! The harness contract (`rig/docs/contract.md`) stays true: every exchange the page shows is
//! replayed against the doubles and must get the answer it shows, every function and field the
//! page names is checked against the rig's own constants and types, and what the world sends a
//! harness (queue deliveries, dead letters, stream frames) is recorded from real runs and
//! compared with the shapes the page gives.

use doubles::{
    Call, Double, EffectService, Observation, ScriptedModel, ServiceConfig, SessionService, StateStore, TicketConfig,
    TicketService,
};
use rig::{
    Answer, Bus, ErrorBody, HarnessConfig, HarnessEnv, HarnessFactory, Invocation, Provider, RecordLayout, Scenario,
};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

fn page() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/contract.md");
    std::fs::read_to_string(path).expect("rig/docs/contract.md is readable")
}

/// The page's code blocks tagged `text wire`: exchanges with the doubles, one per block.
fn wire_blocks(page: &str) -> Vec<Vec<(usize, String)>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<(usize, String)>> = None;
    for (index, line) in page.lines().enumerate() {
        match (&mut current, line.trim_end()) {
            (None, "```text wire") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.push(current.take().expect("inside a block")),
            (Some(block), line) => block.push((index + 1, line.to_string())),
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "a `text wire` block is not closed");
    blocks
}

/// The doubles one exchange talks to, fresh for each block, wired as a world wires them: the
/// store's lease grants raise the effect services' fencing bars.
struct Doubles {
    store: StateStore,
    session: SessionService,
    model: ScriptedModel,
    tickets: TicketService,
    recorder: EffectService,
}

impl Doubles {
    fn new() -> Self {
        let recorder = ServiceConfig {
            effect: Some("record".into()),
            response: json!({ "content": [{ "type": "text", "text": "recorded" }], "is_error": false }),
            ..ServiceConfig::default()
        };
        Self {
            store: StateStore::new(),
            session: SessionService::new(),
            model: ScriptedModel::new([]),
            tickets: TicketService::new(TicketConfig::default()),
            recorder: EffectService::new("recorder", recorder),
        }
    }

    fn call(&mut self, function: &str, payload: &Value, now_ms: u64) -> Result<Value, String> {
        let mut observed = Vec::new();
        let call = Call::new(function, payload, now_ms);
        let double: &mut dyn Double = match function.split("::").next().unwrap_or_default() {
            "state" => &mut self.store,
            "session" => &mut self.session,
            "model" => &mut self.model,
            "ticket" => &mut self.tickets,
            "recorder" => &mut self.recorder,
            other => panic!("the page talks to `{other}`, which the contract test does not host"),
        };
        let reply = double.handle(call, &mut observed).map_err(|e| e.code);
        for observation in observed {
            if let Observation::Lease { scope, key, token, .. } = observation {
                let domain = format!("{scope}/{key}");
                self.tickets.observe_grant(&domain, token);
                self.recorder.observe_grant(&domain, token);
            }
        }
        reply
    }
}

/// One request line: `[@MS] FUNCTION PAYLOAD`.
fn request(line: &str) -> (u64, &str, Value) {
    let (now_ms, rest) = match line.strip_prefix('@') {
        Some(timed) => {
            let (ms, rest) = timed.split_once(' ').expect("`@MS FUNCTION PAYLOAD`");
            (ms.parse().expect("a time in ms"), rest)
        }
        None => (0, line),
    };
    let (function, payload) = rest.split_once(' ').expect("`FUNCTION PAYLOAD`");
    (now_ms, function, serde_json::from_str(payload).unwrap_or_else(|e| panic!("`{payload}`: {e}")))
}

#[test]
fn every_exchange_the_page_shows_is_what_the_doubles_answer() {
    let page = page();
    let blocks = wire_blocks(&page);
    assert!(blocks.len() >= 6, "the page shows the store, session, model and effect exchanges");
    let mut wrong = Vec::new();
    let mut exchanges = 0;
    for block in blocks {
        let mut doubles = Doubles::new();
        let mut lines = block.into_iter();
        while let Some((number, line)) = lines.next() {
            if let Some(script) = line.strip_prefix("script ") {
                let script: Vec<Value> = serde_json::from_str(script).expect("a script is a JSON list of replies");
                doubles.model = ScriptedModel::new(script);
                continue;
            }
            let (now_ms, function, payload) = request(&line);
            let (_, answer) = lines.next().unwrap_or_else(|| panic!("line {number}: a request without its answer"));
            let answer = answer.strip_prefix("→ ").unwrap_or_else(|| panic!("line {}: expected `→ ...`", number + 1));
            let got = doubles.call(function, &payload, now_ms);
            let expected = match answer.strip_prefix("error ") {
                Some(code) => Err(code.to_string()),
                None => Ok(serde_json::from_str::<Value>(answer).unwrap_or_else(|e| panic!("`{answer}`: {e}"))),
            };
            if got != expected {
                wrong.push(format!("line {number}: {function} answered {got:?}, the page says {expected:?}"));
            }
            exchanges += 1;
        }
    }
    assert!(wrong.is_empty(), "the page's exchanges are not what the doubles answer:\n{}", wrong.join("\n"));
    assert!(exchanges >= 30, "only {exchanges} exchanges checked");
}

/// The names in backticks on the page.
fn quoted(page: &str) -> BTreeSet<String> {
    page.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn every_function_of_the_doubles_and_of_a_harness_is_on_the_page() {
    let page = page();
    let quoted = quoted(&page);
    let mut missing = Vec::new();
    let doubles =
        [StateStore::FUNCTIONS, SessionService::FUNCTIONS, ScriptedModel::FUNCTIONS, TicketService::FUNCTIONS];
    for function in doubles.iter().flat_map(|f| f.iter()) {
        if !page.contains(function) {
            missing.push(function.to_string());
        }
    }
    for function in rig::HARNESS_FUNCTIONS {
        if !page.contains(&format!("{{host}}::{function}")) && !page.contains(&format!("|{function}")) {
            missing.push(format!("{{host}}::{function}"));
        }
    }
    for point in rig::INTERRUPT_POINTS {
        if !quoted.contains(point) {
            missing.push(point.to_string());
        }
    }
    assert!(quoted.contains(rig::CONTROL_SCOPE), "the control record's scope");
    assert!(missing.is_empty(), "named nowhere on the contract page: {missing:?}");
}

/// The `{a, b, c}` right after `phrase` on the page, as a set of names.
fn braces_after(page: &str, phrase: &str) -> BTreeSet<String> {
    let at = page.find(phrase).unwrap_or_else(|| panic!("the page no longer says `{phrase}`"));
    let rest = &page[at + phrase.len()..];
    let open = rest.find('{').expect("a `{...}` follows");
    let close = rest[open..].find('}').expect("closed") + open;
    rest[open + 1..close].split(',').map(|f| f.trim().trim_end_matches('?').to_string()).collect()
}

fn keys(value: &Value) -> BTreeSet<String> {
    value.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
}

#[test]
fn the_settings_a_harness_gets_are_the_ones_the_page_lists() {
    let page = page();
    let config = rig::config_json(&HarnessConfig::default());
    let table = table_rows(&page, "| field | what |");
    let listed: BTreeSet<String> = table.iter().flat_map(|row| quoted(&row[0])).collect();
    assert_eq!(keys(&config), listed, "`rig::config`'s `config`, field by field");
    let tool = rig::Tool {
        name: "ticket.create".into(),
        function: "ticket::create".into(),
        description: String::new(),
        parameters: json!({}),
        replay_safe: false,
        service: "ticket".into(),
        idempotency: true,
        idempotency_window_ms: 1,
        lookup: true,
    };
    let tool = serde_json::to_value(tool).unwrap();
    assert_eq!(keys(&tool), braces_after(&page, "A tool (`rig::Tool`) is"));
    let binding = rig::Binding {
        trigger: rig::BindingPoint::PreTrigger,
        function: "hooks::hold".into(),
        functions: Vec::new(),
        priority: 0,
    };
    assert_eq!(keys(&serde_json::to_value(binding).unwrap()), braces_after(&page, "A binding (`rig::Binding`) is"));
    for point in rig::BindingPoint::ALL {
        assert!(quoted(&page).contains(point.name()), "binding trigger `{}`", point.name());
    }
}

/// The rows of the table whose header is `header`, as cells.
fn table_rows(page: &str, header: &str) -> Vec<Vec<String>> {
    let at = page.find(header).unwrap_or_else(|| panic!("no table headed `{header}`"));
    page[at..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| line.trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect())
        .collect()
}

/// The default layout's fields with their values as the page writes them (`a`, `b`; none).
fn layout_fields() -> Vec<(String, String)> {
    let layout = format!("{:?}", RecordLayout::default());
    let body = layout.trim_start_matches("RecordLayout {").trim_end_matches('}');
    let mut fields = Vec::new();
    for part in split_top_level(body) {
        let (name, value) = part.split_once(": ").expect("`name: value`");
        let value = value.trim();
        let shown = if value == "None" {
            "none".to_string()
        } else {
            let inner = value.trim_start_matches("Some(").trim_end_matches(')').trim_start_matches('[');
            let inner = inner.trim_end_matches(']');
            inner.split(", ").map(|v| format!("`{}`", v.trim_matches('"'))).collect::<Vec<_>>().join(", ")
        };
        fields.push((name.trim().to_string(), shown));
    }
    fields
}

/// Splits `a: 1, b: [2, 3]` at its top-level commas.
fn split_top_level(text: &str) -> Vec<String> {
    let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
    for c in text.chars() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts.into_iter().map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect()
}

#[test]
fn the_record_layout_table_is_the_layout_with_its_defaults() {
    let page = page();
    let rows = table_rows(&page, "| field | default | what |");
    let fields = layout_fields();
    assert!(fields.len() >= 20, "the layout's fields: {fields:?}");
    let table: Vec<(String, String)> =
        rows.iter().map(|row| (row[0].trim_matches('`').to_string(), row[1].clone())).collect();
    assert_eq!(table, fields, "rig/docs/contract.md's layout table, row by row, against RecordLayout::default()");
}

#[test]
fn the_effect_request_fields_the_page_marks_required_are_the_ones_the_services_require() {
    let page = page();
    let rows = table_rows(&page, "| field | required | what |");
    // The effect request table is the second such table on the page (the model's is first).
    let at = page.find("A tool call of the model is an effect").expect("the effect request table");
    let rows_here = table_rows(&page[at..], "| field | required | what |");
    assert!(rows.len() > 1 && !rows_here.is_empty());
    let full = json!({
        "action_id": "a1", "idempotency_key": "k1", "client_reference": "a1",
        "fencing": { "domain": "harness_owner/s1", "token": 1 }, "args": { "title": "x", "value": "v" },
    });
    for row in rows_here {
        let field = row[0].trim_matches('`');
        let required = row[1] == "yes";
        for function in ["ticket::create", "recorder::record"] {
            let mut payload = full.clone();
            payload.as_object_mut().unwrap().remove(field);
            let got = Doubles::new().call(function, &payload, 0);
            assert_eq!(
                got.is_err(),
                required,
                "{function} without `{field}` answered {got:?}; the page says required: {}",
                row[1]
            );
        }
    }
}

/// A harness that records what the world sends it: turn deliveries (answered with an error, so
/// the queue gives up on them), dead letters, and the frames of a streamed generation.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<(String, Value)>>>,
}

impl HarnessFactory for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn capabilities(&self) -> rig::Capabilities {
        [rig::Capability::DeadLetters, rig::Capability::Streaming].into_iter().collect()
    }

    fn start(&self, _policy: &str, env: HarnessEnv) -> Rc<dyn Provider> {
        Rc::new(RecordingWorker { seen: Arc::clone(&self.seen), env })
    }
}

struct RecordingWorker {
    seen: Arc<Mutex<Vec<(String, Value)>>>,
    env: HarnessEnv,
}

impl Provider for RecordingWorker {
    fn invoke(self: Rc<Self>, call: Invocation, bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async move {
            let name = call.function_id.rsplit("::").next().unwrap_or_default().to_string();
            self.seen.lock().unwrap().push((name.clone(), call.data.clone()));
            Some(match name.as_str() {
                "turn" if call.data["stream"] == json!(true) => {
                    let request = json!({
                        "session_id": "s1", "turn_id": "t1", "messages": [], "tools": [], "system_prompt": "",
                        "stream_to": self.env.function("stream"), "stream_id": "g1",
                    });
                    let reply = bus.invoke("model::generate", request, 5_000).await;
                    self.seen.lock().unwrap().push(("reply".into(), reply.unwrap_or(Value::Null)));
                    Ok(json!({ "skipped": true }))
                }
                "turn" => Err(ErrorBody::new("unavailable", "deliver it again")),
                _ => Ok(json!({})),
            })
        })
    }
}

fn record(source: &str) -> Vec<(String, Value)> {
    let scenario = Scenario::parse(Path::new("contract.toml"), source).unwrap_or_else(|e| panic!("{e}"));
    let recorder = Recorder::default();
    let factory: Arc<dyn HarnessFactory> = Arc::new(recorder.clone());
    rig::run_with(&factory, &scenario, scenario.run_of("reference").unwrap(), 0)
        .unwrap_or_else(|skip| panic!("{skip}"));
    let seen = recorder.seen.lock().unwrap().clone();
    seen
}

#[test]
fn queue_deliveries_and_dead_letters_reach_a_harness_as_the_page_says() {
    let seen = record(
        r#"
        [world.queue.harness-turn]
        max_retries = 1
        backoff_ms = 10
        dead_letter_function = "harness::dead-letter"
        [[step]]
        invoke = { function = "harness::turn", payload = { session_id = "s1", turn_id = "t1", step = 1 }, queue = "harness-turn", name = "enqueue" }
        [[step]]
        wait_ms = 5000
        [policy.reference]
        "#,
    );
    let page = page();
    let delivered: Vec<&Value> = seen.iter().filter(|(f, _)| f == "turn").map(|(_, d)| d).collect();
    assert_eq!(delivered.len(), 2, "1 + max_retries deliveries: {seen:?}");
    let enqueued = json!({ "session_id": "s1", "turn_id": "t1", "step": 1 });
    assert!(delivered.iter().all(|d| **d == enqueued), "a delivery is the enqueued payload: {delivered:?}");
    assert_eq!(keys(&enqueued), braces_after(&page, "enqueued on `turn_queue` as"));
    let letter = seen.iter().find(|(f, _)| f == "dead-letter").map(|(_, d)| d).expect("the dead letter was offered");
    assert_eq!(keys(letter), braces_after(&page, "offers each dead letter there, as"));
    assert_eq!(letter["data"], enqueued);
}

#[test]
fn a_streamed_reply_reaches_a_harness_as_the_page_says() {
    let seen = record(
        r#"
        [[world.model]]
        frames = [{ type = "text_delta", delta = "hi " }, { type = "text_delta", delta = "there" }]
        [[step]]
        invoke = { function = "harness::turn", payload = { stream = true }, name = "turn" }
        [policy.reference]
        "#,
    );
    let page = page();
    let frames: Vec<&Value> = seen.iter().filter(|(f, _)| f == "stream").map(|(_, d)| d).collect();
    assert_eq!(frames.len(), 2, "{seen:?}");
    assert_eq!(keys(frames[0]), braces_after(&page, "as a fire-and-forget call"));
    assert_eq!((frames[0]["seq"].clone(), frames[1]["frame"]["delta"].clone()), (json!(0), json!("there")));
    let reply = seen.iter().find(|(f, _)| f == "reply").map(|(_, d)| d).expect("the model answered");
    assert_eq!(*reply, json!({ "streamed": 2 }));
}

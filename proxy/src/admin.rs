//! The admin endpoint: list, add and remove rules while the proxy runs.
//!
//! Shaped like toxiproxy's API so scripts written for it read naturally here, over a minimal
//! HTTP/1.1 handler (httparse on tokio, one request per connection) rather than an HTTP
//! framework, to keep the proxy's compile time small.

use crate::handshake::read_head;
use crate::rule::{Rule, RuleError, RuleSet};
use crate::serve::AcceptFailures;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The largest request body the admin endpoint reads (a rule is a few hundred bytes).
const MAX_BODY_BYTES: usize = 64 * 1024;
/// How long one admin request may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How many admin connections are served at once; more wait in the accept queue.
const MAX_ADMIN_CONNECTIONS: usize = 16;

/// What the admin endpoint knows about the proxy it controls.
pub(crate) struct AdminState {
    pub name: String,
    pub listen: String,
    pub upstream: String,
    pub rules: Rc<RefCell<RuleSet>>,
    /// Told of every change, for the log.
    pub on_change: Box<dyn Fn(&Value)>,
}

/// One admin answer: status and JSON body (`None` for 204).
struct Reply {
    status: u16,
    body: Option<Value>,
}

fn error(status: u16, message: impl Into<String>) -> Reply {
    Reply { status, body: Some(json!({"error": message.into(), "status": status})) }
}

fn ok(body: Value) -> Reply {
    Reply { status: 200, body: Some(body) }
}

/// Accepts admin connections; each is served on the current LocalSet. A failing accept (out
/// of file descriptors) is reported once and retried after a pause, never in a tight loop.
pub(crate) async fn serve_admin(listener: TcpListener, state: Rc<AdminState>) {
    let busy = Rc::new(std::cell::Cell::new(0usize));
    let hosts = Rc::new(listener.local_addr().map(own_hosts).unwrap_or_default());
    let mut failures = AcceptFailures::new("admin");
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                failures.succeeded();
                stream
            }
            Err(e) => {
                failures.failed(&e, |event| (state.on_change)(&event)).await;
                continue;
            }
        };
        if busy.get() >= MAX_ADMIN_CONNECTIONS {
            let mut stream = stream;
            let _ = write_reply(&mut stream, error(503, "too many admin connections")).await;
            continue;
        }
        busy.set(busy.get() + 1);
        let (state, busy, hosts) = (state.clone(), busy.clone(), hosts.clone());
        tokio::task::spawn_local(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT * 2, handle(stream, &state, &hosts)).await;
            busy.set(busy.get() - 1);
        });
    }
}

/// The `Host` values that name the admin endpoint itself: its address, and `localhost` with its port.
fn own_hosts(addr: SocketAddr) -> Vec<String> {
    vec![addr.to_string(), format!("localhost:{}", addr.port())]
}

/// Refuses what a web page could send: a request for another host name (DNS rebinding), or
/// one carrying an `Origin` or a browser's user agent, as toxiproxy does.
fn refuse_browsers(request: &httparse::Request<'_, '_>, hosts: &[String]) -> Result<(), Reply> {
    let header = |name: &str| {
        request.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| String::from_utf8_lossy(h.value))
    };
    match header("host") {
        Some(host) if hosts.iter().any(|own| own.eq_ignore_ascii_case(host.trim())) => {}
        Some(host) => {
            return Err(error(403, format!("Host `{host}` is not this admin endpoint ({})", hosts.join(" or "))))
        }
        None => return Err(error(403, "a Host header naming this admin endpoint is required")),
    }
    if header("origin").is_some() {
        return Err(error(403, "requests with an Origin (from a web page) are refused"));
    }
    if header("user-agent").is_some_and(|agent| agent.starts_with("Mozilla/")) {
        return Err(error(403, "requests from a browser are refused"));
    }
    Ok(())
}

async fn handle(mut stream: TcpStream, state: &AdminState, hosts: &[String]) -> std::io::Result<()> {
    let reply = match tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream, hosts)).await {
        Err(_) => error(408, "request timed out"),
        Ok(Err(reply)) => reply,
        Ok(Ok((method, path, body))) => route(&method, &path, &body, state),
    };
    write_reply(&mut stream, reply).await
}

async fn read_request(stream: &mut TcpStream, hosts: &[String]) -> Result<(String, String, Vec<u8>), Reply> {
    let (head, mut body) = read_head(stream).await.map_err(|e| error(400, e.to_string()))?;
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(error(400, "incomplete request head")),
        Err(e) => return Err(error(400, e.to_string())),
    }
    refuse_browsers(&request, hosts)?;
    let method = request.method.unwrap_or("").to_string();
    let path = request.path.unwrap_or("/").to_string();
    if request.headers.iter().any(|h| h.name.eq_ignore_ascii_case("transfer-encoding")) {
        return Err(error(411, "send the body with Content-Length, not chunked"));
    }
    let length = match request.headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length")) {
        None => 0,
        Some(h) => std::str::from_utf8(h.value)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .ok_or_else(|| error(400, "bad Content-Length"))?,
    };
    if length > MAX_BODY_BYTES {
        return Err(error(413, format!("body above {MAX_BODY_BYTES} bytes")));
    }
    if body.len() < length {
        let start = body.len();
        body.resize(length, 0);
        stream.read_exact(&mut body[start..]).await.map_err(|e| error(400, format!("reading the body: {e}")))?;
    }
    body.truncate(length);
    Ok((method, path, body))
}

/// Reads a rule from a JSON object (the TOML shape) or from the command-line text form.
fn parse_rule_body(body: &[u8]) -> Result<Rule, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8".to_string())?;
    let trimmed = text.trim();
    if trimmed.starts_with('{') {
        let rule: Rule = serde_json::from_str(trimmed).map_err(|e| format!("rule JSON: {e}"))?;
        rule.validate().map_err(|e| e.to_string())?;
        Ok(rule)
    } else {
        Rule::parse(trimmed).map_err(|e| e.to_string())
    }
}

fn route(method: &str, path: &str, body: &[u8], state: &AdminState) -> Reply {
    let path = path.split('?').next().unwrap_or("");
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let proxy = || {
        json!({
            "name": state.name, "listen": state.listen, "upstream": state.upstream, "enabled": true,
            "toxics": state.rules.borrow().rules(),
        })
    };
    match (method, segments.as_slice()) {
        ("GET", ["version"]) => ok(json!(env!("CARGO_PKG_VERSION"))),
        ("GET", ["proxies"]) => ok(json!({ state.name.clone(): proxy() })),
        ("GET", ["proxies", name]) if *name == state.name => ok(proxy()),
        ("GET", ["proxies", name, "toxics"]) if *name == state.name => ok(json!(state.rules.borrow().rules())),
        ("POST", ["proxies", name, "toxics"]) if *name == state.name => {
            let rule = match parse_rule_body(body) {
                Ok(rule) => rule,
                Err(e) => return error(400, e),
            };
            let mut rules = state.rules.borrow_mut();
            match rules.push(rule) {
                Ok(added) => {
                    let status = rules.rules().into_iter().find(|r| r.name == added);
                    drop(rules);
                    let body = json!(status);
                    (state.on_change)(&json!({"event": "rule_added", "rule": body}));
                    ok(body)
                }
                Err(e @ RuleError::DuplicateName(_)) => error(409, e.to_string()),
                Err(e) => error(400, e.to_string()),
            }
        }
        ("GET", ["proxies", name, "toxics", rule]) if *name == state.name => {
            match state.rules.borrow().rules().into_iter().find(|r| r.name == *rule) {
                Some(status) => ok(json!(status)),
                None => error(404, format!("no rule named `{rule}`")),
            }
        }
        ("DELETE", ["proxies", name, "toxics", rule]) if *name == state.name => {
            if state.rules.borrow_mut().remove(rule) {
                (state.on_change)(&json!({"event": "rule_removed", "name": rule}));
                Reply { status: 204, body: None }
            } else {
                error(404, format!("no rule named `{rule}`"))
            }
        }
        ("POST", ["reset"]) => {
            state.rules.borrow_mut().reset();
            (state.on_change)(&json!({"event": "rules_reset"}));
            Reply { status: 204, body: None }
        }
        (_, ["proxies", name, ..]) if *name != state.name => {
            error(404, format!("no proxy named `{name}` (this one is `{}`)", state.name))
        }
        (
            _,
            ["version"]
            | ["proxies"]
            | ["proxies", _]
            | ["proxies", _, "toxics"]
            | ["proxies", _, "toxics", _]
            | ["reset"],
        ) => error(405, format!("{method} is not allowed on {path}")),
        _ => error(404, format!("no such endpoint {path}")),
    }
}

async fn write_reply(stream: &mut TcpStream, reply: Reply) -> std::io::Result<()> {
    let reason = tokio_tungstenite::tungstenite::http::StatusCode::from_u16(reply.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let body = reply.body.map(|b| format!("{b}\n")).unwrap_or_default();
    let content_type = if reply.status == 204 { "" } else { "Content-Type: application/json\r\n" };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\n{content_type}Content-Length: {}\r\nConnection: close\r\n\r\n",
        reply.status,
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    stream.shutdown().await
}

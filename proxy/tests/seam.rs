//! The simulation seam: `handshake` and `relay` over in-memory streams with a fake clock.
//!
//! The runtime here has timers disabled, so any use of tokio time by the core would panic; the
//! environment's sleep only yields and advances a counter, as a simulated clock would. The
//! frame record of two runs with the same seed must be identical.

use futures_util::{SinkExt, StreamExt};
use proxy::{handshake, relay, FrameRecord, ProxyEnv, RelayEnd, Rule, RuleSet, Side, UpstreamUrl, Wire};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::duplex;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

/// A clock that moves only when the relay sleeps; records frames as `(t, dir, kind, action)`.
#[derive(Default)]
struct FakeEnv {
    now_us: Cell<u64>,
    records: RefCell<Vec<String>>,
}

/// Yields `polls` times, then advances the clock: a stand-in for a simulated timer.
struct FakeSleep<'a> {
    env: &'a FakeEnv,
    polls: u64,
    ms: u64,
}

impl Future for FakeSleep<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.polls == 0 {
            self.env.now_us.set(self.env.now_us.get() + self.ms * 1000);
            return Poll::Ready(());
        }
        self.polls -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl ProxyEnv for FakeEnv {
    fn now_us(&self) -> u64 {
        self.now_us.get()
    }
    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(FakeSleep { env: self, polls: ms.max(1), ms })
    }
    fn record(&self, r: &FrameRecord<'_>) {
        self.records.borrow_mut().push(format!(
            "{} {} {} {} {} {:?}",
            r.t_us,
            r.conn,
            r.direction.as_str(),
            r.kind.as_str(),
            r.action,
            r.rule_name
        ));
    }
}

/// One client sends `count` JSON frames through the proxy to an echo server and closes.
/// Returns what the client got back, the relay's end and the frame record.
fn run(seed: u64, rules: &[&str], count: usize) -> (Vec<String>, RelayEnd, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime without timers");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let rules = RuleSet::with_rules(seed, rules.iter().map(|r| Rule::parse(r).unwrap())).unwrap();
        let rules = Rc::new(RefCell::new(rules));
        let env = FakeEnv::default();
        let (client_end, proxy_client_side) = duplex(64 * 1024);
        let (proxy_upstream_side, server_end) = duplex(64 * 1024);

        let server = tokio::task::spawn_local(async move {
            let mut ws = tokio_tungstenite::accept_async(server_end).await.expect("server handshake");
            while let Some(Ok(message)) = ws.next().await {
                if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err() {
                    break;
                }
            }
        });
        let client = tokio::task::spawn_local(async move {
            let (mut ws, _) =
                tokio_tungstenite::client_async("ws://proxy/bus?s=1", client_end).await.expect("client handshake");
            for i in 0..count {
                let frame = serde_json::json!({"type": "msg", "i": i}).to_string();
                ws.send(Message::text(frame)).await.unwrap();
            }
            ws.send(Message::text("last")).await.unwrap();
            let mut got = Vec::new();
            while let Some(Ok(message)) = ws.next().await {
                if let Message::Text(text) = message {
                    let done = text.as_str() == "last";
                    got.push(text.to_string());
                    if done {
                        break;
                    }
                }
            }
            ws.close(None).await.unwrap();
            while ws.next().await.is_some() {}
            got
        });

        let url = UpstreamUrl::parse("ws://upstream:80").unwrap();
        let mut upstream_side = Some(proxy_upstream_side);
        let connect = |authority: String| {
            assert_eq!(authority, "upstream:80");
            let stream = upstream_side.take().expect("one upstream connection");
            async move { Ok(stream) }
        };
        let (client_ws, upstream_ws, hello) =
            handshake(proxy_client_side, &url, [7; 16], WebSocketConfig::default(), connect)
                .await
                .expect("both handshakes");
        assert_eq!(hello.path, "/bus?s=1");
        let end = relay(client_ws, upstream_ws, rules, 1, &env).await;
        let got = client.await.unwrap();
        server.await.unwrap();
        (got, end, env.records.into_inner())
    })
}

#[test]
fn relay_runs_without_tokio_time_and_reports_a_clean_close() {
    let (got, end, records) = run(0, &[], 20);
    assert_eq!(got.len(), 21);
    assert_eq!(
        end,
        RelayEnd::Closed {
            by: Side::Client,
            // The client sent a close frame without a code; it is passed on as such.
            code: None,
            reason: String::new()
        }
    );
    assert!(records.iter().any(|r| r.contains("up close forward")), "{records:#?}");
}

#[test]
fn same_seed_same_record() {
    let rules = ["drop always up p=0.5 type=msg", "delay=7 once down", "duplicate times=2 down type=msg"];
    let first = run(42, &rules, 60);
    let again = run(42, &rules, 60);
    assert_eq!(first.2, again.2, "the frame record differs between two runs with one seed");
    assert_eq!(first.0, again.0);
    let other = run(43, &rules, 60);
    assert_ne!(first.2, other.2, "a different seed should draw differently");
    let dropped = first.2.iter().filter(|r| r.contains(" drop ")).count();
    assert!((15..45).contains(&dropped), "{dropped} of 60 dropped at p=0.5");
    // Dropped frames never come back; two echoes were duplicated; the delay moved the clock.
    assert_eq!(first.0.len(), 60 - dropped + 1 + 2);
    assert!(first.2.iter().any(|r| r.starts_with("7000 ")), "{:#?}", first.2);
}

/// Relay streams wired to a raw client and a raw server over duplex pipes, without handshakes:
/// `(client, relay's client side, relay's upstream side, server)`.
async fn wired() -> (
    tokio_tungstenite::WebSocketStream<tokio::io::DuplexStream>,
    tokio_tungstenite::WebSocketStream<Wire<tokio::io::DuplexStream>>,
    tokio_tungstenite::WebSocketStream<Wire<tokio::io::DuplexStream>>,
    tokio_tungstenite::WebSocketStream<tokio::io::DuplexStream>,
) {
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::WebSocketStream;
    let (client_end, proxy_client_side) = duplex(64 * 1024);
    let (proxy_upstream_side, server_end) = duplex(64 * 1024);
    (
        WebSocketStream::from_raw_socket(client_end, Role::Client, None).await,
        WebSocketStream::from_raw_socket(Wire::new(proxy_client_side, Vec::new()), Role::Server, None).await,
        WebSocketStream::from_raw_socket(Wire::new(proxy_upstream_side, Vec::new()), Role::Client, None).await,
        WebSocketStream::from_raw_socket(server_end, Role::Server, None).await,
    )
}

#[test]
fn frames_ahead_of_a_delayed_frame_are_not_held_by_it() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime without timers");
    runtime.block_on(async {
        let rules = RuleSet::with_rules(0, [Rule::parse("delay=1000 once up type=slow").unwrap()]).unwrap();
        let env = FakeEnv::default();
        let (mut client, proxy_client, proxy_upstream, mut server) = wired().await;
        // Both frames reach the relay in one read, so it batches them.
        client.feed(Message::text(r#"{"type":"fast"}"#)).await.unwrap();
        client.feed(Message::text(r#"{"type":"slow"}"#)).await.unwrap();
        client.flush().await.unwrap();
        let relay = relay(proxy_client, proxy_upstream, Rc::new(RefCell::new(rules)), 1, &env);
        let receive = async {
            let mut arrivals = Vec::new();
            while let Some(Ok(Message::Text(text))) = server.next().await {
                arrivals.push((text.to_string(), env.now_us()));
                if arrivals.len() == 2 {
                    break;
                }
            }
            client.close(None).await.unwrap();
            arrivals
        };
        let (_, arrivals) = futures_util::future::join(relay, receive).await;
        assert_eq!(
            arrivals,
            [(r#"{"type":"fast"}"#.to_string(), 0), (r#"{"type":"slow"}"#.to_string(), 1_000_000)],
            "the fast frame leaves before the delay, the slow one after it"
        );
    });
}

#[test]
fn frames_sent_before_a_peer_vanishes_are_still_delivered() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime without timers");
    runtime.block_on(async {
        let env = FakeEnv::default();
        let (mut client, proxy_client, proxy_upstream, mut server) = wired().await;
        for i in 0..3 {
            client.feed(Message::text(format!("frame {i}"))).await.unwrap();
        }
        client.flush().await.unwrap();
        // The client goes away without a close frame, right after its frames.
        drop(client);
        let relay = relay(proxy_client, proxy_upstream, Rc::new(RefCell::new(RuleSet::new(0))), 1, &env);
        let receive = async {
            let mut got = Vec::new();
            while let Some(Ok(message)) = server.next().await {
                if let Message::Text(text) = message {
                    got.push(text.to_string());
                }
            }
            got
        };
        let (end, got) = futures_util::future::join(relay, receive).await;
        assert!(matches!(end, RelayEnd::Dropped { side: Side::Client, .. }), "{end:?}");
        assert_eq!(got, ["frame 0", "frame 1", "frame 2"]);
    });
}

/// Sends `frames` from the client through a relay with `rules`; returns what the server read,
/// with the fake clock at each arrival. The client then closes.
async fn arrivals(rules: &[&str], frames: Vec<Message>, expected: usize) -> Vec<(Message, u64)> {
    let rules = RuleSet::with_rules(0, rules.iter().map(|r| Rule::parse(r).unwrap())).unwrap();
    let env = FakeEnv::default();
    let (mut client, proxy_client, proxy_upstream, mut server) = wired().await;
    for frame in frames {
        client.feed(frame).await.unwrap();
    }
    client.flush().await.unwrap();
    let relay = relay(proxy_client, proxy_upstream, Rc::new(RefCell::new(rules)), 1, &env);
    let receive = async {
        let mut got = Vec::new();
        while got.len() < expected {
            match server.next().await {
                Some(Ok(message)) => got.push((message, env.now_us())),
                _ => break,
            }
        }
        client.close(None).await.unwrap();
        // Let the client read the close reply (and the pong) while the relay finishes.
        while client.next().await.is_some() {}
        got
    };
    let (_, got) = futures_util::future::join(relay, receive).await;
    got
}

#[test]
fn each_delayed_frame_is_held_for_its_own_delay_in_order() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime without timers");
    runtime.block_on(async {
        let frames: Vec<Message> = (0..10).map(|i| Message::text(format!(r#"{{"type":"slow","i":{i}}}"#))).collect();
        let got = arrivals(&["delay=200 always up type=slow"], frames.clone(), 10).await;
        let texts: Vec<Message> = got.iter().map(|(m, _)| m.clone()).collect();
        assert_eq!(texts, frames, "order kept");
        let times: Vec<u64> = got.iter().map(|(_, t)| *t).collect();
        assert_eq!(times, vec![200_000; 10], "ten frames read together are all released 200 ms later");
    });
}

#[test]
fn control_frames_pass_a_delayed_frame() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime without timers");
    runtime.block_on(async {
        let slow = Message::text(r#"{"type":"slow"}"#);
        let ping = Message::Ping(b"keepalive".to_vec().into());
        let fast = Message::text("behind the slow one");
        let got = arrivals(&["delay=5000 once up type=slow"], vec![slow.clone(), ping.clone(), fast.clone()], 3).await;
        assert_eq!(
            got,
            [(ping, 0), (slow, 5_000_000), (fast, 5_000_000)],
            "the ping goes on at once; the data frame behind the delayed one keeps its place"
        );
    });
}

#[test]
fn a_reordered_frame_leaves_right_behind_its_partner() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime without timers");
    runtime.block_on(async {
        let first = Message::text(r#"{"type":"result","id":1}"#);
        let other = Message::text(r#"{"type":"other"}"#);
        let second = Message::text(r#"{"type":"result","id":2}"#);
        let tail = Message::text(r#"{"type":"result","id":3}"#);
        let frames = vec![first.clone(), other.clone(), second.clone(), tail.clone()];
        let got = arrivals(&["reorder once up type=result"], frames, 4).await;
        assert_eq!(
            got,
            [(other, 0), (second, 0), (first, 0), (tail, 0)],
            "frames the rule does not select pass the held one; its partner goes first, then it; the rule is used up"
        );
    });
}

#[test]
fn a_reordered_frame_with_no_partner_leaves_at_its_limit() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime without timers");
    runtime.block_on(async {
        let lonely = Message::text(r#"{"type":"result","id":1}"#);
        let other = Message::text(r#"{"type":"other"}"#);
        let got = arrivals(&["reorder=300 once up type=result"], vec![lonely.clone(), other.clone()], 2).await;
        assert_eq!(got, [(other, 0), (lonely, 300_000)], "held for its partner at most 300 ms, then sent anyway");
    });
}

#[test]
fn a_delayed_partner_still_passes_first() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime without timers");
    runtime.block_on(async {
        let first = Message::text(r#"{"type":"result","id":1}"#);
        let second = Message::text(r#"{"type":"result","id":2}"#);
        let rules = ["delay=50 once up id=2", "reorder once up type=result"];
        let got = arrivals(&rules, vec![first.clone(), second.clone()], 2).await;
        assert_eq!(got, [(second, 50_000), (first, 50_000)], "the partner's delay holds the reordered frame too");
    });
}

//! The two opening handshakes: the client's to the proxy, the proxy's to the upstream.
//!
//! The proxy reads the client's request before answering it, so it can open the upstream with
//! the same path, query, subprotocols and end-to-end headers and then answer the client with
//! what the upstream answered: the chosen subprotocol, or the upstream's refusal, or a 502 when
//! the upstream cannot be reached. Both handshakes are written here over any byte stream (not
//! with tungstenite's handshake machines) so that the upstream key comes from the caller's
//! seeded generator and the same code runs on simulated streams.

use std::future::Future;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::http::{self, header::HeaderName, HeaderValue, Request};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;

use crate::wire::Wire;

/// The longest request or response head the proxy reads, so a peer cannot grow the buffer.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The most header lines a head may have.
const MAX_HEADERS: usize = 64;

/// Headers that belong to one hop (or to the WebSocket handshake itself) and are never copied.
const HOP_HEADERS: [&str; 13] = [
    "host",
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-accept",
    // Extensions (permessage-deflate) are negotiated per hop; the proxy offers none.
    "sec-websocket-extensions",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "te",
    "trailer",
    "proxy-connection",
];

/// Where the upstream is: `ws://HOST[:PORT][/PREFIX]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamUrl {
    pub host: String,
    pub port: u16,
    /// Put before every client path; empty for `ws://host:port` and `ws://host:port/`.
    pub prefix: String,
}

impl UpstreamUrl {
    /// Reads `ws://HOST[:PORT][/PREFIX]`; `wss://` is refused (the proxy speaks no TLS).
    pub fn parse(text: &str) -> Result<Self, String> {
        let expected = "expected ws://HOST:PORT[/PATH]";
        let rest = match text.split_once("://") {
            Some(("ws", rest)) => rest,
            Some(("wss", _)) => {
                return Err(format!("`{text}`: wss:// is not supported (the proxy speaks no TLS); {expected}"))
            }
            _ => return Err(format!("`{text}`: {expected}")),
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if path.contains('?') || path.contains('#') {
            return Err(format!(
                "`{text}`: the upstream URL takes no query or fragment (the client's query is passed on); {expected}"
            ));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) =
                v6.split_once(']').ok_or_else(|| format!("`{text}`: unclosed `[` in the host; {expected}"))?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        if host.is_empty() || host.contains(['@', ' ']) {
            return Err(format!("`{text}`: bad host; {expected}"));
        }
        let port = match port {
            Some(port) => port.parse::<u16>().map_err(|_| format!("`{text}`: bad port `{port}`; {expected}"))?,
            None => 80,
        };
        Ok(UpstreamUrl { host: host.to_string(), port, prefix: path.trim_end_matches('/').to_string() })
    }

    /// `HOST:PORT` as a `Host` header and a socket address want it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl std::fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ws://{}{}", self.authority(), self.prefix)
    }
}

/// A client's opening request, read but not yet answered.
#[derive(Clone, Debug)]
pub struct ClientHello {
    /// Path and query, as the client sent them.
    pub path: String,
    /// The offered subprotocols (the raw `Sec-WebSocket-Protocol` value), if any.
    pub protocols: Option<String>,
    /// End-to-end headers in the client's order, copied to the upstream request.
    pub headers: Vec<(String, Vec<u8>)>,
    key: String,
    /// Bytes read past the head (a well-behaved client sends none before the answer).
    leftover: Vec<u8>,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("upstream {url} unreachable: {error}")]
    Unreachable { url: String, error: io::Error },
    /// The upstream answered with another status than 101; its answer is passed to the client.
    #[error("upstream {url} refused the upgrade: HTTP {status} {reason}")]
    Refused { url: String, status: u16, reason: String, headers: Vec<(String, Vec<u8>)>, body: Option<Vec<u8>> },
    #[error("upstream {url} answered badly: {problem}")]
    BadResponse { url: String, problem: String },
    #[error("upstream {url} did not answer the handshake within {ms} ms")]
    UpstreamTimeout { url: String, ms: u64 },
}

impl HandshakeError {
    /// Whether the upstream, not the client, is at fault (logged as `upstream_error`).
    pub fn is_upstream(&self) -> bool {
        matches!(
            self,
            HandshakeError::Unreachable { .. }
                | HandshakeError::Refused { .. }
                | HandshakeError::BadResponse { .. }
                | HandshakeError::UpstreamTimeout { .. }
        )
    }
}

/// What the upstream's `101` said that the client's `101` repeats.
#[derive(Clone, Debug, Default)]
pub struct UpstreamAnswer {
    /// The subprotocol the upstream chose.
    pub protocol: Option<String>,
    /// End-to-end headers (`Set-Cookie`, custom ones), in the upstream's order.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Reads one HTTP head (through the blank line); returns it and whatever followed.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(Vec<u8>, Vec<u8>), HandshakeError> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(HandshakeError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed during the handshake",
            )));
        }
        let searched_from = buffer.len().saturating_sub(3);
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) =
            buffer[searched_from..].windows(4).position(|w| w == b"\r\n\r\n").map(|i| searched_from + i + 4)
        {
            let leftover = buffer.split_off(end);
            return Ok((buffer, leftover));
        }
        if buffer.len() > MAX_HEAD_BYTES {
            return Err(HandshakeError::BadRequest(format!("head longer than {MAX_HEAD_BYTES} bytes")));
        }
    }
}

fn header_has_token(value: &[u8], token: &str) -> bool {
    String::from_utf8_lossy(value).split(',').any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The path and query of a request target: as is for `/path?query`, and taken out of an
/// absolute URL (`ws://host/path?query`, which a client talking to a proxy may send).
fn origin_form(target: &str) -> Result<String, HandshakeError> {
    if target.starts_with('/') {
        return Ok(target.to_string());
    }
    let absolute = ["ws://", "wss://", "http://", "https://"].iter().find_map(|scheme| {
        target.get(..scheme.len()).filter(|s| s.eq_ignore_ascii_case(scheme)).map(|_| &target[scheme.len()..])
    });
    match absolute {
        Some(rest) => Ok(match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('?') => format!("/{}", &rest[i..]),
            Some(i) => rest[i..].to_string(),
            None => "/".to_string(),
        }),
        None => Err(HandshakeError::BadRequest(format!(
            "request target `{target}`: expected a path (/...) or an absolute ws:// or http:// URL"
        ))),
    }
}

/// Reads a client's WebSocket opening request.
pub async fn read_client_hello<S: AsyncRead + Unpin>(stream: &mut S) -> Result<ClientHello, HandshakeError> {
    let (head, leftover) = read_head(stream).await?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(HandshakeError::BadRequest("incomplete head".into())),
        Err(e) => return Err(HandshakeError::BadRequest(e.to_string())),
    }
    if request.method != Some("GET") {
        return Err(HandshakeError::BadRequest("a WebSocket upgrade must be a GET".into()));
    }
    let path = origin_form(request.path.unwrap_or("/"))?;
    let find = |name: &str| request.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value);
    if !find("upgrade").is_some_and(|v| header_has_token(v, "websocket"))
        || !find("connection").is_some_and(|v| header_has_token(v, "upgrade"))
    {
        return Err(HandshakeError::BadRequest(
            "not a WebSocket upgrade (Upgrade: websocket, Connection: Upgrade)".into(),
        ));
    }
    if find("sec-websocket-version") != Some(b"13") {
        return Err(HandshakeError::BadRequest("Sec-WebSocket-Version must be 13".into()));
    }
    let key = find("sec-websocket-key")
        .and_then(|k| std::str::from_utf8(k).ok())
        .map(|k| k.trim().to_string())
        .ok_or_else(|| HandshakeError::BadRequest("missing Sec-WebSocket-Key".into()))?;
    // Several Sec-WebSocket-Protocol lines are one comma-separated list.
    let protocols: Vec<String> = request
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("sec-websocket-protocol"))
        .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
        .collect();
    let protocols = (!protocols.is_empty()).then(|| protocols.join(", "));
    let headers = request
        .headers
        .iter()
        .filter(|h| {
            let name = h.name.to_ascii_lowercase();
            !HOP_HEADERS.contains(&name.as_str()) && name != "sec-websocket-protocol"
        })
        .map(|h| (h.name.to_string(), h.value.to_vec()))
        .collect();
    Ok(ClientHello { path, protocols, headers, key, leftover })
}

/// The upstream's opening request for a client's hello: same path (under the URL's prefix),
/// query, subprotocols and end-to-end headers, and the five handshake headers, with the key
/// made from `key` (16 bytes the caller drew from its seeded generator).
pub fn upstream_request(url: &UpstreamUrl, hello: &ClientHello, key: [u8; 16]) -> Result<Request<()>, HandshakeError> {
    let bad = |problem: String| HandshakeError::BadRequest(problem);
    // `read_client_hello` leaves every path starting with `/`.
    let path = format!("{}{}", url.prefix, hello.path);
    let mut builder = Request::builder()
        .method("GET")
        .uri(&path)
        .header("Host", url.authority())
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", data_encoding::BASE64.encode(&key));
    if let Some(protocols) = &hello.protocols {
        builder = builder.header("Sec-WebSocket-Protocol", protocols.as_str());
    }
    for (name, value) in &hello.headers {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(format!("header `{name}`: {e}")))?;
        let value = HeaderValue::from_bytes(value).map_err(|e| bad(format!("header `{name}`: {e}")))?;
        builder = builder.header(name, value);
    }
    builder.body(()).map_err(|e| bad(e.to_string()))
}

fn write_request(request: &Request<()>) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(format!("GET {target} HTTP/1.1\r\n").as_bytes());
    for (name, value) in request.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The end-to-end headers of a head: what is not about this hop or the WebSocket handshake.
fn end_to_end(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .filter(|h| {
            let name = h.name.to_ascii_lowercase();
            !HOP_HEADERS.contains(&name.as_str()) && name != "sec-websocket-protocol"
        })
        .map(|h| (h.name.to_string(), h.value.to_vec()))
        .collect()
}

/// Sends `request` on `stream` and checks the upstream's answer; returns the WebSocket and
/// what of the answer the client's `101` repeats. Every failure here is the upstream's.
pub async fn connect_upstream<S>(
    mut stream: S,
    request: &Request<()>,
    url: &UpstreamUrl,
    config: WebSocketConfig,
) -> Result<(WebSocketStream<Wire<S>>, UpstreamAnswer), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let url_text = url.to_string();
    let bad = |problem: &str| HandshakeError::BadResponse { url: url_text.clone(), problem: problem.to_string() };
    let io = |e: io::Error| bad(&format!("the connection failed during the handshake: {e}"));
    stream.write_all(&write_request(request)).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    let (head, leftover) = read_head(&mut stream).await.map_err(|e| match e {
        HandshakeError::BadRequest(p) => bad(&p),
        HandshakeError::Io(e) => io(e),
        other => other,
    })?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(bad("incomplete head")),
        Err(e) => return Err(bad(&e.to_string())),
    }
    let status = response.code.unwrap_or(0);
    let find = |name: &str| response.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value);
    if status != 101 {
        if !(200..600).contains(&status) {
            return Err(bad(&format!("HTTP {status} is not an answer to an upgrade")));
        }
        // The refusal goes to the client as it is: status, headers and a short body.
        let length = find("content-length").and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
        let body = match length {
            Some(length) if length <= MAX_HEAD_BYTES => {
                let mut body = leftover;
                if body.len() < length {
                    let start = body.len();
                    body.resize(length, 0);
                    stream.read_exact(&mut body[start..]).await.map_err(io)?;
                }
                body.truncate(length);
                Some(body)
            }
            _ => None,
        };
        return Err(HandshakeError::Refused {
            url: url_text,
            status,
            reason: response.reason.unwrap_or("").to_string(),
            headers: end_to_end(response.headers),
            body,
        });
    }
    let key = request.headers().get("Sec-WebSocket-Key").map(|k| k.as_bytes()).unwrap_or_default();
    if find("sec-websocket-accept") != Some(derive_accept_key(key).as_bytes()) {
        return Err(bad("wrong or missing Sec-WebSocket-Accept"));
    }
    if find("sec-websocket-extensions").is_some() {
        return Err(bad("an extension was negotiated that was not offered"));
    }
    let protocol = match find("sec-websocket-protocol") {
        None => None,
        Some(chosen) => {
            let chosen = String::from_utf8_lossy(chosen).trim().to_string();
            let offered = request.headers().get("Sec-WebSocket-Protocol").and_then(|v| v.to_str().ok()).unwrap_or("");
            if !offered.split(',').any(|p| p.trim() == chosen) {
                return Err(bad(&format!("subprotocol `{chosen}` was not offered")));
            }
            Some(chosen)
        }
    };
    let answer = UpstreamAnswer { protocol, headers: end_to_end(response.headers) };
    Ok((websocket(stream, leftover, Role::Client, config).await, answer))
}

/// A WebSocket over `stream`, reading `already_read` first.
async fn websocket<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    already_read: Vec<u8>,
    role: Role,
    config: WebSocketConfig,
) -> WebSocketStream<Wire<S>> {
    WebSocketStream::from_raw_socket(Wire::new(stream, already_read), role, Some(config)).await
}

/// Writes one HTTP response head and body.
async fn write_response<S: AsyncWrite + Unpin>(
    stream: &mut S,
    status: u16,
    reason: &str,
    headers: &[(String, Vec<u8>)],
    body: &[u8],
) -> io::Result<()> {
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n").into_bytes();
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if status != 101 {
        out.extend_from_slice(format!("Content-Length: {}\r\nConnection: close\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    stream.write_all(&out).await?;
    stream.flush().await?;
    if status != 101 {
        stream.shutdown().await?;
    }
    Ok(())
}

/// Answers a client's hello with 101 (and what the upstream's 101 said) and returns its WebSocket.
pub async fn accept_client<S>(
    mut stream: S,
    hello: ClientHello,
    answer: &UpstreamAnswer,
    config: WebSocketConfig,
) -> Result<WebSocketStream<Wire<S>>, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut headers: Vec<(String, Vec<u8>)> = vec![
        ("Connection".into(), b"Upgrade".to_vec()),
        ("Upgrade".into(), b"websocket".to_vec()),
        ("Sec-WebSocket-Accept".into(), derive_accept_key(hello.key.as_bytes()).into_bytes()),
    ];
    if let Some(protocol) = &answer.protocol {
        headers.push(("Sec-WebSocket-Protocol".into(), protocol.clone().into_bytes()));
    }
    headers.extend(answer.headers.iter().cloned());
    write_response(&mut stream, 101, "Switching Protocols", &headers, b"").await?;
    Ok(websocket(stream, hello.leftover, Role::Server, config).await)
}

fn canonical_reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error")
}

/// Answers a client's request with an HTTP error and a one-line text body.
pub async fn reject_client<S: AsyncWrite + Unpin>(stream: &mut S, status: u16, body: &str) -> io::Result<()> {
    let headers = [("Content-Type".to_string(), b"text/plain; charset=utf-8".to_vec())];
    write_response(stream, status, canonical_reason(status), &headers, format!("{body}\n").as_bytes()).await
}

/// What a successful handshake gives: the client's WebSocket, the upstream's, and the request.
pub type Opened<C, U> = (WebSocketStream<Wire<C>>, WebSocketStream<Wire<U>>, ClientHello);

/// Both handshakes for one client: reads its request, opens the upstream through `connect`,
/// and answers the client with the upstream's outcome. On failure the client has already been
/// answered (400 for a bad request, the upstream's own answer if it refused, 502 for an
/// unreachable or misbehaving upstream) and the error says why.
pub async fn handshake<C, U, F, Fut>(
    mut client: C,
    url: &UpstreamUrl,
    key: [u8; 16],
    config: WebSocketConfig,
    connect: F,
) -> Result<Opened<C, U>, HandshakeError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = io::Result<U>>,
{
    let hello = read_hello_or_reject(&mut client).await?;
    answer_hello(client, hello, url, key, config, connect, (std::future::pending(), 0)).await
}

/// Reads a client's request; a bad one is answered `400` before the error is returned.
pub async fn read_hello_or_reject<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut C,
) -> Result<ClientHello, HandshakeError> {
    match read_client_hello(client).await {
        Ok(hello) => Ok(hello),
        Err(HandshakeError::BadRequest(problem)) => {
            let _ = reject_client(client, 400, &format!("proxy: {problem}")).await;
            Err(HandshakeError::BadRequest(problem))
        }
        Err(other) => Err(other),
    }
}

/// The second half of [`handshake`], for a request already read: opens the upstream and
/// answers the client. `deadline` bounds the upstream's part (`deadline_ms` is only for the
/// message): if it completes first, the client gets `502`.
#[allow(clippy::too_many_arguments)]
pub async fn answer_hello<C, U, F, Fut, D>(
    mut client: C,
    hello: ClientHello,
    url: &UpstreamUrl,
    key: [u8; 16],
    config: WebSocketConfig,
    connect: F,
    deadline: (D, u64),
) -> Result<Opened<C, U>, HandshakeError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = io::Result<U>>,
    D: Future<Output = ()>,
{
    let (deadline, deadline_ms) = deadline;
    let upstream = async {
        let request = upstream_request(url, &hello, key)?;
        let stream = connect(url.authority())
            .await
            .map_err(|error| HandshakeError::Unreachable { url: url.to_string(), error })?;
        connect_upstream(stream, &request, url, config).await
    };
    let outcome = tokio::select! {
        biased;
        outcome = upstream => outcome,
        () = deadline => Err(HandshakeError::UpstreamTimeout { url: url.to_string(), ms: deadline_ms }),
    };
    match outcome {
        Ok((upstream, answer)) => {
            let client = accept_client(client, hello.clone(), &answer, config).await?;
            Ok((client, upstream, hello))
        }
        Err(HandshakeError::Refused { url, status, reason, headers, body }) => {
            let _ = match &body {
                Some(body) => write_response(&mut client, status, &reason, &headers, body).await,
                None => {
                    let mut headers = headers.clone();
                    headers.push(("Content-Type".to_string(), b"text/plain; charset=utf-8".to_vec()));
                    let text = format!("proxy: upstream {url} refused the upgrade: HTTP {status} {reason}\n");
                    write_response(&mut client, status, &reason, &headers, text.as_bytes()).await
                }
            };
            Err(HandshakeError::Refused { url, status, reason, headers, body })
        }
        Err(error) => {
            let status = if let HandshakeError::BadRequest(_) = error { 400 } else { 502 };
            let _ = reject_client(&mut client, status, &format!("proxy: {error}")).await;
            Err(error)
        }
    }
}

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
    #[error("upstream {url} refused the upgrade: HTTP {status} {reason}")]
    Refused { url: String, status: u16, reason: String },
    #[error("upstream {url} answered badly: {problem}")]
    BadResponse { url: String, problem: String },
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
    let path = request.path.unwrap_or("/").to_string();
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
    let path = if hello.path.starts_with('/') {
        format!("{}{}", url.prefix, hello.path)
    } else {
        format!("{}/{}", url.prefix, hello.path)
    };
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

/// Sends `request` on `stream` and checks the upstream's answer; returns the WebSocket and the
/// subprotocol the upstream chose.
pub async fn connect_upstream<S>(
    mut stream: S,
    request: &Request<()>,
    url: &UpstreamUrl,
    config: WebSocketConfig,
) -> Result<(WebSocketStream<S>, Option<String>), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let url_text = url.to_string();
    let bad = |problem: &str| HandshakeError::BadResponse { url: url_text.clone(), problem: problem.to_string() };
    stream.write_all(&write_request(request)).await?;
    stream.flush().await?;
    let (head, leftover) = read_head(&mut stream).await.map_err(|e| match e {
        HandshakeError::BadRequest(p) => bad(&p),
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
    if status != 101 {
        return Err(HandshakeError::Refused {
            url: url_text,
            status,
            reason: response.reason.unwrap_or("").to_string(),
        });
    }
    let find = |name: &str| response.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value);
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
    let socket = WebSocketStream::from_partially_read(stream, leftover, Role::Client, Some(config)).await;
    Ok((socket, protocol))
}

/// Answers a client's hello with 101 (and the chosen subprotocol) and returns its WebSocket.
pub async fn accept_client<S>(
    mut stream: S,
    hello: ClientHello,
    protocol: Option<&str>,
    config: WebSocketConfig,
) -> Result<WebSocketStream<S>, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: {}\r\n",
        derive_accept_key(hello.key.as_bytes())
    );
    if let Some(protocol) = protocol {
        response.push_str(&format!("Sec-WebSocket-Protocol: {protocol}\r\n"));
    }
    response.push_str("\r\n");
    stream.write_all(response.as_bytes()).await?;
    stream.flush().await?;
    Ok(WebSocketStream::from_partially_read(stream, hello.leftover, Role::Server, Some(config)).await)
}

/// Answers a client's request with an HTTP error and a one-line text body.
pub async fn reject_client<S: AsyncWrite + Unpin>(stream: &mut S, status: u16, body: &str) -> io::Result<()> {
    let reason = http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error");
    let body = format!("{body}\n");
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.flush().await?;
    stream.shutdown().await
}

/// Both handshakes for one client: reads its request, opens the upstream through `connect`,
/// and answers the client with the upstream's outcome. On failure the client has already been
/// answered (400 for a bad request, 502 for an unreachable or misbehaving upstream, the
/// upstream's own status if it refused) and the error says why.
pub async fn handshake<C, U, F, Fut>(
    mut client: C,
    url: &UpstreamUrl,
    key: [u8; 16],
    config: WebSocketConfig,
    connect: F,
) -> Result<(WebSocketStream<C>, WebSocketStream<U>, ClientHello), HandshakeError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = io::Result<U>>,
{
    let hello = match read_client_hello(&mut client).await {
        Ok(hello) => hello,
        Err(HandshakeError::BadRequest(problem)) => {
            let _ = reject_client(&mut client, 400, &format!("proxy: {problem}")).await;
            return Err(HandshakeError::BadRequest(problem));
        }
        Err(other) => return Err(other),
    };
    let outcome = async {
        let request = upstream_request(url, &hello, key)?;
        let stream = connect(url.authority())
            .await
            .map_err(|error| HandshakeError::Unreachable { url: url.to_string(), error })?;
        connect_upstream(stream, &request, url, config).await
    }
    .await;
    match outcome {
        Ok((upstream, protocol)) => {
            let client = accept_client(client, hello.clone(), protocol.as_deref(), config).await?;
            Ok((client, upstream, hello))
        }
        Err(error) => {
            let status = match &error {
                HandshakeError::Refused { status, .. } if (400..600).contains(status) => *status,
                HandshakeError::BadRequest(_) => 400,
                _ => 502,
            };
            let _ = reject_client(&mut client, status, &format!("proxy: {error}")).await;
            Err(error)
        }
    }
}

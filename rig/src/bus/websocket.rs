//! WebSocket connection set-up with a seeded handshake key, the bus's frame limit, and closing
//! a peer that broke it.
//!
//! tungstenite draws the Sec-WebSocket-Key from OS randomness unless the request already
//! carries all five handshake headers, so the client request is built in full here.
//!
//! Both opening handshakes are written and read here, byte for byte as tungstenite's handshake
//! machines write them and with the checks they make, and the stream is then handed to
//! tokio-tungstenite as it stands, so the framing is tungstenite's. Every simulated connection
//! makes both, and tungstenite's machines build an `http` request or response (a parsed URI, a
//! header map of owned names and values) on each side: about 35,000 instructions a connection,
//! 4 % of a run. A client request whose host or path is not plain (see [`plain_target`]) still
//! goes through tungstenite's client, so its bytes are tungstenite's whatever the caller passes.

use rand::RngCore;
use rand_chacha::ChaCha8Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError, SubProtocolError};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame, Role};
use tokio_tungstenite::tungstenite::{self, http};
use tokio_tungstenite::WebSocketStream;

/// A handshake key drawn from a seeded stream.
pub fn handshake_key(rng: &mut ChaCha8Rng) -> [u8; 16] {
    let mut key = [0u8; 16];
    rng.fill_bytes(&mut key);
    key
}

/// Opens a client WebSocket on an established stream with the given handshake key.
pub async fn connect<S>(
    mut stream: S,
    host: &str,
    path: &str,
    key: [u8; 16],
) -> Result<WebSocketStream<S>, tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if !plain_target(host, path) {
        return connect_through_tungstenite(stream, host, path, key).await;
    }
    let key = data_encoding::BASE64.encode(&key);
    stream.write_all(&client_request(host, path, &key)).await?;
    stream.flush().await?;
    let accept = derive_accept_key(key.as_bytes());
    let mut head = Head::new();
    loop {
        head.read_from(&mut stream).await?;
        if let Some(size) = parse_response(head.bytes(), &accept)? {
            let tail = head.bytes()[size..].to_vec();
            return Ok(WebSocketStream::from_partially_read(stream, tail, Role::Client, Some(config())).await);
        }
    }
}

/// The client's way for a host or path that is not plain: the request built as an `http`
/// request and sent by tungstenite's handshake machine.
async fn connect_through_tungstenite<S>(
    stream: S,
    host: &str,
    path: &str,
    key: [u8; 16],
) -> Result<WebSocketStream<S>, tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let request =
        upgrade_request(host, path, &data_encoding::BASE64.encode(&key)).map_err(tungstenite::Error::HttpFormat)?;
    let (socket, _response) = tokio_tungstenite::client_async_with_config(request, stream, Some(config())).await?;
    Ok(socket)
}

/// The upgrade request tungstenite's client is given: the hand-written request is held to the
/// bytes tungstenite writes for this one (the unit tests).
fn upgrade_request(host: &str, path: &str, key: &str) -> Result<http::Request<()>, http::Error> {
    http::Request::builder()
        .method("GET")
        .uri(format!("ws://{host}{path}"))
        .header("Host", host)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", key)
        .body(())
}

/// Whether `ws://{host}{path}` is a URI that `http` keeps exactly as written, so the request
/// line and `Host` header written here are the ones tungstenite writes: a host of letters,
/// digits, `-`, `.`, `_` and a `:port`, and a path from `/` of unreserved, sub-delimiter and
/// `:@/?%` characters (the unit test holds every one of them to tungstenite's bytes).
pub(crate) fn plain_target(host: &str, path: &str) -> bool {
    let host_ok = !host.is_empty()
        && !host.starts_with(':')
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    let path_ok = path.starts_with('/')
        && path.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'.'
                        | b'_'
                        | b'~'
                        | b'!'
                        | b'$'
                        | b'&'
                        | b'\''
                        | b'('
                        | b')'
                        | b'*'
                        | b'+'
                        | b','
                        | b';'
                        | b'='
                        | b':'
                        | b'@'
                        | b'/'
                        | b'?'
                        | b'%'
                )
        });
    host_ok && path_ok
}

/// The client's opening request as tungstenite writes it: the request line, then the five
/// handshake headers in its order and case.
fn client_request(host: &str, path: &str, key: &str) -> Vec<u8> {
    let parts: [&[u8]; 7] = [
        b"GET ",
        path.as_bytes(),
        b" HTTP/1.1\r\nHost: ",
        host.as_bytes(),
        b"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ",
        key.as_bytes(),
        b"\r\n\r\n",
    ];
    parts.concat()
}

/// Accepts a server-side WebSocket on an established stream: reads the client's request, checks
/// it as tungstenite's server does, and answers `101` with tungstenite's bytes. A request
/// tungstenite refuses is refused with its error, before anything is written.
pub async fn accept<S>(mut stream: S) -> Result<WebSocketStream<S>, tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut head = Head::new();
    let accept = loop {
        head.read_from(&mut stream).await?;
        if let Some(accept) = parse_request(head.bytes())? {
            break accept;
        }
    };
    stream.write_all(&server_response(&accept)).await?;
    stream.flush().await?;
    Ok(WebSocketStream::from_raw_socket(stream, Role::Server, Some(config())).await)
}

/// The server's `101` as tungstenite writes it (an `http` header map's names are lower case).
fn server_response(accept: &str) -> Vec<u8> {
    let parts: [&[u8]; 3] = [
        b"HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: ",
        accept.as_bytes(),
        b"\r\n\r\n",
    ];
    parts.concat()
}

/// The most header lines a head may have: tungstenite's limit.
const MAX_HEADERS: usize = 124;
/// How much one read takes: tungstenite's read chunk, so a head arriving in several segments
/// is read in the same reads, and bytes after the head are seen (or not) as tungstenite sees them.
const READ_CHUNK: usize = 4096;

/// An opening handshake's head as it is read, with tungstenite's guard against a peer sending
/// it in too many pieces or at too great a length.
struct Head {
    bytes: Vec<u8>,
    reads: usize,
}

impl Head {
    fn new() -> Self {
        Head { bytes: Vec::new(), reads: 0 }
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Reads once (up to [`READ_CHUNK`] bytes); the end of the stream is an unfinished
    /// handshake.
    async fn read_from<S: AsyncRead + Unpin>(&mut self, stream: &mut S) -> Result<(), tungstenite::Error> {
        // Into reserved space, not zeroed first (zeroing a chunk per read cost more than the
        // read), and never more than one chunk at a time, as tungstenite reads.
        self.bytes.reserve(READ_CHUNK);
        if (&mut *stream).take(READ_CHUNK as u64).read_buf(&mut self.bytes).await? == 0 {
            return Err(tungstenite::Error::Protocol(ProtocolError::HandshakeIncomplete));
        }
        // tungstenite's `AttackCheck`: at most 64 KiB, 512 reads, and after 64 reads 128 bytes
        // a read on average.
        self.reads += 1;
        if self.bytes.len() > 65536 || self.reads > 512 || (self.reads > 64 && self.reads * 128 > self.bytes.len()) {
            return Err(tungstenite::Error::AttackAttempt);
        }
        Ok(())
    }
}

fn httparse_error(error: httparse::Error) -> tungstenite::Error {
    match error {
        httparse::Error::TooManyHeaders => tungstenite::Error::Capacity(CapacityError::TooManyHeaders),
        error => tungstenite::Error::Protocol(ProtocolError::HttparseError(error)),
    }
}

/// The first value of the header `name` (as `http`'s `HeaderMap::get` gives it).
fn header<'b>(headers: &[httparse::Header<'b>], name: &str) -> Option<&'b [u8]> {
    headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
}

/// The value as text if it is visible ASCII (`HeaderValue::to_str`).
fn header_text(value: &[u8]) -> Option<&str> {
    value.iter().all(|&b| b == b'\t' || (32..127).contains(&b)).then(|| std::str::from_utf8(value).ok()).flatten()
}

/// Reads a client's request from the bytes so far: `None` until the head is complete, then the
/// `Sec-WebSocket-Accept` value to answer with, or tungstenite's error for a request it refuses
/// (the same checks in the same order: the head, junk after it, then the upgrade's headers).
fn parse_request(bytes: &[u8]) -> Result<Option<String>, tungstenite::Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let size = match request.parse(bytes).map_err(httparse_error)? {
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(size) => size,
    };
    if request.method != Some("GET") {
        return Err(tungstenite::Error::Protocol(ProtocolError::WrongHttpMethod));
    }
    if request.version.unwrap_or(0) < 1 {
        return Err(tungstenite::Error::Protocol(ProtocolError::WrongHttpVersion));
    }
    // tungstenite parses the target as a URI; a plain one parses as it stands.
    let path = request.path.unwrap_or("/");
    if !plain_target("h", path) {
        path.parse::<http::Uri>()?;
    }
    if size != bytes.len() {
        return Err(tungstenite::Error::Protocol(ProtocolError::JunkAfterRequest));
    }
    let headers = request.headers;
    let has = |name: &str, test: &dyn Fn(&str) -> bool| header(headers, name).and_then(header_text).is_some_and(test);
    if !has("Connection", &|v| v.split([' ', ',']).any(|p| p.eq_ignore_ascii_case("Upgrade"))) {
        return Err(tungstenite::Error::Protocol(ProtocolError::MissingConnectionUpgradeHeader));
    }
    if !has("Upgrade", &|v| v.eq_ignore_ascii_case("websocket")) {
        return Err(tungstenite::Error::Protocol(ProtocolError::MissingUpgradeWebSocketHeader));
    }
    if header(headers, "Sec-WebSocket-Version") != Some(b"13") {
        return Err(tungstenite::Error::Protocol(ProtocolError::MissingSecWebSocketVersionHeader));
    }
    let key = header(headers, "Sec-WebSocket-Key")
        .ok_or(tungstenite::Error::Protocol(ProtocolError::MissingSecWebSocketKey))?;
    if key.len() != 24 || !matches!(data_encoding::BASE64.decode(key), Ok(k) if k.len() == 16) {
        return Err(tungstenite::Error::Protocol(ProtocolError::InvalidSecWebSocketKey));
    }
    Ok(Some(derive_accept_key(key)))
}

/// Reads a server's answer from the bytes so far: `None` until its head is complete, then the
/// head's length if it accepts the upgrade with `accept`, or tungstenite's error for an answer
/// its client refuses (a status other than `101` is an HTTP error carrying what followed).
fn parse_response(bytes: &[u8], accept: &str) -> Result<Option<usize>, tungstenite::Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let size = match response.parse(bytes).map_err(httparse_error)? {
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(size) => size,
    };
    if response.version.unwrap_or(0) < 1 {
        return Err(tungstenite::Error::Protocol(ProtocolError::WrongHttpVersion));
    }
    let headers = response.headers;
    let status = response.code.unwrap_or(0);
    if status != 101 {
        return Err(refused(status, headers, &bytes[size..]));
    }
    let is = |name: &str, test: &dyn Fn(&str) -> bool| header(headers, name).and_then(header_text).is_some_and(test);
    if !is("Upgrade", &|v| v.eq_ignore_ascii_case("websocket")) {
        return Err(tungstenite::Error::Protocol(ProtocolError::MissingUpgradeWebSocketHeader));
    }
    if !is("Connection", &|v| v.eq_ignore_ascii_case("Upgrade")) {
        return Err(tungstenite::Error::Protocol(ProtocolError::MissingConnectionUpgradeHeader));
    }
    if header(headers, "Sec-WebSocket-Accept") != Some(accept.as_bytes()) {
        return Err(tungstenite::Error::Protocol(ProtocolError::SecWebSocketAcceptKeyMismatch));
    }
    // The request offers no subprotocol, so an answer naming one is refused.
    if header(headers, "Sec-WebSocket-Protocol").is_some() {
        return Err(tungstenite::Error::Protocol(ProtocolError::SecWebSocketSubProtocolError(
            SubProtocolError::ServerSentSubProtocolNoneRequested,
        )));
    }
    Ok(Some(size))
}

/// tungstenite's error for an answer other than `101`: the response, what followed its head as
/// the body.
fn refused(status: u16, headers: &[httparse::Header<'_>], tail: &[u8]) -> tungstenite::Error {
    let mut response = http::Response::new(Some(tail.to_vec()));
    match http::StatusCode::from_u16(status) {
        Ok(status) => *response.status_mut() = status,
        Err(error) => return tungstenite::Error::HttpFormat(error.into()),
    }
    for h in headers {
        match (http::HeaderName::from_bytes(h.name.as_bytes()), http::HeaderValue::from_bytes(h.value)) {
            (Ok(name), Ok(value)) => {
                response.headers_mut().append(name, value);
            }
            (Err(error), _) => return error.into(),
            (_, Err(error)) => return error.into(),
        }
    }
    tungstenite::Error::Http(Box::new(response))
}

/// Buffers sized for the bus's small JSON frames: tungstenite's 128 KiB defaults cost more to
/// allocate than the frames do to send, in a world that opens a dozen connections per run. The
/// read buffer is small because tungstenite zeroes up to that much of it before every read, and a
/// connection is read once for every time its task is polled, most often to find nothing; a frame
/// larger than the buffer is read in several pieces within the same poll.
pub fn config() -> tungstenite::protocol::WebSocketConfig {
    tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(8 * 1024)
        .max_message_size(Some(FRAME_BYTES_MAX))
        .max_frame_size(Some(FRAME_BYTES_MAX))
}

/// The largest message (and frame) the bus takes: its frames are small JSON documents, and a
/// peer may make the engine hold this much of one.
pub const FRAME_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Closes a peer that broke the protocol: sends it `code` with `reason`, ends this side of the
/// stream, and reads (and discards) what the peer is still sending until it closes its side or
/// `grace` is over. Closing a TCP socket with unread bytes makes the kernel answer with a reset,
/// and the peer would lose the close frame.
pub async fn refuse<S>(mut socket: WebSocketStream<S>, code: CloseCode, reason: &str, grace: std::time::Duration)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // A close frame's reason is at most 123 bytes.
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let close = CloseFrame { code, reason: reason[..end].to_string().into() };
    let _ = tokio::time::timeout(grace, async {
        let _ = socket.close(Some(close)).await;
        let raw = socket.get_mut();
        let _ = raw.shutdown().await;
        // On the heap: an array here would make every future awaiting this one (the engine's
        // whole connection task) 16 KiB larger, copied on every spawn for a path rarely taken.
        let mut discarded = vec![0u8; 16 * 1024];
        while matches!(raw.read(&mut discarded).await, Ok(n) if n > 0) {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use rand::SeedableRng;
    use std::io::{Read, Write};

    use tokio_tungstenite::tungstenite::handshake::client::generate_request;
    use tokio_tungstenite::tungstenite::handshake::machine::TryParse;
    use tokio_tungstenite::tungstenite::handshake::server::{create_response, write_response, Request};
    use tokio_tungstenite::tungstenite::Message;

    fn on_a_local_runtime<T>(test: impl std::future::Future<Output = T>) -> T {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, test)
    }

    /// The request tungstenite writes for `ws://{host}{path}` with `key`.
    fn tungstenite_request(host: &str, path: &str, key: &str) -> Vec<u8> {
        let request = super::upgrade_request(host, path, key).unwrap();
        let (bytes, written_key) = generate_request(request).unwrap();
        assert_eq!(written_key, key);
        bytes
    }

    /// The `101` tungstenite's server writes for `request`.
    fn tungstenite_response(request: &[u8]) -> Vec<u8> {
        let (_, request) = Request::try_parse(request).unwrap().unwrap();
        let mut out = Vec::new();
        write_response(&mut out, &create_response(&request).unwrap()).unwrap();
        out
    }

    const PATH_CHARS: &str = "-._~!$&'()*+,;=:@/?%";

    /// Both sides' bytes are tungstenite's, for many seeded keys and every character a plain
    /// host or path may have.
    #[test]
    fn the_handshakes_are_tungstenites_bytes() {
        let mut targets: Vec<(String, String)> =
            ["engine", "proxy", "harness", "svc-a_1", "127.0.0.1:49152", "engine:9000"]
                .iter()
                .flat_map(|host| {
                    ["/", "/harness", "/replacement?run=3&x=%20"].map(|path| (host.to_string(), path.to_string()))
                })
                .collect();
        targets.extend(PATH_CHARS.chars().map(|c| ("engine".to_string(), format!("/a{c}b"))));
        for (host, path) in &targets {
            assert!(plain_target(host, path), "{host}{path}");
        }
        for seed in 0..200u64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let key = data_encoding::BASE64.encode(&handshake_key(&mut rng));
            let (host, path) = &targets[seed as usize % targets.len()];
            let request = client_request(host, path, &key);
            assert_eq!(
                String::from_utf8_lossy(&request),
                String::from_utf8_lossy(&tungstenite_request(host, path, &key))
            );
            let accept = parse_request(&request).unwrap().expect("a whole head");
            assert_eq!(
                String::from_utf8_lossy(&server_response(&accept)),
                String::from_utf8_lossy(&tungstenite_response(&request))
            );
            let answer = server_response(&accept);
            assert_eq!(parse_response(&answer, &derive_accept_key(key.as_bytes())).unwrap(), Some(answer.len()));
        }
    }

    #[test]
    fn a_target_that_is_not_plain_goes_through_tungstenite() {
        for (host, path) in
            [("engine", ""), ("engine", "/a b"), ("engine", "/a#b"), ("[::1]:80", "/"), ("", "/"), ("u@h", "/")]
        {
            assert!(!plain_target(host, path), "{host:?} {path:?}");
        }
        // And it still connects, with tungstenite's own client.
        on_a_local_runtime(async {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let served = tokio::task::spawn_local(async move { accept(server).await.map(|_| ()) });
            connect(client, "[::1]:80", "/x", [3; 16]).await.expect("connects");
            served.await.unwrap().expect("accepted");
        });
    }

    /// Hand-written against tungstenite's machines, both ways, and frames pass after it.
    #[test]
    fn each_side_speaks_with_tungstenites_other_side() {
        on_a_local_runtime(async {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let served = tokio::task::spawn_local(async move {
                let mut socket = tokio_tungstenite::accept_async(server).await.expect("tungstenite accepts");
                let message = socket.next().await.unwrap().unwrap();
                socket.send(message).await.unwrap();
            });
            let mut socket = connect(client, "engine", "/", [9; 16]).await.expect("connects");
            socket.send(Message::text("ping")).await.unwrap();
            assert_eq!(socket.next().await.unwrap().unwrap(), Message::text("ping"));
            served.await.unwrap();

            let (client, server) = tokio::io::duplex(64 * 1024);
            let served = tokio::task::spawn_local(async move {
                let mut socket = accept(server).await.expect("accepts");
                let message = socket.next().await.unwrap().unwrap();
                socket.send(message).await.unwrap();
            });
            let (mut socket, _) =
                tokio_tungstenite::client_async("ws://engine/", client).await.expect("tungstenite connects");
            socket.send(Message::text("pong")).await.unwrap();
            assert_eq!(socket.next().await.unwrap().unwrap(), Message::text("pong"));
            served.await.unwrap();
        });
    }

    /// A blocking stream that reads `input` (then the end) and keeps what is written.
    struct Canned {
        input: std::io::Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Canned {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            std::io::Read::read(&mut self.input, buf)
        }
    }

    impl Write for Canned {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            std::io::Write::write(&mut self.output, buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the hand-written side makes of `input` (sent, then the end of the stream): its error,
    /// or `ok`, and what it wrote.
    fn ours(input: &[u8], client: bool) -> (String, Vec<u8>) {
        on_a_local_runtime(async {
            let (mut near, far) = tokio::io::duplex(256 * 1024);
            near.write_all(input).await.unwrap();
            near.shutdown().await.unwrap();
            let result = if client {
                connect(far, "engine", "/", [5; 16]).await.map(|_| ())
            } else {
                accept(far).await.map(|_| ())
            };
            let mut written = Vec::new();
            near.read_to_end(&mut written).await.unwrap();
            (result.map_or_else(|e| e.to_string(), |()| "ok".to_string()), written)
        })
    }

    /// What tungstenite's machine makes of the same.
    fn theirs(input: &[u8], client: bool) -> (String, Vec<u8>) {
        let stream = Canned { input: std::io::Cursor::new(input.to_vec()), output: Vec::new() };
        let (result, output) = if client {
            let request = http::Request::builder()
                .uri("ws://engine/")
                .header("Host", "engine")
                .header("Connection", "Upgrade")
                .header("Upgrade", "websocket")
                .header("Sec-WebSocket-Version", "13")
                .header("Sec-WebSocket-Key", data_encoding::BASE64.encode(&[5; 16]))
                .body(())
                .unwrap();
            match tungstenite::client::client(request, stream) {
                Ok((socket, _)) => ("ok".to_string(), socket.get_ref().output.clone()),
                Err(tungstenite::HandshakeError::Failure(e)) => (e.to_string(), Vec::new()),
                Err(tungstenite::HandshakeError::Interrupted(_)) => unreachable!("a blocking stream"),
            }
        } else {
            match tungstenite::accept(stream) {
                Ok(socket) => ("ok".to_string(), socket.get_ref().output.clone()),
                Err(tungstenite::HandshakeError::Failure(e)) => (e.to_string(), Vec::new()),
                Err(tungstenite::HandshakeError::Interrupted(_)) => unreachable!("a blocking stream"),
            }
        };
        (result, output)
    }

    /// A malformed request is refused with tungstenite's error, and nothing is answered.
    #[test]
    fn a_malformed_request_is_refused_as_tungstenite_refuses_it() {
        let good = client_request("engine", "/", &data_encoding::BASE64.encode(&[1; 16]));
        let good = String::from_utf8(good).unwrap();
        let mut cases: Vec<Vec<u8>> = vec![
            good.clone().into_bytes(),
            good.replacen("GET", "POST", 1).into_bytes(),
            good.replacen("HTTP/1.1", "HTTP/1.0", 1).into_bytes(),
            good.replacen("Connection: Upgrade", "Connection: keep-alive", 1).into_bytes(),
            good.replacen("Connection: Upgrade", "Connection: keep-alive, upgrade", 1).into_bytes(),
            good.replacen("Upgrade: websocket", "Upgrade: h2c", 1).into_bytes(),
            good.replacen("Version: 13", "Version: 8", 1).into_bytes(),
            good.replacen("Sec-WebSocket-Key", "Sec-WebSocket-Kei", 1).into_bytes(),
            good.replacen("AQEBAQEBAQEBAQEBAQEBAQ==", "AQEBAQEBAQEBAQEBAQEBAQ", 1).into_bytes(),
            good.replacen("AQEBAQEBAQEBAQEBAQEBAQ==", "AQEBAQEBAQEBAQEBAQEB!Q==", 1).into_bytes(),
            good.replacen("GET / ", "GET /a{b ", 1).into_bytes(),
            format!("{good}junk").into_bytes(),
            good.as_bytes()[..good.len() - 2].to_vec(),
            b"\x16\x03\x01 not http at all\r\n\r\n".to_vec(),
            Vec::new(),
        ];
        cases.push(format!("GET / HTTP/1.1\r\n{}\r\n", "X-A: b\r\n".repeat(130)).into_bytes());
        cases.push(vec![b'a'; 70_000]);
        for input in &cases {
            let (ours, theirs) = (ours(input, false), theirs(input, false));
            assert_eq!(ours.0, theirs.0, "{}", String::from_utf8_lossy(input));
            assert_eq!(String::from_utf8_lossy(&ours.1), String::from_utf8_lossy(&theirs.1));
        }
    }

    /// A server's answer is taken or refused as tungstenite's client takes or refuses it.
    #[test]
    fn an_answer_is_checked_as_tungstenite_checks_it() {
        let accept = derive_accept_key(data_encoding::BASE64.encode(&[5; 16]).as_bytes());
        let good = String::from_utf8(server_response(&accept)).unwrap();
        let cases: Vec<Vec<u8>> = vec![
            good.clone().into_bytes(),
            format!("{good}\u{81}\u{0}").into_bytes(),
            good.replacen("101 Switching Protocols", "404 Not Found", 1).into_bytes(),
            good.replacen("101 Switching Protocols", "099 Odd", 1).into_bytes(),
            good.replacen("HTTP/1.1", "HTTP/1.0", 1).into_bytes(),
            good.replacen("upgrade: websocket", "upgrade: h2c", 1).into_bytes(),
            good.replacen("connection: Upgrade", "connection: keep-alive, Upgrade", 1).into_bytes(),
            good.replacen(&accept, "AAAAAAAAAAAAAAAAAAAAAAAAAAA=", 1).into_bytes(),
            good.replacen("\r\n\r\n", "\r\nSec-WebSocket-Protocol: chat\r\n\r\n", 1).into_bytes(),
            good.as_bytes()[..good.len() - 2].to_vec(),
            b"garbage\r\n\r\n".to_vec(),
        ];
        let request = client_request("engine", "/", &data_encoding::BASE64.encode(&[5; 16]));
        for input in &cases {
            let (ours, theirs) = (ours(input, true), theirs(input, true));
            assert_eq!(ours.0, theirs.0, "{}", String::from_utf8_lossy(input));
            // The request goes out whatever the answer (tungstenite's error keeps no stream).
            assert_eq!(String::from_utf8_lossy(&ours.1), String::from_utf8_lossy(&request));
            if theirs.0 == "ok" {
                assert_eq!(ours.1, theirs.1);
            }
        }
    }
}

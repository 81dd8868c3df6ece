//! WebSocket connection set-up with a seeded handshake key, the bus's frame limit, and closing
//! a peer that broke it.
//!
//! tungstenite draws the Sec-WebSocket-Key from OS randomness unless the request already
//! carries all five handshake headers, so the client request is built in full here.

use rand::RngCore;
use rand_chacha::ChaCha8Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame};
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
    stream: S,
    host: &str,
    path: &str,
    key: [u8; 16],
) -> Result<WebSocketStream<S>, tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let request = http::Request::builder()
        .method("GET")
        .uri(format!("ws://{host}{path}"))
        .header("Host", host)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", data_encoding::BASE64.encode(&key))
        .body(())
        .map_err(tungstenite::Error::HttpFormat)?;
    let (socket, _response) = tokio_tungstenite::client_async_with_config(request, stream, Some(config())).await?;
    Ok(socket)
}

/// Accepts a server-side WebSocket on an established stream.
pub async fn accept<S>(stream: S) -> Result<WebSocketStream<S>, tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio_tungstenite::accept_async_with_config(stream, Some(config())).await
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

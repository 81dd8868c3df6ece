//! WebSocket connection set-up with a seeded handshake key.
//!
//! tungstenite draws the Sec-WebSocket-Key from OS randomness unless the request already
//! carries all five handshake headers, so the client request is built in full here.

use rand::RngCore;
use rand_chacha::ChaCha8Rng;
use tokio::io::{AsyncRead, AsyncWrite};
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
    tungstenite::protocol::WebSocketConfig::default().read_buffer_size(1024).write_buffer_size(8 * 1024)
}

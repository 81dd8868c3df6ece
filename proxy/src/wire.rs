//! The socket under each WebSocket of a relay: a read buffer that exists only while it holds
//! bytes, and a witness of the close frames the peer really sent.
//!
//! Why a buffer: tungstenite reads at most its `read_buffer_size` per call, and that buffer is
//! allocated when the WebSocket is made. The proxy keeps tungstenite's small, so an idle
//! connection holds little, and reads the socket here in large chunks (on the stack), keeping
//! on the heap only what tungstenite has not taken yet.
//!
//! Why a witness: tungstenite replaces a close frame whose code may not be sent (RFC 6455
//! section 7.4) with `1002 "Protocol violation"` before the relay sees it. To log what
//! arrived, the witness follows the frame headers in the bytes read (a few bytes per frame;
//! payloads are skipped, not read) and keeps the payload of the last close frame.

use std::cell::RefCell;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How much one read of the socket takes at most (on the stack, not kept).
const READ_CHUNK: usize = 64 * 1024;
/// A close frame's payload is at most 125 bytes.
const MAX_CLOSE_PAYLOAD: usize = 125;

/// A socket as a relay reads it: see the module documentation.
pub struct Wire<S> {
    inner: S,
    /// Bytes read from the socket that the reader has not taken yet; empty (and unallocated)
    /// between bursts.
    pending: Vec<u8>,
    taken: usize,
    witness: CloseWitness,
}

impl<S> Wire<S> {
    /// Wraps a socket; `already_read` are bytes read past the opening handshake, served first.
    pub fn new(inner: S, already_read: Vec<u8>) -> Self {
        let witness = CloseWitness::default();
        witness.observe(&already_read);
        Wire { inner, pending: already_read, taken: 0, witness }
    }

    /// The witness of this socket's close frames, shared with whoever holds it.
    pub fn witness(&self) -> CloseWitness {
        self.witness.clone()
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Wire<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.taken < this.pending.len() {
            let n = buf.remaining().min(this.pending.len() - this.taken);
            buf.put_slice(&this.pending[this.taken..this.taken + n]);
            this.taken += n;
            if this.taken == this.pending.len() {
                // Drained: give the memory back, so an idle connection holds none.
                this.pending = Vec::new();
                this.taken = 0;
            }
            return Poll::Ready(Ok(()));
        }
        let mut chunk = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
        let mut read = ReadBuf::uninit(&mut chunk);
        match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) => {
                let filled = read.filled();
                this.witness.observe(filled);
                let n = buf.remaining().min(filled.len());
                buf.put_slice(&filled[..n]);
                if n < filled.len() {
                    this.pending = filled[n..].to_vec();
                    this.taken = 0;
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Wire<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The payload of the last close frame a peer sent, as it was on the wire.
#[derive(Clone, Default)]
pub struct CloseWitness(Rc<RefCell<FrameFollower>>);

impl CloseWitness {
    fn observe(&self, bytes: &[u8]) {
        self.0.borrow_mut().observe(bytes);
    }

    /// The code of the last close frame read (`None` for one without a code), and its reason.
    pub fn last_close(&self) -> Option<(Option<u16>, String)> {
        let follower = self.0.borrow();
        let payload = follower.last_close.as_ref()?;
        match payload.as_slice() {
            [] => Some((None, String::new())),
            [high, low, reason @ ..] => {
                Some((Some(u16::from_be_bytes([*high, *low])), String::from_utf8_lossy(reason).into_owned()))
            }
            [_] => Some((None, String::new())),
        }
    }
}

/// Follows frame boundaries through the bytes read: headers are parsed, payloads skipped,
/// except a close frame's, which is kept (unmasked).
#[derive(Default)]
struct FrameFollower {
    header: [u8; 14],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    remaining: u64,
    opcode: u8,
    mask: Option<[u8; 4]>,
    close_payload: Vec<u8>,
    last_close: Option<Vec<u8>>,
}

impl FrameFollower {
    fn observe(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let take = (self.remaining.min(bytes.len() as u64)) as usize;
                if self.opcode == 0x8 {
                    for &byte in &bytes[..take] {
                        let index = self.close_payload.len();
                        if index < MAX_CLOSE_PAYLOAD {
                            let mask = self.mask.map_or(0, |m| m[index % 4]);
                            self.close_payload.push(byte ^ mask);
                        }
                    }
                }
                self.remaining -= take as u64;
                bytes = &bytes[take..];
                if self.remaining == 0 {
                    self.frame_done();
                }
                continue;
            }
            self.header[self.header_len] = bytes[0];
            self.header_len += 1;
            bytes = &bytes[1..];
            if self.header_len >= 2 && self.header_len == self.header_needed() {
                self.start_payload();
            }
        }
    }

    fn header_needed(&self) -> usize {
        let extended = match self.header[1] & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        2 + extended + if self.header[1] & 0x80 != 0 { 4 } else { 0 }
    }

    fn start_payload(&mut self) {
        let header = &self.header[..self.header_len];
        let (length, rest) = match header[1] & 0x7f {
            126 => (u64::from(u16::from_be_bytes([header[2], header[3]])), &header[4..]),
            127 => (u64::from_be_bytes(header[2..10].try_into().unwrap_or([0; 8])), &header[10..]),
            short => (u64::from(short), &header[2..]),
        };
        self.opcode = header[0] & 0x0f;
        self.mask = (header[1] & 0x80 != 0).then(|| [rest[0], rest[1], rest[2], rest[3]]);
        self.remaining = length;
        self.header_len = 0;
        self.close_payload.clear();
        if length == 0 {
            self.frame_done();
        }
    }

    fn frame_done(&mut self) {
        if self.opcode == 0x8 {
            self.last_close = Some(std::mem::take(&mut self.close_payload));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![0x80 | opcode];
        let mask_bit = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(mask_bit | n as u8),
            n if n < 65536 => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if let Some(mask) = mask {
            out.extend_from_slice(&mask);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        } else {
            out.extend_from_slice(payload);
        }
        out
    }

    #[test]
    fn finds_the_close_frame_behind_frames_of_every_length_byte_by_byte_or_at_once() {
        let mut wire = Vec::new();
        wire.extend(frame(0x1, b"hello", Some([1, 2, 3, 4])));
        wire.extend(frame(0x2, &vec![7; 300], Some([5, 6, 7, 8])));
        wire.extend(frame(0x2, &vec![9; 70_000], None));
        wire.extend(frame(0x9, b"", None));
        let mut close = 999u16.to_be_bytes().to_vec();
        close.extend_from_slice(b"bad");
        wire.extend(frame(0x8, &close, Some([9, 8, 7, 6])));
        let at_once = CloseWitness::default();
        at_once.observe(&wire);
        assert_eq!(at_once.last_close(), Some((Some(999), "bad".to_string())));
        let byte_by_byte = CloseWitness::default();
        for byte in &wire {
            byte_by_byte.observe(std::slice::from_ref(byte));
        }
        assert_eq!(byte_by_byte.last_close(), Some((Some(999), "bad".to_string())));
        let empty = CloseWitness::default();
        empty.observe(&frame(0x8, b"", None));
        assert_eq!(empty.last_close(), Some((None, String::new())));
    }
}

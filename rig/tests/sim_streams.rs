//! The vendored simulator's stream delivery, through turmoil's own API: the channel that hands a
//! stream's segments to its reader is the rig's (rig/vendor/turmoil/src/net/tcp/segments.rs), and
//! the vendored crate builds without its unit tests. Every run of the rig leans on it; these hold
//! the parts a run only shows indirectly: order past the queue's first room, the wake of a reader
//! that waits, the end of a stream, and a write refused once the reader is gone.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turmoil::net::{TcpListener, TcpStream};

const PORT: u16 = 7000;

fn sim() -> turmoil::Sim<'static> {
    turmoil::Builder::new()
        .rng_seed(7)
        .simulation_duration(Duration::from_secs(10))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(3))
        .build()
}

/// Many more segments than the queue first has room for (16) wait for a reader that comes late,
/// and arrive whole and in the order written, however the latencies drawn reorder them on the wire.
#[test]
fn segments_arrive_whole_and_in_order_past_the_queues_first_room() {
    const WRITES: u32 = 200;
    let mut sim = sim();
    sim.host("server", || async {
        let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
        let (mut stream, _) = listener.accept().await?;
        for index in 0..WRITES {
            // One write, one segment.
            stream.write_all(&index.to_be_bytes()).await?;
        }
        stream.flush().await?;
        // Held open until the client has read, so the end of the stream is not what it sees.
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(())
    });
    sim.client("client", async {
        let mut stream = TcpStream::connect(("server", PORT)).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut bytes = vec![0u8; 4 * WRITES as usize];
        stream.read_exact(&mut bytes).await?;
        let read: Vec<u32> =
            bytes.chunks_exact(4).map(|chunk| u32::from_be_bytes(chunk.try_into().expect("four bytes"))).collect();
        assert_eq!(read, (0..WRITES).collect::<Vec<_>>());
        Ok(())
    });
    sim.run().expect("the client reads every segment in order");
}

/// A reader already waiting when a segment arrives is woken by it: were the wake lost, the
/// client would wait out the simulation and `run` would fail.
#[test]
fn a_waiting_reader_is_woken_by_the_segment_that_arrives() {
    let mut sim = sim();
    sim.host("server", || async {
        let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
        let (mut stream, _) = listener.accept().await?;
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        stream.write_all(b"late").await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(())
    });
    sim.client("client", async {
        let mut stream = TcpStream::connect(("server", PORT)).await?;
        let started = tokio::time::Instant::now();
        let mut bytes = [0u8; 4];
        stream.read_exact(&mut bytes).await?;
        assert_eq!(&bytes, b"late");
        let waited = started.elapsed();
        // Written a second after the accept, delivered within the latency bounds and a tick or two.
        assert!(
            waited >= Duration::from_millis(990) && waited < Duration::from_millis(1_020),
            "woken after {waited:?}"
        );
        Ok(())
    });
    sim.run().expect("the waiting reader is woken");
}

/// The writer's end of the stream reaches a reader that waits for more, after the data, as the
/// end of the stream (a read of nothing), not an error and not a wait forever.
#[test]
fn the_writers_close_ends_the_stream_after_its_data() {
    let mut sim = sim();
    sim.host("server", || async {
        let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
        let (mut stream, _) = listener.accept().await?;
        stream.write_all(b"abc").await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        stream.write_all(b"def").await?;
        drop(stream);
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(())
    });
    sim.client("client", async {
        let mut stream = TcpStream::connect(("server", PORT)).await?;
        let mut everything = Vec::new();
        stream.read_to_end(&mut everything).await?;
        assert_eq!(everything, b"abcdef");
        Ok(())
    });
    sim.run().expect("the client reads to the end of the stream");
}

/// Once the reading half is dropped, what arrives for it is refused and the peer's writes fail,
/// rather than filling a queue nobody reads.
#[test]
fn writes_to_a_stream_whose_reader_is_gone_fail() {
    let mut sim = sim();
    sim.host("server", || async {
        let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
        let (mut stream, _) = listener.accept().await?;
        // The client drops its reading half at once; give that a moment, then write until refused.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..50 {
            if stream.write_all(b"anyone?").await.is_err() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("50 writes to a stream whose reader is gone all succeeded");
    });
    sim.client("client", async {
        let stream = TcpStream::connect(("server", PORT)).await?;
        let (read, write) = stream.into_split();
        drop(read);
        // The writing half stays, so the socket lives on with no reader.
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(write);
        Ok(())
    });
    sim.run().expect("the server's writes are refused");
}

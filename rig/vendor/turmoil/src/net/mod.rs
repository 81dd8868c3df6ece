//! This module contains the simulated TCP/UDP networking types.
//!
//! They mirror [tokio::net](https://docs.rs/tokio/latest/tokio/net/) to provide
//! a high fidelity implementation.

use std::net::SocketAddr;
use std::{io, iter};

use crate::world::World;
use crate::ToSocketAddrs;

pub mod tcp;
pub use tcp::{listener::TcpListener, stream::TcpStream};

pub(crate) mod udp;
pub use udp::UdpSocket;

/// Performs a DNS resolution.
///
/// Must be called from within a turmoil simulation context.
pub async fn lookup_host<T>(host: T) -> io::Result<impl Iterator<Item = SocketAddr>>
where
    T: ToSocketAddrs,
{
    let addr = World::current(|world| host.to_socket_addr(&world.dns))?;
    Ok(iter::once(addr))
}

#[derive(Debug, Copy, Clone, Eq, PartialEq)]
pub(crate) struct SocketPair {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
}

/// Rig patch: an IPv4 socket address is hashed as one word (its address and
/// port), where the derived hash wrote the enum's discriminant, the address
/// and the port apart: a host's stream sockets are looked up by their pair on
/// every segment sent and received. Equal pairs hash equal as before; the
/// maps keyed by pairs keep their order of insertion whatever the hash.
impl std::hash::Hash for SocketPair {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        for addr in [self.local, self.remote] {
            match addr {
                SocketAddr::V4(v4) => state.write_u64(u64::from(v4.ip().to_bits()) << 16 | u64::from(v4.port())),
                SocketAddr::V6(v6) => {
                    state.write_u128(v6.ip().to_bits());
                    state.write_u16(v6.port());
                }
            }
        }
    }
}

impl SocketPair {
    pub(crate) fn new(local: SocketAddr, remote: SocketAddr) -> SocketPair {
        assert_ne!(local, remote);
        SocketPair { local, remote }
    }
}

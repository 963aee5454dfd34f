//! One DNS exchange with the configured resolver: a UDP datagram, and the same query over TCP
//! when the answer came truncated (RFC 7766). Bounded by the source's timeout.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::wire::{self, Response};

/// Why a lookup gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// No response within the timeout.
    #[error("no answer from {server} within {timeout:?}")]
    Timeout {
        /// The resolver.
        server: SocketAddr,
        /// The timeout.
        timeout: Duration,
    },
    /// The socket's error.
    #[error("{server}: {error}")]
    Io {
        /// The resolver.
        server: SocketAddr,
        /// The error.
        error: std::io::Error,
    },
    /// A response that could not be read.
    #[error("{server}: {error}")]
    Wire {
        /// The resolver.
        server: SocketAddr,
        /// What was wrong.
        error: wire::WireError,
    },
}

/// Asks `server` for `name`'s records of `qtype`.
///
/// # Errors
///
/// No answer in time, a socket error, or an unreadable response.
pub async fn lookup(server: SocketAddr, name: &str, qtype: u16, timeout: Duration) -> Result<Response, LookupError> {
    match tokio::time::timeout(timeout, exchange(server, name, qtype)).await {
        Ok(r) => r,
        Err(_) => Err(LookupError::Timeout { server, timeout }),
    }
}

async fn exchange(server: SocketAddr, name: &str, qtype: u16) -> Result<Response, LookupError> {
    let io = |error| LookupError::Io { server, error };
    let bad = |error| LookupError::Wire { server, error };
    let mut id = [0u8; 2];
    // An unpredictable id: a forged answer must guess it (and the port).
    let _ = getrandom::fill(&mut id);
    let q = wire::query(u16::from_be_bytes(id), name, qtype).map_err(bad)?;
    let bind: SocketAddr = if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let sock = tokio::net::UdpSocket::bind(bind).await.map_err(io)?;
    sock.connect(server).await.map_err(io)?;
    sock.send(&q).await.map_err(io)?;
    let mut buf = vec![0u8; 4096];
    let response = loop {
        let n = sock.recv(&mut buf).await.map_err(io)?;
        let msg = &buf[..n];
        // Truncated (TC), with this query's id, from a response: over TCP, whatever the rest of
        // the datagram holds (a cut message may not parse).
        if n >= 4 && msg[..2] == q[..2] && msg[2] & 0x80 != 0 && msg[2] & 0x02 != 0 {
            break None;
        }
        // A datagram that answers something else (a late answer to an earlier query) is not
        // this one's: wait for the next.
        match wire::parse(msg, &q) {
            Err(wire::WireError::Mismatch) => continue,
            r => break Some(r.map_err(bad)?),
        }
    };
    if let Some(response) = response {
        return Ok(response);
    }
    let mut tcp = tokio::net::TcpStream::connect(server).await.map_err(io)?;
    let mut framed = Vec::with_capacity(q.len() + 2);
    framed.extend_from_slice(&(q.len() as u16).to_be_bytes());
    framed.extend_from_slice(&q);
    tcp.write_all(&framed).await.map_err(io)?;
    let mut len = [0u8; 2];
    tcp.read_exact(&mut len).await.map_err(io)?;
    let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
    tcp.read_exact(&mut msg).await.map_err(io)?;
    wire::parse(&msg, &q).map_err(bad)
}

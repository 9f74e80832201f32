//! A slow link between regions on one machine: a TCP proxy on loopback that
//! holds every chunk of bytes for a delay plus a random jitter, in each
//! direction, never releasing a chunk before the one read ahead of it (so
//! bytes keep their order). The kernel's netem would do this, where there is
//! one; this runs anywhere. A link can be cut (its connections dropped, new
//! ones refused, as a region that drops off the network) and healed.
//!
//! Used by `drover bench --workload regions` and the region tests: nodes in
//! one region dial nodes in the other through these.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// One direction-pair of a slow link, listening on a loopback port.
pub struct DelayLink {
    port: u16,
    cut: Arc<watch::Sender<bool>>,
}

impl DelayLink {
    /// Forwards connections on a new loopback port to `target`, `delay` plus
    /// up to `jitter` more each way. Call it within a Tokio runtime; the link
    /// lives as long as that runtime.
    pub fn start(target: SocketAddr, delay: Duration, jitter: Duration) -> std::io::Result<DelayLink> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let mut listener = Some(TcpListener::from_std(listener)?);
        let (cut, mut cut_rx) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Some(open) = listener.as_ref() else {
                    // Cut off: nothing listens, so connections are refused,
                    // until the link heals and the port is bound again.
                    if cut_rx.wait_for(|cut| !*cut).await.is_err() {
                        return;
                    }
                    match TcpListener::bind(("127.0.0.1", port)).await {
                        Ok(bound) => listener = Some(bound),
                        Err(e) => {
                            // Another process took the port meanwhile: the link
                            // stays cut, and says why.
                            tracing::warn!(port, "a healed delay link could not listen again: {e}");
                            return;
                        }
                    }
                    continue;
                };
                let inbound = tokio::select! {
                    accepted = open.accept() => match accepted {
                        Ok((inbound, _)) => inbound,
                        Err(_) => return,
                    },
                    changed = cut_rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if *cut_rx.borrow() {
                            listener = None;
                        }
                        continue;
                    }
                };
                let mut conn_cut = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else { return };
                    let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
                    let (from_client, to_client) = inbound.into_split();
                    let (from_server, to_server) = outbound.into_split();
                    let mut there = tokio::spawn(delayed_copy(from_client, to_server, delay, jitter));
                    let mut back = tokio::spawn(delayed_copy(from_server, to_client, delay, jitter));
                    tokio::select! {
                        _ = conn_cut.wait_for(|cut| *cut) => {}
                        _ = async { let _ = (&mut there).await; let _ = (&mut back).await; } => {}
                    }
                    // Dropping the halves closes both connections.
                    there.abort();
                    back.abort();
                });
            }
        });
        Ok(DelayLink { port, cut: Arc::new(cut) })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every connection through the link and refuses new ones.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

/// A task that stops when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Copies `from` to `to`, each chunk held back as the link says. Aborted (a
/// cut), it stops its writer too, so nothing queued is delivered after.
async fn delayed_copy(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration, jitter: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut writer = AbortOnDrop(tokio::spawn(async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
    }));
    let mut buffer = vec![0u8; 64 * 1024];
    let mut last = Instant::now();
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let extra = if jitter.is_zero() { Duration::ZERO } else { rand::rng().random_range(Duration::ZERO..jitter) };
        // Never before the chunk ahead of it.
        let at = (Instant::now() + delay + extra).max(last);
        last = at;
        if tx.send((at, buffer[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = (&mut writer.0).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_arrive_late_in_order_and_not_at_all_once_cut() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = server.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = server.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let link = DelayLink::start(target, Duration::from_millis(40), Duration::from_millis(5)).unwrap();
        let mut client = TcpStream::connect(("127.0.0.1", link.port())).await.unwrap();
        let started = std::time::Instant::now();
        for chunk in [b"one ".as_slice(), b"two ".as_slice(), b"three".as_slice()] {
            client.write_all(chunk).await.unwrap();
        }
        let mut echoed = vec![0u8; 13];
        client.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"one two three");
        assert!(started.elapsed() >= Duration::from_millis(80), "a round trip takes the delay both ways");
        link.cut();
        let mut rest = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut rest)).await.expect("closed in time");
        assert!(matches!(read, Ok(0) | Err(_)), "the cut closes the connection");
        let refused = TcpStream::connect(("127.0.0.1", link.port())).await;
        assert!(refused.is_err(), "a cut link refuses connections");
        link.heal();
        let mut again = None;
        // Bounded: the port is bound again within two seconds.
        for _ in 0..200 {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", link.port())).await {
                again = Some(stream);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut again = again.expect("a healed link takes connections again");
        again.write_all(b"back").await.unwrap();
        let mut echoed = [0u8; 4];
        again.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"back");
    }
}

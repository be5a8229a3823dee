//! A store with real latency on loopback: [`DelayProxy`] sits between joader and `s3s-fs`
//! and delays every byte a client sends by a fixed time before forwarding it, the way a
//! network link of that one-way latency would (a delay line, as `netem` does). So each
//! request reaches the store that long after joader sent it, whatever its size and however
//! many requests share a keep-alive connection or are in flight at once; the answers come
//! back at once (acknowledged at once: see `forward`). It understands nothing of HTTP: one
//! upstream connection per client connection, bytes forwarded in order, either side's close
//! passed on.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A delaying TCP proxy on a free loopback port, on a runtime of its own.
pub struct DelayProxy {
    addr: SocketAddr,
    delay: Duration,
    runtime: Option<Runtime>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`, each
    /// byte sent to it `delay` late.
    pub fn start(upstream: SocketAddr, delay: Duration) -> io::Result<Self> {
        Self::start_pinned(upstream, delay, None)
    }

    /// [`DelayProxy::start`], its threads on the store's CPUs of `split` when given.
    pub(crate) fn start_pinned(
        upstream: SocketAddr,
        delay: Duration,
        split: Option<super::pin::Split>,
    ) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-delay-proxy")
            .on_thread_start(move || {
                if let Some(split) = &split {
                    split.pin_store_thread();
                }
            })
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind(("127.0.0.1", 0)))?;
        let addr = listener.local_addr()?;
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    if let Err(e) = forward(client, upstream, delay).await {
                        tracing::debug!(error = %e, "delay proxy: a connection ended with an error");
                    }
                });
            }
        });
        Ok(Self {
            addr,
            delay,
            runtime: Some(runtime),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy as an HTTP endpoint (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The delay each request gets.
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One client connection: its bytes to `upstream` through a delay line, the answers back as
/// they come.
async fn forward(client: TcpStream, upstream: SocketAddr, delay: Duration) -> io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    // Nothing of the proxy's own may hold a small write back (the delay is the only one).
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let (line, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = from_client.read(&mut buf).await?;
            if n == 0
                || line
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                return io::Result::Ok(());
            }
        }
    };
    let delayed = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            to_server.write_all(&bytes).await?;
        }
        to_server.shutdown().await
    };
    let back = async move {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // `s3s-fs` does not set TCP_NODELAY: a small write after a large one waits for our
            // ACK, which Linux delays up to 40 ms. Acknowledging at once (quick ACK mode, which
            // the kernel leaves after a while, hence before every read) makes the proxy's
            // delay the only one, as with a store that sets TCP_NODELAY (S3 does).
            #[cfg(target_os = "linux")]
            let _ = rustix::net::sockopt::set_tcp_quickack(from_server.as_ref(), true);
            let n = from_server.read(&mut buf).await?;
            if n == 0 {
                return to_client.shutdown().await;
            }
            to_client.write_all(&buf[..n]).await?;
        }
    };
    let (a, b, c) = tokio::join!(read, delayed, back);
    a.and(b).and(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// An echo server: whatever a connection sends comes back.
    fn echo() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let mut conn = conn.unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = conn.read(&mut buf) {
                        if n == 0 || conn.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn bytes_arrive_in_order_and_no_earlier_than_the_delay() {
        let delay = Duration::from_millis(30);
        let proxy = DelayProxy::start(echo(), delay).unwrap();
        // Two connections at once, several exchanges each (a keep-alive connection).
        let clients: Vec<_> = (0..2u8)
            .map(|c| {
                let addr = proxy.addr();
                std::thread::spawn(move || {
                    let mut s = std::net::TcpStream::connect(addr).unwrap();
                    for i in 0..3u8 {
                        let msg: Vec<u8> = (0..1000u32).map(|b| (b as u8) ^ i ^ c).collect();
                        let sent = std::time::Instant::now();
                        s.write_all(&msg).unwrap();
                        let mut got = vec![0u8; msg.len()];
                        s.read_exact(&mut got).unwrap();
                        // A lower bound the monotonic clock makes exact.
                        assert!(sent.elapsed() >= delay);
                        assert_eq!(got, msg);
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
    }
}

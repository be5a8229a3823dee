//! An in-process server on its own thread, for `joader demo` and the benchmarks: started on a
//! free port, answered on `/healthz` before `spawn` returns, stopped (its shared memory
//! removed) on `stop` or drop.

use std::time::{Duration, Instant};

use std::net::TcpListener;

use anyhow::{Context, Result};
use server::Config;

use crate::client;

/// A server running on its own thread (for `joader demo`, the benchmarks and tests).
pub struct ServerHandle {
    pub url: String,
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl ServerHandle {
    /// Binds `config.bind` (port 0 picks a free port) and serves on a new thread.
    pub fn spawn(config: Config) -> Result<Self> {
        let listener = TcpListener::bind(config.bind)
            .with_context(|| format!("cannot bind {}", config.bind))?;
        let addr = listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name("joader-server".into())
            .spawn(move || {
                actix_web::rt::System::new().block_on(async move {
                    let shutdown = async move {
                        let _ = rx.await;
                    };
                    // `run` reports start-up errors by returning early; tell the caller either way.
                    let fut = server::run(listener, config, shutdown);
                    let _ = ready_tx.send(Ok(()));
                    fut.await
                })
            })?;
        ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the server thread died at start-up"))??;
        let handle = Self {
            url: format!("http://{addr}"),
            addr,
            stop: Some(tx),
            thread: Some(thread),
        };
        // Wait until it answers (or failed to start).
        let client = client::Client::new(handle.url.clone());
        let start = Instant::now();
        loop {
            if client
                .call("GET", "/healthz", None)
                .is_ok_and(|(s, _)| s == 200)
            {
                return Ok(handle);
            }
            if handle.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let mut h = handle;
                return Err(h
                    .join()
                    .err()
                    .unwrap_or_else(|| anyhow::anyhow!("the server stopped at start-up")));
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(20),
                "the server did not answer within 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn join(&mut self) -> Result<()> {
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| anyhow::anyhow!("the server thread panicked"))?,
            None => Ok(()),
        }
    }

    /// Stops the server (removing its shared memory) and waits for it.
    pub fn stop(mut self) -> Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.join()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = self.join();
    }
}

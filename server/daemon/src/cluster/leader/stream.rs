//! The nodes' streams on the leader's side: a WebSocket per node with multi-node jobs, on
//! which the leader writes the node's outbox as passes fill it (a ping when idle for a
//! heartbeat) and reads the node's credit reports. A stream that ends or breaks fails the
//! node's multi-node jobs (frames may have been lost either way).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::{Leader, lock};
use crate::cluster::{CreditReport, Placements};
use crate::error::Result;
use crate::registry::Registry;

impl Leader {
    /// Opens a stream for the node: its id, and what wakes it when placements are queued. A
    /// stream that replaces an open one (the node lost it without the leader noticing) fails
    /// the node's jobs first, since frames sent into the old one may be lost; what was queued
    /// for them is dropped, not the notices of jobs that failed.
    pub fn open_stream(&self, name: &str) -> Result<(u64, Arc<Notify>)> {
        let mut inner = lock(self)?;
        Self::node_mut(&mut inner, name)?;
        if inner.nodes.get(name).is_some_and(|n| n.stream != 0) {
            inner.fail_jobs_of(name, &format!("node {name} opened a new stream"));
            if let Some(n) = inner.nodes.get_mut(name) {
                n.outbox.groups.clear();
                n.outbox.ends.clear();
                n.outbox.ahead.clear();
            }
        }
        inner.next_stream += 1;
        let id = inner.next_stream;
        let node = Self::node_mut(&mut inner, name)?;
        node.stream = id;
        node.last = Instant::now();
        // Its own wake-ups: an old stream still waiting must not take the new one's.
        node.notify = Arc::new(Notify::new());
        Ok((id, node.notify.clone()))
    }

    /// What is queued for stream `id` of the node (`None` once the stream is not the node's).
    fn take(&self, name: &str, id: u64) -> Option<Placements> {
        let mut inner = self.inner.lock().ok()?;
        let node = inner.nodes.get_mut(name).filter(|n| n.stream == id)?;
        node.placed += node
            .outbox
            .groups
            .iter()
            .map(|g| g.items.len() as u64)
            .sum::<u64>();
        let mut out = std::mem::take(&mut node.outbox);
        out.generation = self.generation;
        Some(out)
    }

    /// The node's stream `id` ended: when it is still the node's, its jobs fail; a stream
    /// that broke (the node's process died, or the connection) makes the node lost, as a
    /// silent one: it registers again to go on.
    fn stream_ended(&self, name: &str, id: u64, why: &str, broke: bool) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let Some(node) = inner.nodes.get_mut(name).filter(|n| n.stream == id) else {
            return;
        };
        node.stream = 0;
        if broke {
            tracing::warn!(node = name, why, "node lost: its stream broke");
            node.lost = true;
            inner.fail_jobs_of(name, &format!("node {name} lost: its stream {why}"));
        } else {
            tracing::info!(node = name, why, "node stream ended");
            inner.fail_jobs_of(name, &format!("the stream of node {name} ended: {why}"));
        }
    }

    /// Serves the node's stream `id` until it ends: writes the outbox as passes fill it, reads
    /// the node's credit reports. Runs on the HTTP worker that upgraded the request.
    pub async fn serve_stream(
        self: Arc<Self>,
        registry: Arc<Registry>,
        name: String,
        id: u64,
        notify: Arc<Notify>,
        mut session: actix_ws::Session,
        mut frames: actix_ws::MessageStream,
    ) {
        use actix_ws::Message;
        let mut sent = Instant::now();
        // Why it ended, and whether it broke (rather than the node closing it).
        let (why, broke) = loop {
            let Some(out) = self.take(&name, id) else {
                break ("replaced".to_string(), false);
            };
            if !out.is_empty() {
                let text = match serde_json::to_string(&out) {
                    Ok(t) => t,
                    Err(e) => break (format!("cannot encode placements: {e}"), false),
                };
                if session.text(text).await.is_err() {
                    break ("it broke".into(), true);
                }
                sent = Instant::now();
                continue;
            }
            if registry.is_draining() {
                break ("the leader is stopping".into(), false);
            }
            let idle = (sent + self.heartbeat).saturating_duration_since(Instant::now());
            tokio::select! {
                _ = notify.notified() => {}
                m = frames.recv() => match m {
                    Some(Ok(Message::Text(t))) => {
                        if let Err(e) = self.report(&name, t.as_bytes()) {
                            break (e, true);
                        }
                    }
                    Some(Ok(Message::Binary(b))) => {
                        if let Err(e) = self.report(&name, &b) {
                            break (e, true);
                        }
                    }
                    Some(Ok(Message::Ping(p))) => {
                        let _ = session.pong(&p).await;
                    }
                    Some(Ok(Message::Close(_))) => break ("the node closed it".into(), false),
                    None => break ("it broke".into(), true),
                    Some(Err(e)) => break (format!("it broke: {e}"), true),
                    Some(Ok(_)) => {}
                },
                _ = tokio::time::sleep(idle) => {
                    if session.ping(b"").await.is_err() {
                        break ("it broke".into(), true);
                    }
                    sent = Instant::now();
                }
            }
        };
        self.stream_ended(&name, id, &why, broke);
        let _ = session.close(None).await;
    }

    /// One credit report read from a node's stream.
    fn report(&self, name: &str, frame: &[u8]) -> std::result::Result<(), String> {
        let report: CreditReport = serde_json::from_slice(frame)
            .map_err(|e| format!("the node sent an unreadable report: {e}"))?;
        self.credits(name, report).map_err(|e| e.message)
    }

    /// Credit returned by a node and the jobs that failed there (a frame of its stream).
    fn credits(&self, name: &str, report: CreditReport) -> Result<()> {
        let mut inner = lock(self)?;
        Self::node_mut(&mut inner, name)?.last = Instant::now();
        for f in report.failed {
            inner.fail(f.job, &format!("on node {name}: {}", f.reason));
        }
        for c in report.credits {
            if let Some(j) = inner.jobs.get_mut(&c.job)
                && j.nodes.contains_key(name)
            {
                j.attached.insert(name.to_string());
            }
            inner.give_credit(c.job, u64::from(c.n));
            self.start_if_complete(&mut inner, c.job)?;
        }
        Ok(())
    }
}

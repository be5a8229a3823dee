//! The node's stream: one WebSocket to the leader, opened while the node has multi-node jobs
//! (or is joining one). Its task ([`run_link`]) turns the leader's frames into [`Placed`]
//! messages, in order, and writes the credit the agent hands it, merging what accumulated
//! while it was writing into one frame; when it ends, the agent hears why ([`LinkEnded`]).

use std::time::{Duration, Instant};

use actix::prelude::*;

use super::NodeAgent;
use crate::cluster::{CreditReport, Placements};

/// The largest frame of a node stream (a drain of an outbox the node was slow to read can be
/// large; the leader's requests' bodies had the same bound).
pub const MAX_FRAME: usize = 256 << 20;

/// The node's open stream: its task, and where the actor hands it credit reports.
pub(super) struct Link {
    pub(super) id: u64,
    pub(super) reports: tokio::sync::mpsc::UnboundedSender<CreditReport>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl NodeAgent {
    /// Whether the node needs its stream: jobs to receive placements for or to return credit
    /// and failures of.
    pub(super) fn needs_link(&self) -> bool {
        !self.jobs.is_empty() || self.joining > 0 || !self.failures.is_empty()
    }

    /// Opens the node's stream when it needs one and has none.
    pub(super) fn connect(&mut self, ctx: &mut Context<Self>) {
        if self.link.is_some() || !self.registered || !self.needs_link() {
            return;
        }
        self.links += 1;
        let id = self.links;
        let (reports, rx) = tokio::sync::mpsc::unbounded_channel();
        let url = self.url(&format!(
            "/v1/nodes/{}/stream?generation={}",
            self.name, self.generation
        ));
        let task = actix_web::rt::spawn(run_link(
            ctx.address(),
            id,
            self.client.clone(),
            url,
            self.token.clone(),
            self.timeout,
            rx,
        ));
        tracing::debug!(link = id, "opening the stream to the leader");
        self.link = Some(Link { id, reports, task });
        self.idle = 0;
        self.send_credits();
    }
}

/// Link → agent: a frame of placements from the leader, on stream `link`.
#[derive(Message)]
#[rtype(result = "()")]
struct Placed {
    link: u64,
    placements: Placements,
}

impl Handler<Placed> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: Placed, ctx: &mut Context<Self>) {
        if self.link.as_ref().map(|l| l.id) != Some(msg.link) {
            return;
        }
        if msg.placements.generation != self.generation {
            let why = format!(
                "a frame of leader generation {} on a stream of generation {}: refused",
                msg.placements.generation, self.generation
            );
            tracing::error!("{why}");
            self.link = None;
            self.leader_lost(&why, ctx);
            return;
        }
        self.last_contact = Instant::now();
        if self.joining > 0 {
            self.held.push(msg.placements);
        } else {
            self.apply(msg.placements);
        }
    }
}

/// Link → agent: stream `link` ended, and why; `unknown` when the leader does not know this
/// node (any more).
#[derive(Message)]
#[rtype(result = "()")]
struct LinkEnded {
    link: u64,
    why: String,
    unknown: bool,
}

impl Handler<LinkEnded> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: LinkEnded, ctx: &mut Context<Self>) {
        if self.link.as_ref().map(|l| l.id) != Some(msg.link) {
            return;
        }
        self.link = None;
        tracing::warn!(why = %msg.why, "the stream to the leader ended");
        // Frames may have been lost either way: the jobs it carried pause, and the node
        // registers again; a leader that comes back resumes them from what the node reports
        // (`pause`), a leader that went on fails them.
        if !self.jobs.is_empty() || msg.unknown {
            self.leader_lost(&format!("the stream to the leader ended: {}", msg.why), ctx);
        } else {
            // Failures still to report (a new job joining) go on a new stream, after a pause
            // that keeps a refusing leader from being asked in a loop.
            ctx.run_later(Duration::from_millis(100), |act, ctx| act.connect(ctx));
        }
    }
}

/// The task of stream `link`: opens the WebSocket, then forwards the leader's frames to the
/// agent and the agent's credit reports to the leader until either side ends it or the leader
/// is silent for `timeout`; tells the agent why it ended.
async fn run_link(
    agent: Addr<NodeAgent>,
    link: u64,
    client: awc::Client,
    url: String,
    token: Option<String>,
    timeout: Duration,
    mut reports: tokio::sync::mpsc::UnboundedReceiver<CreditReport>,
) {
    use awc::ws::{Frame, Message};
    use futures::{SinkExt, StreamExt};
    let (why, unknown) = async {
        let mut req = client.ws(&url).max_frame_size(MAX_FRAME);
        if let Some(t) = &token {
            req = req.bearer_auth(t);
        }
        let framed = match req.connect().await {
            Ok((_, framed)) => framed,
            Err(awc::error::WsClientError::InvalidResponseStatus(s)) => {
                // 404: the leader does not know this node; 409: another generation (or no
                // leader): register again either way.
                return (
                    format!("the leader refused it ({s})"),
                    matches!(s.as_u16(), 404 | 409),
                );
            }
            Err(e) => return (format!("cannot open it: {e}"), false),
        };
        let (mut sink, mut frames) = framed.split();
        let mut heard = Instant::now();
        loop {
            let silent = tokio::time::Instant::from_std(heard + timeout);
            tokio::select! {
                report = reports.recv() => {
                    let Some(mut report) = report else {
                        // The closing handshake: the connection stays open until the leader
                        // answers the Close. Dropped at once, the Close could arrive together
                        // with the end of the connection, which actix-ws reports first (the
                        // frame is lost): the leader would take the stream for broken and
                        // mark this node lost.
                        let _ = sink.send(Message::Close(None)).await;
                        let _ = tokio::time::timeout(timeout, async {
                            while let Some(f) = frames.next().await {
                                if matches!(f, Ok(Frame::Close(_)) | Err(_)) {
                                    break;
                                }
                            }
                        })
                        .await;
                        return ("closed by the node (no multi-node job left)".into(), false);
                    };
                    while let Ok(more) = reports.try_recv() {
                        report.merge(more);
                    }
                    let text = match serde_json::to_string(&report) {
                        Ok(t) => t,
                        Err(e) => return (format!("cannot encode a report: {e}"), false),
                    };
                    if let Err(e) = sink.send(Message::Text(text.into())).await {
                        return (format!("broken: {e}"), false);
                    }
                }
                frame = frames.next() => {
                    heard = Instant::now();
                    match frame {
                        Some(Ok(Frame::Text(b) | Frame::Binary(b))) => {
                            match serde_json::from_slice::<Placements>(&b) {
                                Ok(placements) => agent.do_send(Placed { link, placements }),
                                Err(e) => return (format!("unreadable frame: {e}"), false),
                            }
                        }
                        Some(Ok(Frame::Ping(p))) => {
                            let _ = sink.send(Message::Pong(p)).await;
                        }
                        Some(Ok(Frame::Close(r))) => {
                            return (format!("closed by the leader ({r:?})"), false);
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => return (format!("broken: {e}"), false),
                        None => return ("closed by the leader".into(), false),
                    }
                }
                _ = tokio::time::sleep_until(silent) => {
                    return (format!("the leader was silent for {timeout:?}"), false);
                }
            }
        }
    }
    .await;
    agent.do_send(LinkEnded { link, why, unknown });
}

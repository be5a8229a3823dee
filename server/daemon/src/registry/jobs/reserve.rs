//! A job's name during its registration. A request for a running job is another rank of it
//! when its parameters are the same, and a conflict otherwise; a failed job's name, or a
//! finished one whose rings are closed, is taken over; so is a finished job's name by a job
//! with other parameters. The name is reserved before the registration's first await, so
//! that ranks arriving together (as torchrun starts them) create the job once and join it.

use actors::JobState;
use tokio::sync::watch;

use super::request::JobRequest;
use super::stop::stop_job;
use crate::error::{Code, Error, Result};
use crate::registry::{JobEntry, Registering, Registry};

/// What [`reserve`] found.
pub enum Reserved<'a, T> {
    /// The request is another rank of this running job: `view` of it.
    Rank(T),
    /// The name is this registration's until the reservation drops.
    Name(Reservation<'a>),
}

/// Reserves the job's name for this registration, stopping the job of that name it takes
/// over, or finds the running job the request is another rank of (a registration in
/// progress is waited for, then looked at again).
pub async fn reserve<'a, T>(
    registry: &'a Registry,
    req: &JobRequest,
    view: &impl Fn(&Registry, &JobEntry) -> T,
) -> Result<Reserved<'a, T>> {
    let identity = req.identity();
    let (replaced, reservation) = loop {
        let mut done = {
            let mut inner = registry.inner.lock().map_err(Error::internal)?;
            if let Some(r) = inner.registering.get(&req.name) {
                if let Some(field) = differing_field(&r.request, &identity) {
                    return Err(conflict(&req.name, &field));
                }
                r.done.clone()
            } else {
                let replaced = match inner.jobs.get(&req.name) {
                    Some(j) => {
                        let differs = differing_field(&j.request, &identity);
                        let closed = j.stats.closed.load(std::sync::atomic::Ordering::Relaxed);
                        match (j.stats.state(), differs) {
                            (JobState::Failed(_), _) => true,
                            (JobState::Finished, _) if closed => true,
                            // A finished job's name, wanted by another job.
                            (JobState::Finished, Some(_)) => true,
                            // Another rank of this job (a small job's end of stream may be
                            // pushed before its last rank arrives: it still joins).
                            (_, None) => return Ok(Reserved::Rank(view(registry, j))),
                            (_, Some(field)) => return Err(conflict(&req.name, &field)),
                        }
                    }
                    None => false,
                };
                let (tx, rx) = watch::channel(());
                inner.registering.insert(
                    req.name.clone(),
                    Registering {
                        request: identity.clone(),
                        done: rx,
                    },
                );
                break (
                    replaced,
                    Reservation {
                        registry,
                        name: req.name.clone(),
                        _done: tx,
                    },
                );
            }
        };
        // Resolves when the registration in progress ends; then look again.
        let _ = done.changed().await;
    };
    if replaced {
        stop_job(registry, &req.name).await?;
    }
    Ok(Reserved::Name(reservation))
}

/// A job name reserved for one registration; dropping it (the registration ended, however)
/// frees the name and wakes the ranks waiting for it.
pub struct Reservation<'a> {
    registry: &'a Registry,
    name: String,
    _done: watch::Sender<()>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.registry.inner.lock() {
            inner.registering.remove(&self.name);
        }
        // `_done` is dropped after this: the waiters see the registry as it now is.
    }
}

/// The first field in which two job requests differ (ranks of one job must agree on all).
fn differing_field(a: &JobRequest, b: &JobRequest) -> Option<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return Some("parameters".into());
    };
    a.keys()
        .chain(b.keys())
        .find(|k| a.get(*k) != b.get(*k))
        .cloned()
}

fn conflict(name: &str, field: &str) -> Error {
    Error::new(
        Code::JobExists,
        format!(
            "a job named '{name}' is running with other parameters ('{field}' differs): every \
             rank of a job must send the same parameters, and another job needs another name"
        ),
    )
}

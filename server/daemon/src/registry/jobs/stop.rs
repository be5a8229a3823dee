//! Stopping a job: no more sampling, its rings closed and its slots released, its counters
//! retired under its name.

use actors::{CloseJob, JobState, RemoveJob};

use crate::error::{Error, Result};
use crate::registry::Registry;

/// Stops a job: no more sampling, its rings closed and its slots released.
pub async fn stop_job(registry: &Registry, name: &str) -> Result<()> {
    let entry = registry
        .inner
        .lock()
        .map_err(Error::internal)?
        .jobs
        .remove(name)
        .ok_or_else(|| Error::job_not_found(name))?;
    entry
        .sampler
        .send(RemoveJob { job: entry.id })
        .await
        .map_err(Error::internal)?;
    registry
        .cache
        .send(CloseJob { job: entry.id })
        .await
        .map_err(Error::internal)?;
    entry.stats.set_state(JobState::Failed("deleted".into()));
    // Closed: its counters are final; a later job of the same name continues from them.
    registry
        .inner
        .lock()
        .map_err(Error::internal)?
        .retire(name, &entry.stats);
    Ok(())
}

//! A leader restart as a pause: the journal of multi-node jobs, and their rebuild from what
//! their nodes received.
//!
//! - **Journal.** Each multi-node job is written to the catalog (`cluster_jobs`: its
//!   registration, nodes and ranks, whether it started, finished or failed) before the leader
//!   answers the request that changed it; an ended job stays there as long as the leader
//!   keeps it in memory (`ENDED_KEPT`). Every start of the leader takes a new generation
//!   (`Catalog::next_generation`), which it sends with each registration and frame.
//! - **Restart.** A restarted leader loads the journal: each job that had not failed waits,
//!   `restoring`, up to `leader_grace` for its nodes. A follower that lost its leader keeps
//!   its multi-node jobs paused (rings open, ranks waiting), registers with the new
//!   generation and reports each job (`POST /v1/nodes/{name}/resume`): per epoch it holds, the
//!   records placed on it (`count`: its positions `0..count`), their elements, whether it had
//!   the end; the room its rings have (credit returned minus records placed). A job a node
//!   does not report, or a node that does not come back in time, fails the job.
//! - **Rebuild** ([`plan`]). Once every node of a job has reported: the epoch under way is the
//!   earliest that some node has not ended. An epoch's records already placed are the
//!   union of what the nodes received (what the dead leader had queued but not sent is lost,
//!   and sampled again). The first epoch with elements left resumes in the dataset's cluster
//!   Sampler with exactly those left (an elastic resume, DSA with the other jobs of the
//!   dataset again), its placer restored at each node's next position; epochs before it with
//!   nothing left are ended at once (padding the nodes below quota); of later epochs that a
//!   node had begun (it had the end of the one before, others had not), the records it
//!   received are skipped when sampled again (`dispatch`). Nodes that had an epoch's end do
//!   not get it twice. The job's credit is the room its nodes report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::actors::EndAt;
use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};

use super::{ClusterJob, Inner, Leader, lock};
use crate::catalog::Catalog;
use crate::cluster::{ClusterJobView, JobFailure, JobSeen, ResumeReply, ResumeReport};
use crate::error::{Code, Error, Result};
use crate::registry::Registry;
use crate::registry::jobs::JobRequest;

/// How long an ended job is kept (in memory and in the journal).
pub(super) const ENDED_KEPT: Duration = Duration::from_secs(600);

/// A job as the journal holds it.
#[derive(Serialize, Deserialize)]
struct Journaled {
    name: String,
    request: JobRequest,
    world: u32,
    nodes: BTreeMap<String, Vec<u32>>,
    remote: bool,
    started: bool,
    finished: bool,
    failed: Option<String>,
    /// Items of the dataset when the job joined.
    #[serde(default)]
    items: u64,
}

/// A job taken back from the journal, waiting for its nodes' reports.
pub(super) struct Restoring {
    deadline: Instant,
    /// It was sampling when the leader stopped (or its ranks were still joining).
    started: bool,
    /// It had finished (its nodes may not all have had its last end).
    finished: bool,
    reports: BTreeMap<String, JobSeen>,
}

/// What the nodes had received of an epoch before the leader restarted.
#[derive(Debug, Default)]
pub(super) struct RestoredEpoch {
    /// Elements placed (on any node): not placed again when sampled again.
    pub(super) skip: RoaringBitmap,
    /// Records placed on each node (in the placer's node order).
    pub(super) filled: Vec<u64>,
    /// Some of those elements (padding repeats them).
    pub(super) first: Vec<u32>,
    /// Nodes that had the epoch's end.
    pub(super) ended: BTreeSet<String>,
}

impl Inner {
    /// Writes job `id` to the journal as it is now (an error is logged: the job goes on, and
    /// is lost only if the leader restarts).
    pub(super) fn journal(&self, id: u64) {
        let (Some(catalog), Some(job)) = (&self.journal, self.jobs.get(&id)) else {
            return;
        };
        let entry = Journaled {
            name: job.name.clone(),
            request: job.request.clone(),
            world: job.world,
            nodes: job.nodes.clone(),
            remote: job.remote,
            started: job.placer.is_some() || job.restoring.as_ref().is_some_and(|r| r.started),
            finished: job.finished,
            failed: job.failed.clone(),
            items: job.items,
        };
        let written = serde_json::to_vec(&entry)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| catalog.put_cluster_job(id, &bytes));
        if let Err(e) = written {
            tracing::error!(job = %job.name, error = %e, "cannot journal a multi-node job");
        }
    }

    /// Forgets jobs that ended more than [`ENDED_KEPT`] ago, here and in the journal.
    pub(super) fn forget_ended(&mut self) {
        let old: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.ended_at.is_some_and(|t| t.elapsed() > ENDED_KEPT))
            .map(|(id, _)| *id)
            .collect();
        for id in old {
            self.jobs.remove(&id);
            if let Some(c) = &self.journal
                && let Err(e) = c.remove_cluster_job(id)
            {
                tracing::warn!(job = id, error = %e, "cannot remove a job from the journal");
            }
        }
    }

    /// Fails the restored jobs whose nodes did not all report in time.
    pub(super) fn expire_restoring(&mut self, grace: Duration) {
        let now = Instant::now();
        let late: Vec<(u64, Vec<String>)> = self
            .jobs
            .iter()
            .filter_map(|(id, j)| {
                let r = j.restoring.as_ref().filter(|r| now > r.deadline)?;
                let missing = j.nodes.keys().filter(|n| !r.reports.contains_key(*n));
                Some((*id, missing.cloned().collect()))
            })
            .collect();
        for (id, missing) in late {
            if let Some(j) = self.jobs.get_mut(&id)
                && j.restoring.take().is_some_and(|r| r.finished)
            {
                // It had finished: a node that did not come back had its end, or lost it.
                j.finished = true;
                j.ended_at = Some(now);
                self.journal(id);
                continue;
            }
            self.fail(
                id,
                &format!(
                    "its nodes did not all come back within {grace:?} of the leader's restart \
                     (missing: {})",
                    missing.join(", ")
                ),
            );
        }
    }

    /// The multi-node jobs for `GET /v1/nodes`.
    pub(super) fn job_views(&self) -> Vec<ClusterJobView> {
        let mut out: Vec<ClusterJobView> = self
            .jobs
            .iter()
            .map(|(id, j)| ClusterJobView {
                id: *id,
                name: j.name.clone(),
                dataset: j.dataset.clone(),
                state: match (&j.failed, j.finished, &j.restoring, &j.placer) {
                    (Some(_), ..) => "failed",
                    (None, true, ..) => "finished",
                    (None, false, Some(_), _) => "restoring",
                    (None, false, None, Some(_)) => "running",
                    (None, false, None, None) => "joining",
                }
                .into(),
                reason: j.failed.clone(),
                nodes: j.nodes.clone(),
            })
            .collect();
        out.sort_by_key(|v| v.id);
        out
    }
}

/// Loads the journal into a starting leader: failed jobs as they ended, the others restoring
/// until `grace` from now.
pub(super) fn load(inner: &mut Inner, catalog: &Catalog, grace: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + grace;
    // Ids go on above the journal's and the clock's (`add_job`): a job id never repeats, even
    // one that was forgotten (a node may still report it).
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    inner.next_id = inner.next_id.max(secs << 20);
    for (id, bytes) in catalog.cluster_jobs()? {
        let j: Journaled = match serde_json::from_slice(&bytes) {
            Ok(j) => j,
            Err(e) => {
                tracing::warn!(job = id, error = %e, "an unreadable journal entry: dropped");
                catalog.remove_cluster_job(id)?;
                continue;
            }
        };
        inner.next_id = inner.next_id.max(id);
        let mut job = ClusterJob::new(&j.name, &j.request, j.world);
        job.id = id;
        job.nodes = j.nodes;
        job.remote = j.remote;
        job.items = j.items;
        match j.failed {
            Some(reason) => {
                job.failed = Some(reason);
                job.ended_at = Some(Instant::now());
            }
            None => {
                tracing::info!(job = %j.name, "multi-node job taken back from the journal: waiting for its nodes");
                job.restoring = Some(Restoring {
                    deadline,
                    started: j.started,
                    finished: j.finished,
                    reports: BTreeMap::new(),
                });
                if !j.finished {
                    inner.names.insert(j.name.clone(), id);
                }
            }
        }
        inner.jobs.insert(id, job);
    }
    Ok(())
}

impl Leader {
    /// `POST /v1/nodes/{name}/resume`: a node's report of its multi-node jobs after the leader
    /// restarted. Answers those the leader cannot resume; a job is rebuilt once every node of
    /// it has reported.
    pub async fn resume(
        &self,
        registry: &Registry,
        node: &str,
        report: ResumeReport,
    ) -> Result<ResumeReply> {
        if report.generation != self.generation {
            return Err(Error::new(
                Code::StaleGeneration,
                format!(
                    "the report is for leader generation {}, and this leader is generation {}: \
                     register again",
                    report.generation, self.generation
                ),
            ));
        }
        let (complete, reply) = {
            let mut inner = lock(self)?;
            Self::node_mut(&mut inner, node)?;
            check_datasets(&mut inner, registry, &report.jobs)?;
            self.record_reports(&mut inner, node, report.jobs)
        };
        for id in complete {
            self.rebuild_or_fail(registry, id).await?;
        }
        Ok(reply)
    }

    /// Rebuilds restored job `id` (every node of it reported), failing it if it cannot be.
    pub(super) async fn rebuild_or_fail(&self, registry: &Registry, id: u64) -> Result<()> {
        if let Err(e) = self.rebuild(registry, id).await {
            lock(self)?.fail(
                id,
                &format!("the restarted leader cannot resume it: {}", e.message),
            );
        }
        Ok(())
    }

    /// Keeps a node's reports of restoring jobs; answers the jobs it cannot resume. Returns the
    /// jobs every node of which has now reported.
    fn record_reports(
        &self,
        inner: &mut Inner,
        node: &str,
        jobs: Vec<JobSeen>,
    ) -> (Vec<u64>, ResumeReply) {
        let mut reply = ResumeReply::default();
        let mut complete = Vec::new();
        let reported: BTreeSet<u64> = jobs.iter().map(|j| j.job).collect();
        for seen in jobs {
            let id = seen.job;
            let Some(job) = inner.jobs.get_mut(&id) else {
                reply.failed.push(JobFailure {
                    job: id,
                    reason: format!(
                        "the leader (generation {}) has no record of the job: its data folder \
                         was lost, or the job ended long ago",
                        self.generation
                    ),
                });
                continue;
            };
            let of_node = job.nodes.contains_key(node);
            if let Some(r) = job.restoring.as_mut().filter(|_| of_node) {
                r.reports.insert(node.to_string(), seen);
                if r.reports.len() == job.nodes.len() {
                    complete.push(id);
                }
                continue;
            }
            // A report sent again after the job was rebuilt (the answer to the first was
            // lost): the credit returned since the first is the job's.
            if job.live()
                && let Some(before) = job.reported.get_mut(node)
            {
                let since = seen.granted.saturating_sub(*before);
                *before = (*before).max(seen.granted);
                inner.give_credit(id, since);
                continue;
            }
            let reason = match (&job.failed, job.finished) {
                (Some(why), _) => why.clone(),
                (None, true) if seen.finished => continue,
                (None, true) => "it finished before this node had its end".into(),
                (None, false) => {
                    "the leader did not pause it (frames to this node may have been lost)".into()
                }
            };
            reply.failed.push(JobFailure {
                job: id,
                reason: reason.clone(),
            });
            inner.fail(id, &format!("on node {node}: {reason}"));
        }
        missing_reports(inner, node, &reported, &mut complete);
        (complete, reply)
    }

    /// Rebuilds restored job `id` from its nodes' reports (see the module docs).
    async fn rebuild(&self, registry: &Registry, id: u64) -> Result<()> {
        let (request, items) = {
            let inner = lock(self)?;
            let job = inner
                .jobs
                .get(&id)
                .filter(|j| j.live() && j.restoring.is_some())
                .ok_or_else(|| Error::internal("the job is no longer restoring"))?;
            (job.request.clone(), (job.items > 0).then_some(job.items))
        };
        let index = registry
            .dataset(&request.dataset)?
            .index
            .clone()
            .ok_or_else(|| {
                Error::new(
                    Code::DatasetNotReady,
                    format!("dataset '{}' is not ready on the leader", request.dataset),
                )
            })?;
        let (subset, resume) = super::join::job_order(index, &request, items).await?;
        let (arbiter, dispatch) = self.started()?;
        let mut inner = lock(self)?;
        let Some(job) = inner
            .jobs
            .get_mut(&id)
            .filter(|j| j.live() && j.restoring.is_some())
        else {
            return Ok(());
        };
        let Some(restoring) = job.restoring.take() else {
            return Ok(());
        };
        job.subset = Arc::new(subset);
        job.resume = resume;
        // Credit returned on the nodes' new streams since their reports comes on top.
        job.pending_credit += restoring.reports.values().map(|s| s.room).sum::<u64>();
        // Nodes whose first credit came on their new stream attached already.
        job.attached.extend(
            restoring
                .reports
                .iter()
                .filter(|(_, s)| s.attached)
                .map(|(n, _)| n.clone()),
        );
        job.reported = restoring
            .reports
            .iter()
            .map(|(n, s)| (n.clone(), s.granted))
            .collect();
        job.debt = 0;
        if !restoring.started {
            tracing::info!(job = %job.name, "multi-node job back: its ranks were still joining");
            self.start_if_complete(&mut inner, id)?;
            inner.journal(id);
            return Ok(());
        }
        let plan = plan(job, &restoring.reports).map_err(|m| Error::new(Code::NodeMismatch, m))?;
        self.go_on(&mut inner, id, plan, arbiter, dispatch)
    }

    /// Restored job `id` goes on as `plan` says: its placer where its nodes were, the
    /// epochs with nothing left ended, the Sampler from the first with something left.
    fn go_on(
        &self,
        inner: &mut Inner,
        id: u64,
        plan: Plan,
        arbiter: actix::ArbiterHandle,
        dispatch: actix::Addr<super::Dispatch>,
    ) -> Result<()> {
        let job = inner
            .jobs
            .get_mut(&id)
            .ok_or_else(|| Error::internal("lost job"))?;
        let resumed = job.resume.as_ref().is_some_and(|(e, _)| *e == plan.first);
        let (mut placer, names) = job.placer(resumed);
        if let Some(r) = plan.epochs.get(&plan.first) {
            placer.restore(&r.filled, &r.first);
        }
        job.placer = Some((placer, names));
        job.restored = plan.epochs;
        let last = job.request.epochs;
        let name = job.name.clone();
        // Epochs with nothing left to sample: ended now.
        let until = plan.start.as_ref().map_or(plan.end, |(e, _)| *e);
        for epoch in plan.first..until {
            super::dispatch::end_epoch(
                inner,
                &EndAt {
                    after: 0,
                    job: id,
                    epoch,
                    finished: last.is_some_and(|l| epoch + 1 >= l),
                },
            );
        }
        if let Some((epoch, rest)) = plan.start {
            tracing::info!(job = %name, epoch, left = rest.len(), "multi-node job resumed after the leader's restart");
            let sampler = self.sampler_of(inner, id, arbiter, dispatch)?;
            if let Some(job) = inner.jobs.get_mut(&id) {
                super::join::add_to_sampler(job, &sampler, Some((epoch, Arc::new(rest))));
            }
        } else if let Some(job) = inner.jobs.get_mut(&id)
            && !job.finished
        {
            // Every epoch was placed and ended: nothing is left.
            job.finished = true;
            job.ended_at = Some(Instant::now());
            inner.names.remove(&name);
        }
        inner.journal(id);
        for n in inner.nodes.values() {
            n.notify.notify_one();
        }
        Ok(())
    }
}

/// Restoring jobs of `node` that its report (of `reported`) did not name: it lost them (or,
/// finished, it forgot them: nothing of them is left to deliver there, and an empty report
/// stands for it). Jobs every node of which has now reported join `complete`.
fn missing_reports(
    inner: &mut Inner,
    node: &str,
    reported: &BTreeSet<u64>,
    complete: &mut Vec<u64>,
) {
    let missing: Vec<(u64, bool)> = inner
        .jobs
        .iter()
        .filter(|(id, j)| j.nodes.contains_key(node) && !reported.contains(id))
        .filter_map(|(id, j)| {
            let r = j.restoring.as_ref()?;
            (!r.reports.contains_key(node)).then_some((*id, r.finished))
        })
        .collect();
    for (id, finished) in missing {
        if !finished {
            inner.fail(
                id,
                &format!(
                    "node {node} came back without it (it failed there, or the node's \
                         grace period ended)"
                ),
            );
            continue;
        }
        if let Some(j) = inner.jobs.get_mut(&id)
            && let Some(r) = j.restoring.as_mut()
        {
            r.reports.insert(
                node.to_string(),
                JobSeen {
                    job: id,
                    epochs: Vec::new(),
                    room: 0,
                    granted: 0,
                    attached: true,
                    finished: true,
                },
            );
            if r.reports.len() == j.nodes.len() {
                complete.push(id);
            }
        }
    }
}

/// The datasets of the restoring jobs a node reports: one still indexing on the leader makes
/// the node report again later (`dataset_not_ready`); a job whose dataset is gone or failed
/// fails.
fn check_datasets(inner: &mut Inner, registry: &Registry, jobs: &[JobSeen]) -> Result<()> {
    let mut gone = Vec::new();
    for seen in jobs {
        let Some(j) = inner.jobs.get(&seen.job).filter(|j| j.restoring.is_some()) else {
            continue;
        };
        match registry.dataset(&j.dataset) {
            Ok(d) if d.index.is_some() => {}
            Ok(d) if d.record.state != "failed" => {
                return Err(Error::new(
                    Code::DatasetNotReady,
                    format!(
                        "dataset '{}' is {} on the restarted leader: report again",
                        j.dataset, d.record.state
                    ),
                ));
            }
            Ok(d) => gone.push((
                seen.job,
                format!(
                    "its dataset '{}' failed on the leader: {}",
                    j.dataset,
                    d.record.error.unwrap_or_default()
                ),
            )),
            Err(e) => gone.push((seen.job, e.message)),
        }
    }
    for (id, reason) in gone {
        inner.fail(id, &reason);
    }
    Ok(())
}

impl ClusterJob {
    /// Node `node` joined this job while it waits for its nodes after a restart: it has
    /// nothing of it to report (an empty report stands for it). Returns whether every node of
    /// the job has now reported.
    pub(super) fn joined_while_restoring(&mut self, node: &str) -> bool {
        let nodes = self.nodes.len();
        let Some(r) = self.restoring.as_mut() else {
            return false;
        };
        r.reports.entry(node.to_string()).or_insert(JobSeen {
            job: self.id,
            epochs: Vec::new(),
            room: 0,
            granted: 0,
            attached: false,
            finished: false,
        });
        r.reports.len() == nodes
    }
}

/// How a restored job goes on (see the module docs).
struct Plan {
    /// The earliest epoch some node has not ended.
    first: u32,
    /// What each epoch from `first` on had placed.
    epochs: BTreeMap<u32, RestoredEpoch>,
    /// The first epoch with elements left, and those: the Sampler resumes there.
    start: Option<(u32, RoaringBitmap)>,
    /// Without a start: the epoch after the last (every epoch before is ended now).
    end: u32,
}

/// The plan of a restored job from its nodes' reports; an error when a node no longer holds
/// what it received of an epoch that must be completed.
fn plan(
    job: &ClusterJob,
    reports: &BTreeMap<String, JobSeen>,
) -> std::result::Result<Plan, String> {
    let names: Vec<&String> = job.nodes.keys().collect();
    let begin = job.resume.as_ref().map_or(0, |(e, _)| *e);
    let last = job.request.epochs;
    let first = reports
        .values()
        .filter(|s| !s.finished)
        .map(|s| {
            s.epochs
                .iter()
                .find(|e| !e.ended)
                .map(|e| e.epoch)
                .or_else(|| s.epochs.iter().map(|e| e.epoch + 1).max())
                .unwrap_or(begin)
        })
        .min();
    let Some(first) = first else {
        // Every node had the job's last end.
        let end = last.unwrap_or(begin);
        return Ok(Plan {
            first: end,
            epochs: BTreeMap::new(),
            start: None,
            end,
        });
    };
    let newest = reports
        .values()
        .flat_map(|s| s.epochs.iter().map(|e| e.epoch))
        .max()
        .unwrap_or(first)
        .max(first);
    let mut epochs = BTreeMap::new();
    let mut start = None;
    for epoch in first..=newest {
        let mut r = RestoredEpoch {
            filled: vec![0; names.len()],
            ..RestoredEpoch::default()
        };
        for (i, n) in names.iter().enumerate() {
            let seen = &reports[*n];
            match seen.epochs.iter().find(|x| x.epoch == epoch) {
                Some(x) => {
                    r.filled[i] = u64::from(x.count);
                    r.skip |= crate::cluster::decode_ids(&x.elements)
                        .map_err(|e| format!("node {n}'s report of epoch {epoch}: {e}"))?;
                    if x.ended {
                        r.ended.insert((*n).clone());
                    }
                }
                None if seen.finished || seen.epochs.first().is_some_and(|h| h.epoch > epoch) => {
                    return Err(format!(
                        "node {n} no longer holds what it received of epoch {epoch}"
                    ));
                }
                None => {}
            }
        }
        r.first = r.skip.iter().take(job.world as usize).collect();
        if start.is_none() {
            let whole = match &job.resume {
                Some((e, rest)) if *e == epoch => rest.as_ref(),
                _ => job.subset.as_ref(),
            };
            let rest = whole - &r.skip;
            if !rest.is_empty() {
                start = Some((epoch, rest));
            }
        }
        epochs.insert(epoch, r);
    }
    let end = newest + 1;
    if start.is_none() && last.is_none_or(|l| end < l) {
        start = Some((end, job.subset.as_ref().clone()));
    }
    Ok(Plan {
        first,
        epochs,
        start,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::EpochSeen;
    use joader_core::cluster::{EpochPlacer, node_key};

    /// A started job of 12 elements on nodes `a` and `b` (one rank each), `epochs` epochs.
    fn job(epochs: u32) -> ClusterJob {
        let request: JobRequest = serde_json::from_value(serde_json::json!({
            "name": "j", "dataset": "d", "batch_size": 2, "world_size": 2, "epochs": epochs}))
        .unwrap();
        let mut j = ClusterJob::new("j", &request, 2);
        j.nodes = BTreeMap::from([("a".into(), vec![0]), ("b".into(), vec![1])]);
        j.subset = Arc::new((0..12).collect());
        j
    }

    fn seen(epochs: &[(u32, &[u32], bool)], finished: bool) -> JobSeen {
        JobSeen {
            job: 1,
            epochs: epochs
                .iter()
                .map(|&(epoch, elements, ended)| EpochSeen {
                    epoch,
                    count: elements.len() as u32,
                    elements: crate::cluster::encode_ids(&elements.iter().copied().collect()),
                    ended,
                })
                .collect(),
            room: 2,
            granted: 8,
            attached: true,
            finished,
        }
    }

    fn reports(a: JobSeen, b: JobSeen) -> BTreeMap<String, JobSeen> {
        BTreeMap::from([("a".into(), a), ("b".into(), b)])
    }

    #[test]
    fn an_epoch_under_way_resumes_with_what_no_node_received() {
        let r = reports(
            seen(&[(0, &[3, 7], false)], false),
            seen(&[(0, &[1], false)], false),
        );
        let p = plan(&job(2), &r).unwrap();
        assert_eq!(p.first, 0);
        let (epoch, rest) = p.start.unwrap();
        assert_eq!(epoch, 0);
        assert_eq!(rest, (0..12).filter(|e| ![1, 3, 7].contains(e)).collect());
        assert_eq!(p.epochs[&0].filled, vec![2, 1]);
        assert!(p.epochs[&0].ended.is_empty());
    }

    /// Node `a` had epoch 0's end and two records of epoch 1; `b` had not had the end (its last
    /// records were lost with the leader): epoch 0 resumes with what `b` lost, `a` does not get
    /// its end again, and epoch 1 skips what `a` received.
    #[test]
    fn nodes_an_epoch_apart_resume_each_where_it_was() {
        let all: Vec<u32> = (0..6).collect();
        let r = reports(
            seen(&[(0, &all, true), (1, &[4, 9], false)], false),
            seen(&[(0, &[6, 7, 8, 9], false)], false),
        );
        let p = plan(&job(3), &r).unwrap();
        assert_eq!(p.first, 0);
        let (epoch, rest) = p.start.unwrap();
        assert_eq!((epoch, rest), (0, [10u32, 11].into_iter().collect()));
        assert_eq!(p.epochs[&0].ended, BTreeSet::from(["a".to_string()]));
        assert_eq!(p.epochs[&0].filled, vec![6, 4]);
        assert_eq!(p.epochs[&1].skip, [4u32, 9].into_iter().collect());
        assert_eq!(p.epochs[&1].filled, vec![2, 0]);
    }

    /// Every element of epoch 1 was received, its ends were not: it is ended at once and the
    /// Sampler starts at epoch 2 with the whole dataset; in a job of 2 epochs nothing starts.
    #[test]
    fn an_epoch_wholly_received_is_ended_and_the_next_one_starts() {
        let (a, b): (Vec<u32>, Vec<u32>) = ((0..6).collect(), (6..12).collect());
        let r = reports(
            seen(&[(0, &[0], true), (1, &a, false)], false),
            seen(&[(0, &[1], true), (1, &b, false)], false),
        );
        let p = plan(&job(3), &r).unwrap();
        assert_eq!(p.first, 1);
        assert_eq!(p.start.unwrap(), (2, (0..12).collect()));
        let p = plan(&job(2), &r).unwrap();
        assert!(p.start.is_none());
        assert_eq!((p.first, p.end), (1, 2));
    }

    /// The dispatch of a restored job: a record a node received before the restart is not
    /// placed again (its credit goes back), an epoch's end is not sent again to the node
    /// that had it, and the next epoch's placement goes on at the positions a node had begun.
    /// A leader with nodes `a` and `b` and a job restored in epoch 0: `a` had its 6 records
    /// and its end, `b` 4 records; of epoch 1, `a` had 2.
    fn restored_leader() -> (tempfile::TempDir, Arc<Leader>) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(Catalog::open(dir.path()).unwrap());
        let leader = Leader::new(&crate::config::Config::default(), catalog).unwrap();
        for name in ["a", "b"] {
            leader
                .register(crate::cluster::NodeRegistration {
                    name: name.into(),
                    address: "http://127.0.0.1:1".into(),
                    instance: "i".into(),
                })
                .unwrap();
        }
        {
            let mut inner = leader.inner.lock().unwrap();
            let mut j = job(3);
            j.id = 1;
            let names = vec!["a".to_string(), "b".to_string()];
            let keys = names.iter().map(|n| node_key(n)).collect();
            let mut placer = EpochPlacer::new(12, keys, vec![1, 1], false);
            placer.restore(&[6, 4], &[0, 1]);
            j.placer = Some((placer, names));
            j.restored = BTreeMap::from([
                (
                    0,
                    RestoredEpoch {
                        skip: (0..10).collect(),
                        filled: vec![6, 4],
                        first: vec![0, 1],
                        ended: BTreeSet::from(["a".to_string()]),
                    },
                ),
                (
                    1,
                    RestoredEpoch {
                        skip: [4u32, 9].into_iter().collect(),
                        filled: vec![2, 0],
                        first: vec![4, 9],
                        ended: BTreeSet::new(),
                    },
                ),
            ]);
            inner.jobs.insert(1, j);
        }
        (dir, leader)
    }

    #[test]
    fn a_restored_job_skips_what_its_nodes_received_and_ends_each_epoch_once() {
        use ::actors::{Deliver, DeliverGroup, DeliverItem};
        let (_dir, leader) = restored_leader();
        let group = |element: u32, epoch: u32| DeliverGroup {
            element,
            need: 1,
            items: vec![DeliverItem {
                job: 1,
                epoch,
                position: 0,
            }],
        };
        // The Sampler's pass: epoch 0's last two elements, its end, then epoch 1 begins with
        // an element `a` received already, and another.
        leader.place(Deliver {
            dataset: 0,
            groups: vec![group(10, 0), group(11, 0), group(4, 1), group(5, 1)],
            ends: vec![EndAt {
                after: 2,
                job: 1,
                epoch: 0,
                finished: false,
            }],
            ahead: Vec::new(),
            grown: Vec::new(),
        });
        let inner = leader.inner.lock().unwrap();
        let (a, b) = (&inner.nodes["a"].outbox, &inner.nodes["b"].outbox);
        let placed = |o: &crate::cluster::Placements, epoch: u32| -> Vec<(u32, u32)> {
            o.groups
                .iter()
                .flat_map(|g| {
                    g.items
                        .iter()
                        .filter(move |i| i.epoch == epoch)
                        .map(move |i| (g.element, i.position))
                })
                .collect()
        };
        // `a` was full: the rest of epoch 0 goes to `b`, at its next positions.
        assert_eq!(placed(b, 0), vec![(10, 4), (11, 5)]);
        assert!(placed(a, 0).is_empty());
        assert_eq!(a.ends.len(), 0, "a had epoch 0's end");
        assert_eq!(b.ends.len(), 1);
        // Epoch 1: element 4 is not placed again; 5 goes on at a's position 2 or b's 0.
        let e1: Vec<(u32, u32)> = [placed(a, 1), placed(b, 1)].concat();
        assert_eq!(e1.len(), 1, "{e1:?}");
        assert!(
            placed(a, 1) == vec![(5, 2)] || placed(b, 1) == vec![(5, 0)],
            "{e1:?}"
        );
        assert_eq!(
            inner.jobs[&1].pending_credit, 1,
            "the skipped record's credit"
        );
        assert!(!inner.jobs[&1].restored.contains_key(&0));
    }

    /// A job that failed while it waited for its nodes is answered failed to a node that
    /// reports it later (never recorded as waiting); a report sent again after the rebuild (the
    /// answer to the first was lost) gives the job the credit returned since, and fails
    /// nothing.
    #[test]
    fn late_and_repeated_reports() {
        let (_dir, leader) = restored_leader();
        let mut inner = leader.inner.lock().unwrap();
        let mut waiting = job(3);
        waiting.id = 2;
        waiting.restoring = Some(Restoring {
            deadline: Instant::now() + Duration::from_secs(60),
            started: true,
            finished: false,
            reports: BTreeMap::new(),
        });
        inner.jobs.insert(2, waiting);
        inner.fail(2, "node a came back without it");
        let mut late = seen(&[(0, &[1], false)], false);
        late.job = 2;
        let (complete, reply) = leader.record_reports(&mut inner, "b", vec![late]);
        assert!(complete.is_empty());
        assert_eq!(reply.failed.len(), 1);
        assert!(reply.failed[0].reason.contains("came back without it"));
        // Job 1 was rebuilt with `a`'s report of 8 granted; `a` reports again with 11.
        inner.jobs.get_mut(&1).unwrap().reported = BTreeMap::from([("a".to_string(), 8)]);
        let before = inner.jobs[&1].pending_credit;
        let mut again = seen(&[(0, &[1], false)], false);
        again.granted = 11;
        let (complete, reply) = leader.record_reports(&mut inner, "a", vec![again]);
        assert!(complete.is_empty() && reply.failed.is_empty(), "{reply:?}");
        assert_eq!(inner.jobs[&1].pending_credit, before + 3);
        assert!(inner.jobs[&1].live());
    }

    #[test]
    fn a_node_that_no_longer_holds_an_epoch_to_complete_is_an_error() {
        let r = reports(
            seen(&[(2, &[1], false)], false),
            seen(&[(0, &[2], false)], false),
        );
        let err = plan(&job(5), &r).err().unwrap();
        assert!(err.contains("node a no longer holds"), "{err}");
    }
}

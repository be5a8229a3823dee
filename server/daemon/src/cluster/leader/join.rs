//! Multi-node jobs joining on the leader: each node forwards its ranks of a job
//! (`POST /v1/nodes/{name}/jobs`); once every rank has joined and every node's ranks have
//! attached, the job gets its placer over its nodes and joins its dataset's cluster Sampler
//! (a resumed job with the rest of its epoch, shared among the ranks and nodes it has now).

use std::collections::BTreeMap;
use std::sync::Arc;

use ::actors::{AddJob, JobStats, SamplerActor};
use actix::Actor;
use joader_core::sampling::SamplerKind;

use super::{ClusterJob, Inner, Leader, lock};
use crate::cluster::{NodeJob, NodeJobAccepted};
use crate::error::{Code, Error, Result};
use crate::registry::Registry;
use crate::registry::jobs::JobRequest;
use joader_storage::DatasetIndex;
use roaring::RoaringBitmap;

impl Leader {
    /// `POST /v1/nodes/{name}/jobs`: a node's ranks of a multi-node job; sampling starts when
    /// every rank of the job has joined and every node's ranks have attached.
    pub async fn join(
        &self,
        registry: &Registry,
        node: &str,
        req: NodeJob,
    ) -> Result<NodeJobAccepted> {
        let mut identity = req.job.identity();
        identity.local_world_size = None;
        let world = identity.world_size.unwrap_or(1);
        let index = joined_index(registry, node, &req, &identity, world)?;
        let remote = registry
            .dataset(&identity.dataset)
            .is_ok_and(|d| matches!(d.record.source, joader_storage::SourceSpec::S3 { .. }));
        let items = index.len() as u64;
        let order = job_order(index, &identity, None).await?;
        let (id, restored) = self.join_locked(node, &req, &identity, order, (remote, items))?;
        tracing::info!(job = %identity.name, node, ranks = ?req.ranks, "node joined a multi-node job");
        if restored {
            self.rebuild_or_fail(registry, id).await?;
        }
        Ok(NodeJobAccepted { job: id })
    }

    /// The join under the lock: the job (new, or this node's ranks added to it), journaled,
    /// started if complete. Returns its id, and whether it waited after a restart for this
    /// node only (it is rebuilt then).
    fn join_locked(
        &self,
        node: &str,
        req: &NodeJob,
        identity: &JobRequest,
        (subset, resume): (RoaringBitmap, Option<(u32, Arc<RoaringBitmap>)>),
        (remote, items): (bool, u64),
    ) -> Result<(u64, bool)> {
        let world = identity.world_size.unwrap_or(1);
        let mut inner = lock(self)?;
        Self::node_mut(&mut inner, node)?;
        // A node registers a job's name again only once its own copy of that job has failed or
        // finished (its registry takes a name over from nothing else): ranks resuming from a
        // checkpoint may do so before the leader has heard of the end. The old job is over.
        if let Some(&old) = inner.names.get(&identity.name)
            && inner
                .jobs
                .get(&old)
                .is_some_and(|j| j.placer.is_some() && j.nodes.contains_key(node))
        {
            inner.fail(
                old,
                &format!("node {node} registered job '{}' again", identity.name),
            );
        }
        let id = match inner.names.get(&identity.name).copied() {
            Some(id) => {
                inner.add_ranks(id, node, &req.ranks, identity)?;
                id
            }
            None => inner.add_job(node, &req.ranks, identity, world, subset, resume),
        };
        let mut restored = false;
        if let Some(j) = inner.jobs.get_mut(&id) {
            j.remote = remote;
            if j.items == 0 {
                j.items = items;
            }
            // A node that joins a job restoring after a restart has nothing of it to report.
            restored = j.joined_while_restoring(node);
        }
        // In the journal before the node hears of the job: a leader that restarts takes it back.
        inner.journal(id);
        self.start_if_complete(&mut inner, id)?;
        Ok((id, restored))
    }

    /// Once every rank has joined and attached: the placer over the job's nodes, and the job in its
    /// dataset's cluster Sampler.
    pub(super) fn start_if_complete(&self, inner: &mut Inner, id: u64) -> Result<()> {
        let (arbiter, dispatch) = self.started()?;
        let Some(job) = inner.jobs.get(&id) else {
            return Ok(());
        };
        let joined: u32 = job.nodes.values().map(|r| r.len() as u32).sum();
        if joined < job.world
            || job.attached.len() < job.nodes.len()
            || job.placer.is_some()
            || job.restoring.is_some()
            || !job.live()
        {
            return Ok(());
        }
        let sampler = self.sampler_of(inner, id, arbiter, dispatch)?;
        let job = inner
            .jobs
            .get_mut(&id)
            .ok_or_else(|| Error::internal("lost job"))?;
        job.placer = Some(job.placer(true));
        let resume = job.resume.clone();
        add_to_sampler(job, &sampler, resume);
        inner.journal(id);
        Ok(())
    }

    /// The cluster Sampler of job `id`'s dataset (started on the first job of the dataset).
    pub(super) fn sampler_of(
        &self,
        inner: &mut Inner,
        id: u64,
        arbiter: actix::ArbiterHandle,
        dispatch: actix::Addr<super::Dispatch>,
    ) -> Result<actix::Addr<SamplerActor>> {
        let job = inner
            .jobs
            .get(&id)
            .ok_or_else(|| Error::internal("lost job"))?;
        let dataset = job.dataset.clone();
        // An object-store dataset's Sampler samples its jobs ahead by the nodes' fetch time
        // and sends its picks to fetch ahead to the nodes (see `dispatch`).
        let clock = job
            .remote
            .then(|| super::fetch_clock(&self.fetch_ms, &dataset));
        Ok(inner
            .samplers
            .entry(dataset)
            .or_insert_with(|| {
                let tick = self.tick;
                let stats = Arc::new(::actors::CacheStats::default());
                SamplerActor::start_in_arbiter(&arbiter, move |_| {
                    let s = SamplerActor::new(0, dispatch.recipient(), tick, stats);
                    match clock {
                        Some(clock) => s.with_fetch_clock(clock),
                        None => s,
                    }
                })
            })
            .clone())
    }

    /// The leader's arbiter (where its Samplers run) and dispatcher, once started.
    pub(super) fn started(&self) -> Result<(actix::ArbiterHandle, actix::Addr<super::Dispatch>)> {
        let arbiter = self
            .arbiter
            .lock()
            .map_err(Error::internal)?
            .clone()
            .ok_or_else(|| Error::internal("the leader is not started"))?;
        let dispatch = self
            .dispatch
            .lock()
            .map_err(Error::internal)?
            .clone()
            .ok_or_else(|| Error::internal("the dispatcher is not running"))?;
        Ok((arbiter, dispatch))
    }
}

/// Adds the job, its placer set, to its dataset's cluster Sampler with the credit its nodes
/// returned so far, from `resume` (an epoch and what is left of it) or from its start.
pub(super) fn add_to_sampler(
    job: &mut ClusterJob,
    sampler: &actix::Addr<SamplerActor>,
    resume: Option<(u32, Arc<RoaringBitmap>)>,
) {
    sampler.do_send(AddJob {
        job: job.id,
        subset: job.subset.clone(),
        seed: job.request.seed,
        epochs: job.request.epochs,
        sampler: job.request.sampler.unwrap_or(SamplerKind::Dsa),
        credit: job.pending_credit.min(u64::from(u32::MAX)) as u32,
        // No placement ahead of credit across the network: a node's credit is what its
        // rings can take (the pace joins of one server need its Cache's queue). An
        // object-store dataset's picks beyond it are held here, their nodes told to fetch
        // them ahead (`with_fetch_clock`).
        step: 0,
        stats: Arc::new(JobStats::default()),
        resume,
        replay: None,
        record: None,
    });
    job.pending_credit = 0;
    job.sampler = Some(sampler.clone());
    tracing::info!(job = %job.name, nodes = job.nodes.len(), world = job.world, "multi-node job sampling");
}

/// The leader's index of the job's dataset, once the node's request is checked against it:
/// the dataset ready here, indexed with as many items on the node, the ranks in the world.
fn joined_index(
    registry: &Registry,
    node: &str,
    req: &NodeJob,
    identity: &JobRequest,
    world: u32,
) -> Result<Arc<DatasetIndex>> {
    let d = registry.dataset(&identity.dataset)?;
    let index = d.index.clone().ok_or_else(|| {
        Error::new(
            Code::DatasetNotReady,
            format!(
                "dataset '{}' is {} on the leader",
                identity.dataset, d.record.state
            ),
        )
    })?;
    let ready_len = index.len() as u64;
    if req.items != ready_len {
        return Err(Error::new(
            Code::NodeMismatch,
            format!(
                "node {node} indexed {} items of dataset '{}' and the leader {ready_len}: \
                 every node must read the same source",
                req.items, identity.dataset
            ),
        ));
    }
    if req.ranks.is_empty() || req.ranks.iter().any(|&r| r >= world) {
        return Err(Error::new(
            Code::InvalidRequest,
            format!("ranks {:?} must be some of 0..{world}", req.ranks),
        ));
    }
    Ok(index)
}

/// The job's subset, and for a resumed job the rest of its epoch (whole-index work: on the
/// blocking pool).
pub(super) async fn job_order(
    index: Arc<DatasetIndex>,
    identity: &JobRequest,
    items: Option<u64>,
) -> Result<(RoaringBitmap, Option<(u32, Arc<RoaringBitmap>)>)> {
    let (spec, resume, epochs) = (
        identity.subset.clone(),
        identity.resume.clone(),
        identity.epochs,
    );
    actix_web::rt::task::spawn_blocking(move || {
        // A restored job keeps the items it joined with (a dataset appended to since then
        // grows no multi-node job).
        let len = items.map_or(index.len(), |n| (n as usize).min(index.len())) as u32;
        let subset = match &spec {
            None => (0..len).collect::<RoaringBitmap>(),
            Some(s) => s.resolve(len, |e| index.label(e).unwrap_or(-1), index.classes())?,
        };
        let resume = match &resume {
            Some(r) => {
                let (epoch, rest) = r.start(&subset, epochs)?;
                Some((epoch, Arc::new(rest)))
            }
            None => None,
        };
        Ok::<_, Error>((subset, resume))
    })
    .await
    .map_err(Error::internal)?
}

impl Inner {
    /// Node `node`'s ranks joining job `id`, which other nodes' ranks registered: the same
    /// parameters, ranks no other node serves, before the job started.
    fn add_ranks(
        &mut self,
        id: u64,
        node: &str,
        ranks: &[u32],
        identity: &JobRequest,
    ) -> Result<()> {
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| Error::internal("lost job"))?;
        if job.request != *identity {
            return Err(Error::new(
                Code::JobExists,
                format!(
                    "multi-node job '{}' runs with other parameters: every rank must \
                     send the same ones",
                    identity.name
                ),
            ));
        }
        let taken: Vec<u32> = job
            .nodes
            .iter()
            .filter(|(n, _)| n.as_str() != node)
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        if job.placer.is_some() || ranks.iter().any(|r| taken.contains(r)) {
            return Err(Error::new(
                Code::NodeMismatch,
                format!(
                    "ranks {:?} of job '{}' are already served by another node",
                    ranks, identity.name
                ),
            ));
        }
        job.nodes.insert(node.to_string(), ranks.to_vec());
        Ok(())
    }

    /// A new multi-node job with node `node`'s ranks; returns its id.
    fn add_job(
        &mut self,
        node: &str,
        ranks: &[u32],
        identity: &JobRequest,
        world: u32,
        subset: RoaringBitmap,
        resume: Option<(u32, Arc<RoaringBitmap>)>,
    ) -> u64 {
        // Ids do not repeat across the leader's restarts (they start at the first
        // job's time in s × 2^20, below 2^53 for JSON readers), so a node's job the
        // leader does not know is one it forgot.
        if self.next_id == 0 {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs());
            self.next_id = secs << 20;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.names.insert(identity.name.clone(), id);
        let mut job = ClusterJob::new(&identity.name, identity, world);
        job.nodes = BTreeMap::from([(node.to_string(), ranks.to_vec())]);
        job.subset = Arc::new(subset);
        job.resume = resume;
        job.id = id;
        self.jobs.insert(id, job);
        id
    }
}

//! Registering a job: [`register_job`] reads as its phases, each a function below. The
//! request is checked, the job's name reserved (another rank of a running job stops there),
//! the dataset and the job's order (subset, replay, resume) resolved, the job opened in the
//! Cache (its rings), then handed to what samples it: its dataset's Sampler, or for a
//! multi-node job the leader, through this node's agent.

use std::sync::Arc;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Recipient};
use actors::{
    AddJob, CloseJob, DatasetId, ElementSource, JobId, JobSignal, JobStats, OpenJob, OpenJobError,
    PipelineId, RemoveJob, RingInfo, SamplerActor,
};
use joader_core::sampling::SamplerKind;
use joader_pipeline::{Limits, Pipeline};
use joader_storage::DatasetIndex;
use roaring::RoaringBitmap;

use super::limits::{batch_fits, ring_capacity};
use super::request::{JobRequest, Ranks, ResumeState};
use super::reserve::{Reserved, reserve};
use crate::error::{Code, Error, Result};
use crate::loading::PipelinePrepare;
use crate::registry::{ClusterNode, JobEntry, LocalJob, Registry, check_name, check_not_draining};

/// Registers a job, or returns the running job this request is another rank of. Returns
/// `view` of the job's entry and whether the job was created.
pub async fn register_job<T>(
    registry: &Registry,
    req: JobRequest,
    view: impl Fn(&Registry, &JobEntry) -> T,
) -> Result<(T, bool)> {
    check_name("job", &req.name)?;
    check_not_draining(registry)?;
    let ranks = req.validate()?;
    let node = ranks.multi.then(|| cluster_node(registry)).transpose()?;
    let capacity = ring_capacity(&registry.config, &req)?;
    // (A dataset that does not exist is refused once resolved, below.)
    let has_image = registry
        .dataset(&req.dataset)
        .map_or(true, |d| d.record.source.has_image());
    let pipeline = req.pipeline(&registry.config, has_image)?;
    batch_fits(&registry.config, &pipeline, req.batch_size)?;

    let _reservation = match reserve(registry, &req, &view).await? {
        Reserved::Rank(body) => return Ok((body, false)),
        Reserved::Name(reservation) => reservation,
    };
    let dataset = resolve_dataset(registry, &req.dataset, &pipeline)?;
    req.validate_order(&ranks)?;
    let order = resolve_order(registry, &req, dataset.index.clone()).await?;
    let job = NewJob {
        stats: Arc::new(JobStats::default()),
        id: new_job_id(registry)?,
        dataset,
        order,
        pipeline,
    };
    let signals = match node {
        Some(node) => node.signals(),
        None => job.dataset.sampler.clone().recipient(),
    };
    let mut rings = open_job(
        registry,
        &req,
        &job,
        (ranks.local, !ranks.multi),
        capacity,
        signals,
    )
    .await?;
    let remover = match node {
        Some(node) => join_cluster(registry, node, &req, &job, ranks, &mut rings).await?,
        None => job.dataset.sampler.clone().recipient(),
    };
    let record = start_recording(registry, &req, &job, ranks.world).await?;
    if node.is_none() {
        add_to_sampler(registry, &req, &job, ranks.world, record).await?;
    }
    let (id, items, sampler) = (job.id, job.dataset.index.len(), job.dataset.sampler.clone());
    let entry = job.entry(&req, ranks, rings, remover);
    let follows = entry.grows;
    let body = view(registry, &entry);
    let entry = Arc::new(entry);
    registry
        .inner
        .lock()
        .map_err(Error::internal)?
        .jobs
        .insert(req.name.clone(), entry.clone());
    if follows && node.is_none() {
        catch_up(registry, &req.dataset, (id, items), &entry, &sampler).await;
    }
    tracing::info!(job = %req.name, dataset = %req.dataset, world = ranks.world,
        local_ranks = ranks.local, multi = ranks.multi, capacity, "job registered");
    Ok((body, true))
}

/// Whether the job follows its dataset as it grows by appends: its subset is the whole
/// dataset (no `subset`, no `replay`) and it has one rank. A job of several ranks keeps the
/// dataset it registered with: its clients size each rank's even share once, at
/// registration.
fn grows(req: &JobRequest, ranks: Ranks) -> bool {
    req.subset.is_none() && req.replay.is_none() && ranks.world == 1 && !ranks.multi
}

/// A job that follows its dataset and resolved it before an append that ran while it
/// registered (the append told the jobs it found, and this one was not among them yet): grows
/// it by what was appended since `items`. Telling a job twice grows it once.
async fn catch_up(
    registry: &Registry,
    dataset: &str,
    (id, items): (JobId, usize),
    entry: &JobEntry,
    sampler: &Addr<SamplerActor>,
) {
    let now = registry
        .dataset(dataset)
        .ok()
        .and_then(|d| d.index.map(|i| i.len()))
        .unwrap_or(items);
    if now > items {
        let added: RoaringBitmap = (items as u32..now as u32).collect();
        entry
            .subset_len
            .store(now as u64, std::sync::atomic::Ordering::Relaxed);
        let grown = sampler.send(actors::GrowJob {
            job: id,
            added: Arc::new(added),
        });
        if let Ok(Err(e)) = grown.await {
            tracing::debug!(job = id, error = %e, "a job did not grow (it ended)");
        }
    }
}

/// What the registration resolved of a new job, for its later phases.
struct NewJob {
    id: JobId,
    dataset: Dataset,
    order: Order,
    pipeline: Pipeline,
    stats: Arc<JobStats>,
}

impl NewJob {
    /// The registry's entry of the job, which `remover` removes.
    fn entry(
        self,
        req: &JobRequest,
        ranks: Ranks,
        rings: Vec<RingInfo>,
        remover: Recipient<RemoveJob>,
    ) -> JobEntry {
        JobEntry {
            id: self.id,
            name: req.name.clone(),
            dataset: req.dataset.clone(),
            subset_len: self.order.subset.len().into(),
            grows: grows(req, ranks),
            pipeline: self.pipeline,
            request: req.identity(),
            stats: self.stats,
            rings,
            sampler: remover,
            created: Instant::now(),
            fingerprint: self.order.fingerprint,
            rate: Default::default(),
            ended_at: Default::default(),
        }
    }
}

/// The job's dataset as the Cache and the Sampler need it.
struct Dataset {
    id: DatasetId,
    index: Arc<DatasetIndex>,
    source: Arc<dyn ElementSource>,
    /// The dataset's Sampler (started with its first job).
    sampler: Addr<SamplerActor>,
    /// The job's pipeline, interned.
    pipeline: PipelineId,
}

/// Which elements the job receives, and in which order.
struct Order {
    subset: Arc<RoaringBitmap>,
    /// A recorded order to receive every epoch.
    replay: Option<Arc<[u32]>>,
    /// The epoch a resumed job continues, and what remains of it.
    resume: Option<(u32, Arc<RoaringBitmap>)>,
    /// The dataset's fingerprint (`DatasetIndex::fingerprint` of all its items).
    fingerprint: String,
}

/// This node's agent, which serves the ranks of a multi-node job here.
fn cluster_node(registry: &Registry) -> Result<&dyn ClusterNode> {
    registry.node.get().map(|n| n.as_ref()).ok_or_else(|| {
        Error::new(
            Code::InvalidRequest,
            "this leader serves no ranks (--leader-only): register multi-node ranks with \
             the follower on their node",
        )
    })
}

/// The job's dataset: ready, with its element source, and its Sampler (started if it has
/// none); the job's pipeline is interned on the way.
fn resolve_dataset(registry: &Registry, name: &str, pipeline: &Pipeline) -> Result<Dataset> {
    let mut inner = registry.inner.lock().map_err(Error::internal)?;
    let pipeline = inner.pipeline_id(pipeline)?;
    let (d, index, source) = inner.open_source(name)?;
    let sampler = d
        .sampler
        .get_or_insert_with(|| {
            let (id, cache, stats) = (d.id, registry.cache.clone(), registry.stats.clone());
            let tick = Duration::from_millis(registry.config.sampler_tick_ms);
            let window = Duration::from_millis(registry.config.start_window_ms);
            // A dataset read from an object store has its picks' bytes fetched ahead.
            let source = source.clone();
            SamplerActor::start_in_arbiter(&registry.samplers, move |_| {
                SamplerActor::new(id, cache.recipient(), tick, stats)
                    .with_start_window(window)
                    .with_fetch_ahead(source)
            })
        })
        .clone();
    Ok(Dataset {
        id: d.id,
        index,
        source,
        sampler,
        pipeline,
    })
}

/// The job's subset (or the recorded order it replays) and where it resumes. Whole-index
/// work (a fraction of 1.28 M ids takes milliseconds) and a recorded order read from disk:
/// on the blocking pool, not on this HTTP worker.
async fn resolve_order(
    registry: &Registry,
    req: &JobRequest,
    index: Arc<DatasetIndex>,
) -> Result<Order> {
    let spec = req.subset.clone();
    let (replay, data_dir) = (req.replay.clone(), registry.config.data_dir.clone());
    let whole = index.clone();
    let (subset, replay) = actix_web::rt::task::spawn_blocking(move || {
        let len = index.len() as u32;
        if let Some(r) = &replay {
            let order = r.order(&data_dir, len)?;
            return Ok((order.iter().copied().collect(), Some(Arc::from(order))));
        }
        crate::registry::subset::ids_of(spec.as_ref(), &index).map(|s| (s, None))
    })
    .await
    .map_err(Error::internal)??;
    if subset.is_empty() {
        return Err(Error::new(
            Code::EmptySubset,
            "the subset selects no element of the dataset",
        ));
    }
    let (subset_c, epochs, resume, dataset) = (
        subset.clone(),
        req.epochs,
        req.resume.clone(),
        req.dataset.clone(),
    );
    let (resume, fingerprint) = actix_web::rt::task::spawn_blocking(move || {
        let index = whole;
        let fingerprint = index
            .fingerprint(index.len())
            .ok_or_else(|| Error::internal("an index without its items"))?;
        let resume = match resume {
            Some(r) => {
                check_fingerprint(&r, &index, &dataset, &fingerprint)?;
                let (epoch, remaining) = r.start(&subset_c, epochs)?;
                Some((epoch, Arc::new(remaining)))
            }
            None => None,
        };
        Ok::<_, Error>((resume, fingerprint))
    })
    .await
    .map_err(Error::internal)??;
    Ok(Order {
        subset: Arc::new(subset),
        replay,
        resume,
        fingerprint,
    })
}

/// Refuses a resume state saved on another version of the dataset, unless it allows it.
fn check_fingerprint(
    r: &ResumeState,
    index: &DatasetIndex,
    dataset: &str,
    now: &str,
) -> Result<()> {
    match &r.dataset_fingerprint {
        // An unchanged dataset (the usual case) needs no second pass over its index.
        Some(saved)
            if !r.allow_changed_dataset && saved != now && !index.fingerprint_matches(saved) =>
        {
            Err(Error::new(
                Code::DatasetChanged,
                format!(
                    "the resume state was saved on dataset '{dataset}' as fingerprint {saved} \
                     (items:hash); it is now {now}, and its first items differ: resume with \
                     allow_changed_dataset to compute the rest of the epoch on the new index"
                ),
            ))
        }
        _ => Ok(()),
    }
}

fn new_job_id(registry: &Registry) -> Result<JobId> {
    let mut inner = registry.inner.lock().map_err(Error::internal)?;
    inner.next_job_id += 1;
    Ok(inner.next_job_id)
}

/// Opens the job in the Cache: a ring of `capacity` records for each of its `ranks` on this
/// server (`own_positions`: every rank of the job is here, see `OpenJob`). `signals` is what the Cache returns the job's credit to (its Sampler, or this
/// node's agent).
async fn open_job(
    registry: &Registry,
    req: &JobRequest,
    job: &NewJob,
    (ranks, own_positions): (u32, bool),
    capacity: u32,
    signals: Recipient<JobSignal>,
) -> Result<Vec<RingInfo>> {
    let prepare = Arc::new(PipelinePrepare {
        pipeline: job.pipeline.clone(),
        limits: Limits {
            max_pixels: registry.config.max_pixels,
        },
    });
    registry
        .cache
        .send(OpenJob {
            job: job.id,
            dataset: job.dataset.id,
            source: job.dataset.source.clone(),
            pipeline: job.dataset.pipeline,
            prepare,
            subset: job.order.subset.clone(),
            ring_prefix: req.name.clone(),
            ranks,
            capacity,
            batch: req.batch_size,
            stats: job.stats.clone(),
            sampler: signals,
            resume: job
                .order
                .resume
                .as_ref()
                .map(|(_, remaining)| remaining.clone()),
            own_positions,
        })
        .await
        .map_err(Error::internal)?
        .map_err(|e| match e {
            OpenJobError::AlreadyOpen(_) | OpenJobError::Empty => Error::internal(e),
            OpenJobError::ShutDown => Error::new(Code::ShuttingDown, e.to_string()),
            // Out of reader indices or shared memory for a ring: transient, jobs end.
            OpenJobError::Ring { .. } => Error::new(Code::CacheFull, e.to_string()),
        })
}

/// A multi-node job: its rings are this node's block of global ranks, which the leader is
/// told; this node's agent then serves them, and is what removes the job.
async fn join_cluster(
    registry: &Registry,
    node: &dyn ClusterNode,
    req: &JobRequest,
    job: &NewJob,
    ranks: Ranks,
    rings: &mut [RingInfo],
) -> Result<Recipient<RemoveJob>> {
    for r in rings.iter_mut() {
        r.rank += ranks.first;
    }
    let items = {
        let inner = registry.inner.lock().map_err(Error::internal)?;
        inner
            .datasets
            .get(&req.dataset)
            .and_then(|d| d.index.as_ref())
            .map_or(0, |i| i.len() as u64)
    };
    let local = LocalJob {
        job: job.id,
        dataset: job.dataset.id,
        stats: job.stats.clone(),
    };
    let own = (ranks.first..ranks.first + ranks.local).collect();
    let joined = node
        .join(&registry.config, req.identity(), own, items, local)
        .await?;
    if let Err(e) = joined {
        registry.cache.do_send(CloseJob { job: job.id });
        return Err(e);
    }
    Ok(node.remover())
}

/// With `record`, the thread that writes the job's deliveries to the data dir (started on
/// the blocking pool: it empties the job's folder first).
async fn start_recording(
    registry: &Registry,
    req: &JobRequest,
    job: &NewJob,
    world: u32,
) -> Result<Option<SyncSender<Vec<[u32; 3]>>>> {
    if !req.record {
        return Ok(None);
    }
    let dir = crate::registry::record::dir(&registry.config.data_dir, &req.name);
    match actix_web::rt::task::spawn_blocking(move || crate::registry::record::start(dir, world))
        .await
        .map_err(Error::internal)?
    {
        Ok(tx) => Ok(Some(tx)),
        Err(e) => {
            registry.cache.do_send(CloseJob { job: job.id });
            Err(Error::internal(e))
        }
    }
}

/// A job on this server alone joins its dataset's Sampler.
async fn add_to_sampler(
    registry: &Registry,
    req: &JobRequest,
    job: &NewJob,
    world: u32,
    record: Option<SyncSender<Vec<[u32; 3]>>>,
) -> Result<()> {
    let added = job
        .dataset
        .sampler
        .send(AddJob {
            job: job.id,
            subset: job.order.subset.clone(),
            seed: req.seed,
            epochs: req.epochs,
            sampler: req.sampler.unwrap_or(SamplerKind::Dsa),
            // The Cache grants the rings' capacity when every rank's client has attached.
            credit: 0,
            step: req.batch_size * world,
            stats: job.stats.clone(),
            resume: job.order.resume.clone(),
            replay: job.order.replay.clone(),
            record,
        })
        .await
        .map_err(Error::internal)?;
    if let Err(e) = added {
        registry.cache.do_send(CloseJob { job: job.id });
        return Err(Error::internal(e));
    }
    Ok(())
}

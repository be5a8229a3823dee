//! The joader daemon (`joader serve`): the server (`run`), its REST API, catalog, registry,
//! cluster and metrics. The tools that drive it (benchmarks, demo, simulator, debugging client)
//! live in `joader-tools` (`server/tools`), which builds the `joader` binary.
#![forbid(unsafe_code)]
// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

pub mod catalog;
pub mod cluster;
pub mod config;
pub mod error;
pub mod http;
pub mod loading;
pub mod metrics;
pub mod procstat;
pub mod registry;
pub mod serve;
pub mod stages;
pub mod state;

use std::future::Future;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext};
use actix_web::{App, HttpServer, web};
use actors::{CacheActor, CacheConfig, CacheStats, Loader, Shutdown};
use anyhow::{Context, Result};
use dataplane::{SegmentConfig, Writer};
use utoipa_actix_web::AppExt;

pub use config::Config;
use registry::Registry;
use state::AppState;

/// Loads under way at most on a server that reads object stores, where some loads wait for a
/// GET (those whose bytes were not fetched ahead), when `s3_max_in_flight` is above it.
const S3_LOADS: usize = 64;

/// Runs the server on `listener` until `shutdown` completes (or SIGINT/SIGTERM), then removes
/// its shared-memory segments. Must be called inside an actix system
/// (`actix_web::rt::System::new().block_on(run(...))`).
///
/// Its steps: the shared-memory segment, the object stores, the actors, the registry (with
/// the catalog's datasets), the cluster, the HTTP server, then the housekeeping and the
/// drain on a stop signal.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + 'static,
) -> Result<()> {
    config.validate()?;
    // Before any dataset is opened: the readers of parquet datasets take these.
    config.parquet_budgets().set();
    let spill = config.parquet_spill();
    match joader_storage::reset_spill_dir(&spill.dir) {
        Ok(()) => {
            tracing::info!(dir = %spill.dir.display(), bytes = spill.bytes, "parquet spill");
            spill.set();
        }
        Err(e) => tracing::warn!(dir = %spill.dir.display(), error = %e,
            "parquet spill: the folder cannot be made; zstd and gzip groups are decoded again for each row read"),
    }
    let catalog = catalog::Catalog::open(&config.data_dir)?;
    let writer = open_segment(&config)?;
    let objects = object_stores(&config)?;
    let stats = Arc::new(CacheStats::default());
    let cache = start_cache(&config, writer, stats.clone(), objects.is_some());
    let samplers = actix::Arbiter::new();
    let addr = listener.local_addr()?;
    let own_url = own_url(&config, addr);
    let registry = Arc::new(Registry::new(
        config.clone(),
        catalog,
        cache.clone(),
        samplers.handle(),
        stats,
        objects,
    ));
    let state = Arc::new(AppState {
        registry: registry.clone(),
        leader: match config.leader {
            None => Some(cluster::leader::Leader::new(
                &config,
                registry.catalog().clone(),
            )?),
            Some(_) => None,
        },
        leader_url: Some(
            config
                .leader
                .clone()
                .unwrap_or_else(|| own_url.clone())
                .trim_end_matches('/')
                .to_string(),
        ),
    });
    registry::load_catalog(&registry)?;
    registry::preload::restore(&registry);
    start_cluster(&state, own_url);
    // The recorder lives beside the registry (it reads the registry, never the reverse).
    let recorder = Arc::new(metrics::Metrics::new());
    let server = http_server(&config, &state, &recorder, listener)?;
    tracing::info!(%addr, instance = %config.instance, "joader is serving");
    spawn_housekeeping(state, recorder);
    let handle = server.handle();
    let grace = Duration::from_secs(config.drain_grace_s);
    actix_web::rt::spawn(async move {
        if stop_requested(shutdown).await {
            drain(&registry, grace).await;
        }
        handle.stop(true).await;
    });
    let result = server.await;
    cache.send(Shutdown).await.ok();
    samplers.stop();
    // The arbiter's thread ends once its samplers have stopped (no blocking join here: this
    // runs on the system's thread).
    tracing::info!("joader stopped; shared memory removed");
    result.context("the HTTP server failed")
}

/// Creates the instance's shared-memory segment (removing a previous run's stale ones).
fn open_segment(config: &Config) -> Result<Writer> {
    let mut seg = SegmentConfig::new(
        config.instance.clone(),
        config.cache_slots,
        config.cache_bytes,
    );
    seg.reserve = true;
    seg.access = dataplane::Access {
        mode: config.shm_mode,
        gid: config.shm_gid,
    };
    let writer = Writer::create(&seg).with_context(|| {
        format!(
            "cannot create the shared-memory cache of instance '{}'",
            config.instance
        )
    })?;
    for stale in writer.stale_removed() {
        tracing::warn!(segment = %stale, "removed a stale segment of a previous run");
    }
    Ok(writer)
}

/// The object-store stage, which runs only on a server that may read object stores
/// (`--allowed-s3`), with its disk tier when `disk_cache` is set.
fn object_stores(config: &Config) -> Result<Option<Arc<joader_storage::s3::ObjectStores>>> {
    if config.allowed_s3.is_empty() {
        if let Some(dir) = &config.disk_cache {
            tracing::warn!(dir = %dir.display(), "disk_cache is unused: it holds what object stores send, and this server reads none (--allowed-s3)");
        }
        return Ok(None);
    }
    let allow =
        joader_storage::s3::S3Allow::parse(&config.allowed_s3, &config.allowed_s3_endpoints)
            .map_err(|e| anyhow::anyhow!("allowed_s3 / allowed_s3_endpoints: {e}"))?
            .with_environment();
    let tier = match &config.disk_cache {
        Some(dir) => {
            let tier = joader_storage::tier::DiskTier::open(dir, config.disk_cache_bytes)?;
            tracing::info!(dir = %dir.display(), bytes = config.disk_cache_bytes, objects = tier.stats().objects.load(std::sync::atomic::Ordering::Relaxed), "disk cache opened");
            Some(Arc::new(tier))
        }
        None => None,
    };
    let stores = joader_storage::s3::ObjectStores::new(config.fetch_config(), allow, tier)
        .context("cannot start the object-store stage")?;
    Ok(Some(Arc::new(stores)))
}

/// Starts the Cache actor and its Loader. On a server that reads object stores, loads wait
/// on the network, so the Cache lets as many be under way as requests may be in flight
/// (decoded payloads outside shared memory stay bounded by that number).
fn start_cache(
    config: &Config,
    writer: Writer,
    stats: Arc<CacheStats>,
    reads_objects: bool,
) -> actix::Addr<CacheActor> {
    let mut max_loading = CacheConfig::max_loading_for(config.loader_workers);
    if reads_objects {
        // Loads whose bytes were not fetched ahead wait a GET each: enough of them to keep
        // the decode threads busy, without letting decoded payloads outside shared memory
        // grow with the request limit.
        max_loading = max_loading.max(config.s3_max_in_flight.min(S3_LOADS));
    }
    let cache_cfg = CacheConfig {
        policy: config.cache_policy,
        tick: Duration::from_millis(config.cache_tick_ms),
        max_loading,
    };
    let workers = config.loader_workers;
    // The Loader's threads hold the segment weakly: they write loaded elements straight into
    // slots while the Cache keeps room for them, and never keep the segment past the Cache.
    let writer = Arc::new(writer);
    CacheActor::create(move |ctx| {
        let slots = Arc::downgrade(&writer);
        let loader =
            Loader::placing(workers, ctx.address().recipient(), stats.clone(), slots).start();
        CacheActor::new(writer, &cache_cfg, loader.recipient(), stats)
    })
}

/// How the leader and the followers reach this server: `advertise`, else the address it
/// listens on (loopback for an unspecified one).
fn own_url(config: &Config, addr: std::net::SocketAddr) -> String {
    config.advertise.clone().unwrap_or_else(|| {
        let ip = if addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
    })
}

/// Starts the leader's placement (on a leader) and this node's agent (on every server but a
/// `--leader-only` leader).
fn start_cluster(state: &AppState, own_url: String) {
    let registry = &state.registry;
    if let Some(l) = &state.leader {
        l.start(registry.samplers().clone());
    }
    if !registry.config().leader_only {
        let leader_url = state.leader_url.clone().unwrap_or_default();
        let agent = cluster::node::NodeAgent::new(registry, leader_url.clone(), own_url).start();
        registry.set_node(Box::new(cluster::node::AgentHandle::new(agent, leader_url)));
    }
}

/// The HTTP server on `listener`: the routes, behind the bearer token and the request
/// metrics.
fn http_server(
    config: &Config,
    state: &Arc<AppState>,
    recorder: &Arc<metrics::Metrics>,
    listener: TcpListener,
) -> Result<actix_web::dev::Server> {
    let data = web::Data::from(state.clone());
    let metrics_data = web::Data::from(recorder.clone());
    let token = http::auth::BearerToken::new(config.token.as_deref());
    let recorder = recorder.clone();
    let server = HttpServer::new(move || {
        let token = token.clone();
        let recorder = recorder.clone();
        App::new()
            .app_data(data.clone())
            .app_data(metrics_data.clone())
            .wrap_fn(move |req, srv| token.check(req, srv))
            // Outermost, so that refused requests are counted too.
            .wrap_fn(move |req, srv| recorder.observe(req, srv))
            .into_utoipa_app()
            .configure(http::configure)
            .into_app()
            .default_service(web::to(http::unrouted))
    })
    .workers(config.http_workers)
    // Streams (the node streams) write small frames back to back: Nagle would hold them.
    .tcp_nodelay(true)
    // Signals are ours: SIGTERM drains (see `drain`), it does not cut running jobs off.
    .disable_signals()
    .listen(listener)?
    .run();
    Ok(server)
}

/// Every `HISTORY_INTERVAL`: the dashboard's sample, and the registry's housekeeping. Ends
/// with the actix system.
fn spawn_housekeeping(state: Arc<AppState>, recorder: Arc<metrics::Metrics>) {
    actix_web::rt::spawn(async move {
        let mut every = actix_web::rt::time::interval(metrics::HISTORY_INTERVAL);
        loop {
            every.tick().await;
            recorder.sample(&state);
            registry::housekeep(&state.registry);
        }
    });
}

/// Resolves when the server should stop: `true` for SIGTERM/SIGINT (drain first), `false`
/// when `shutdown` completed (the embedding program stops it: no drain).
async fn stop_requested(shutdown: impl Future<Output = ()>) -> bool {
    use actix_web::rt::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for SIGTERM/SIGINT; the server stops only when killed");
        shutdown.await;
        return false;
    };
    tokio::select! {
        _ = shutdown => false,
        _ = term.recv() => true,
        _ = int.recv() => true,
    }
}

/// SIGTERM: refuse new datasets and jobs (`503 shutting_down`), let running jobs go on for
/// up to `grace` (or until none is left), then stop; clients still reading then get
/// `server_gone` ("server shut down segment"), never a hang. A rolling upgrade gives running
/// jobs `grace` to finish.
async fn drain(registry: &Registry, grace: Duration) {
    registry.start_draining();
    let running = || registry.running_jobs();
    tracing::info!(
        running = running(),
        grace_s = grace.as_secs_f64(),
        "stop requested: draining (no new jobs; running jobs have the grace period to finish)"
    );
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && running() > 0 {
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    let left = running();
    if left > 0 {
        tracing::warn!(
            jobs = left,
            "grace period over: stopping with jobs still running"
        );
    }
}

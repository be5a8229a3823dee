//! The joader daemon (`joader serve`): the server (`run`), its REST API, catalog, registry,
//! cluster and metrics. The tools that drive it (benchmarks, demo, simulator, debugging client)
//! live in `joader-tools` (`server/tools`), which builds the `joader` binary.
#![forbid(unsafe_code)]

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
pub mod state;

use std::future::Future;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext};
use actix_web::{App, HttpServer, web};
use actors::service::{CacheActor, CacheConfig, CacheStats, Loader, Shutdown};
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
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + 'static,
) -> Result<()> {
    config.validate()?;
    let catalog = catalog::Catalog::open(&config.data_dir)?;
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
    let stats = Arc::new(CacheStats::default());
    // The object-store stage runs only on a server that may read object stores; its loads
    // wait on the network, so the Cache lets as many be under way as requests may be in
    // flight (decoded payloads outside shared memory stay bounded by that number).
    let objects = if config.allowed_s3.is_empty() {
        None
    } else {
        let allow =
            joader_storage::s3::S3Allow::parse(&config.allowed_s3, &config.allowed_s3_endpoints)
                .map_err(|e| anyhow::anyhow!("allowed_s3 / allowed_s3_endpoints: {e}"))?
                .with_environment();
        let tier = match &config.disk_cache {
            Some(dir) => {
                // Its writer thread's CPU is the object-store stage's.
                let tier = joader_storage::tier::DiskTier::open_with(
                    dir,
                    config.disk_cache_bytes,
                    || dataplane::stages::set_base(&dataplane::stages::server::FETCH),
                )?;
                tracing::info!(dir = %dir.display(), bytes = config.disk_cache_bytes, objects = tier.stats().objects.load(std::sync::atomic::Ordering::Relaxed), "disk cache opened");
                Some(Arc::new(tier))
            }
            None => None,
        };
        Some(Arc::new(
            joader_storage::s3::ObjectStores::new(config.fetch_config(), allow, tier, || {
                dataplane::stages::set_base(&dataplane::stages::server::FETCH)
            })
            .context("cannot start the object-store stage")?,
        ))
    };
    if objects.is_none()
        && let Some(dir) = &config.disk_cache
    {
        tracing::warn!(dir = %dir.display(), "disk_cache is unused: it holds what object stores send, and this server reads none (--allowed-s3)");
    }
    let mut max_loading = CacheConfig::max_loading_for(config.loader_workers);
    if objects.is_some() {
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
    let st = stats.clone();
    // The Loader's threads hold the segment weakly: they write loaded elements straight into
    // slots while the Cache keeps room for them, and never keep the segment past the Cache.
    let writer = std::sync::Arc::new(writer);
    let cache = CacheActor::create(move |ctx| {
        let slots = std::sync::Arc::downgrade(&writer);
        let loader = Loader::placing(workers, ctx.address().recipient(), st.clone(), slots).start();
        CacheActor::new(writer, &cache_cfg, loader.recipient(), st)
    });
    let samplers = actix::Arbiter::new();
    let addr = listener.local_addr()?;
    // How the leader and the followers reach this server.
    let own_url = config.advertise.clone().unwrap_or_else(|| {
        let ip = if addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
    });
    let leader = config
        .leader
        .is_none()
        .then(|| cluster::leader::Leader::new(&config));
    let registry = Arc::new(Registry {
        config: config.clone(),
        catalog: Arc::new(catalog),
        cache: cache.clone(),
        samplers: samplers.handle(),
        draining: Default::default(),
        stats,
        objects,
        inner: Mutex::new(registry::Inner::default()),
        started: Instant::now(),
        node: Default::default(),
    });
    let state = Arc::new(AppState {
        registry: registry.clone(),
        leader: leader.clone(),
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
    if let Some(l) = &leader {
        l.start(registry.samplers.clone());
    }
    if !config.leader_only {
        let leader_url = state.leader_url.clone().unwrap_or_default();
        let agent = cluster::node::NodeAgent::new(&registry, leader_url.clone(), own_url).start();
        let handle = cluster::node::AgentHandle::new(agent, leader_url);
        let _ = registry.node.set(Box::new(handle));
    }
    let data = web::Data::from(state.clone());
    let token = config.token.clone();
    // The recorder lives beside the registry (it reads the registry, never the reverse).
    let recorder = Arc::new(metrics::Metrics::new());
    let metrics_data = web::Data::from(recorder.clone());
    let sampler_metrics = recorder.clone();
    let server = HttpServer::new(move || {
        let token = token.clone();
        let recorder = recorder.clone();
        App::new()
            .app_data(data.clone())
            .app_data(metrics_data.clone())
            .wrap_fn(move |req, srv| {
                use actix_web::dev::Service;
                let denied = token.as_ref().is_some_and(|t| {
                    http::requires_token(req.path())
                        && req
                            .headers()
                            .get("authorization")
                            .and_then(|h| h.to_str().ok())
                            != Some(&format!("Bearer {t}"))
                });
                let fut = if denied { None } else { Some(srv.call(req)) };
                async move {
                    match fut {
                        Some(f) => f.await,
                        None => Err(error::Error::new(
                            error::Code::Unauthorized,
                            "a valid bearer token is required",
                        )
                        .into()),
                    }
                }
            })
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
    tracing::info!(%addr, instance = %config.instance, "joader is serving");
    let handle = server.handle();
    let sampled = state.clone();
    // Ends with the actix system.
    actix_web::rt::spawn(async move {
        let mut every = actix_web::rt::time::interval(metrics::HISTORY_INTERVAL);
        loop {
            every.tick().await;
            sampler_metrics.sample(&sampled);
            registry::housekeep(&sampled.registry);
        }
    });
    let draining = registry.clone();
    let grace = Duration::from_secs(config.drain_grace_s);
    actix_web::rt::spawn(async move {
        if stop_requested(shutdown).await {
            drain(&draining, grace).await;
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
    registry
        .draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let running = || {
        registry
            .inner
            .lock()
            .map_or(0, |i| i.jobs.values().filter(|j| !j.has_ended()).count())
    };
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

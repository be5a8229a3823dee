//! The command line of the `joader` binary.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use joader_core::cache::PolicyKind;
use joader_core::sampling::SamplerKind;

use crate::{Config, bench, demo, simulate};

#[derive(Debug, Parser)]
#[command(
    name = "joader",
    version,
    about = "Prepare training data once, serve it to many jobs through shared memory"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server: REST API, sampler, loader and shared-memory cache.
    Serve(Box<ServeArgs>),
    /// Generate an ImageNet-like dataset and run four jobs against an in-process server.
    Demo(demo::DemoArgs),
    /// Register a job with a running server and read it to the end (a debugging client; the
    /// integration tests run it as a separate process). Prints a JSON summary.
    Consume(ConsumeArgs),
    /// Generate a synthetic ImageNet-like ImageFolder dataset (JPEGs in class folders).
    GenDataset(GenDatasetArgs),
    /// Simulate samplers and cache policies on synthetic datasets and count cache misses.
    Simulate(SimulateArgs),
    /// Remove the shared memory a dead server of an instance left in /dev/shm (a server killed
    /// by SIGKILL or the OOM killer), without restarting it. Refused while a server runs it.
    Cleanup(CleanupArgs),
    /// Benchmarks that print measured figures and ratios.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Sampling tree: insertion time of large datasets and sampling throughput.
    Sampler(bench::sampler::SamplerBenchArgs),
    /// Shared memory: collate throughput against memcpy, push-to-wake latency.
    Dataplane,
    /// End to end: joader against independent loading (and PyTorch with --torch).
    E2e(bench::e2e::E2eArgs),
    /// Decode pipeline against Pillow on the same files, one core each.
    Decode(bench::decode::DecodeBenchArgs),
    /// An ImageNet-size manifest and 64 jobs on real `joader serve` processes: index time and
    /// memory, memory per job, idle CPU, and fast jobs beside slow, paused and idle ones.
    Scale(bench::scale::ScaleArgs),
    /// A leader and three followers as processes on this machine: decodes per epoch of
    /// multi-node jobs against the union of their subsets, jobs on different node sets against
    /// the placement rule, per-rank throughput against one standalone server, leader CPU.
    Cluster(bench::cluster::ClusterArgs),
}

/// Simulate samplers and cache policies.
///
/// Semantics of a round: a job registers at its start round and earns `speed` credits per
/// round; within a round, sub-rounds are sampled until no job holds a whole credit; in each
/// sub-round every job with a credit is active, spends it and receives one element (jobs
/// without credit are masked). Accesses are served in sampling order: the first access to an
/// element that is not cached is a miss and inserts it (the policy evicts when the cache is
/// full); later accesses while it is cached are hits, including the other jobs of a shared pick.
/// Misses lie between |D1 ∪ … ∪ Dn| and Σ|Di| per epoch.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct SimulateArgs {
    /// Run a preset instead of a scenario: `paper-a2` (the appendix's Table 1, cache sizes 1 to
    /// 10000, the series behind its Figures 4, 5 and 6).
    #[arg(long, value_parser = ["paper-a2"])]
    pub preset: Option<String>,
    /// Scenario file (TOML, or JSON when it ends in .json): `jobs = [{dataset = "range:0:100",
    /// start = 0, speed = 1.0, epochs = 1}]`, `samplers`, `policies`, `cache_sizes`, `seed`,
    /// `repetitions`, `lookahead`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A job: `DATASET[,start=ROUND][,speed=REQUESTS_PER_ROUND][,epochs=N]` where DATASET is
    /// `range:A:B` (ids A..B, B excluded), `sample:A:B:K` (K ids drawn from A..B) or
    /// `ids:1,2,3`. Repeat for several jobs.
    #[arg(long = "job")]
    pub jobs: Vec<String>,
    /// Samplers to compare.
    #[arg(long, value_delimiter = ',')]
    pub sampler: Vec<SamplerKind>,
    /// Cache policies to compare: refcnt, lru, fifo, random, clairvoyant.
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<PolicyKind>,
    /// Cache sizes, in elements.
    #[arg(long, value_delimiter = ',')]
    pub cache_sizes: Vec<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Repetitions to average over (`sample:` datasets are drawn again each time).
    #[arg(long)]
    pub repetitions: Option<u32>,
    /// Rounds the clairvoyant policy sees ahead.
    #[arg(long)]
    pub lookahead: Option<u64>,
    /// Print one JSON object per sampler × policy × cache size instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write every job's delivered order as JSON lines {"job","epoch","ids"} (plus the
    /// scenario, sampler and repetition) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

/// `joader serve`: settings come from defaults, then the TOML file, then `JOADER_*`
/// environment variables and flags.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file (keys as in `Config`: bind, data_dir, instance, cache_bytes, …).
    #[arg(long, env = "JOADER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the REST API (default 127.0.0.1:7480).
    #[arg(long, env = "JOADER_BIND")]
    pub bind: Option<std::net::SocketAddr>,
    /// Catalog directory (default ./joader-data).
    #[arg(long, env = "JOADER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Shared-memory instance name (default "default").
    #[arg(long, env = "JOADER_INSTANCE")]
    pub instance: Option<String>,
    /// Shared-memory cache size: bytes or a size such as 512MiB, 2GiB (default 1GiB).
    #[arg(long, env = "JOADER_CACHE_BYTES", value_parser = crate::config::parse_bytes)]
    pub cache_bytes: Option<u64>,
    /// Cache slots (default 16384).
    #[arg(long, env = "JOADER_CACHE_SLOTS")]
    pub cache_slots: Option<u32>,
    /// Cache policy: refcnt (default), lru, fifo, random, clairvoyant.
    #[arg(long, env = "JOADER_CACHE_POLICY")]
    pub cache_policy: Option<PolicyKind>,
    /// Decode threads (default: number of cores).
    #[arg(long, env = "JOADER_LOADER_WORKERS")]
    pub loader_workers: Option<usize>,
    /// Images with more pixels are refused from their header, before any decoding (reported
    /// as `image_too_large` elements; default 100000000).
    #[arg(long, env = "JOADER_MAX_PIXELS")]
    pub max_pixels: Option<u64>,
    /// Seconds running jobs get to finish after SIGTERM before the server stops (default 30).
    #[arg(long, env = "JOADER_DRAIN_GRACE_S")]
    pub drain_grace_s: Option<u64>,
    /// Milliseconds a job's first samples wait for other jobs of its dataset starting at about
    /// the same time, so that jobs launched together share from their first element (default
    /// 200; 0: no wait).
    #[arg(long, env = "JOADER_START_WINDOW_MS")]
    pub start_window_ms: Option<u64>,
    /// Ended jobs the API still lists (default 100); older ones are forgotten.
    #[arg(long, env = "JOADER_ENDED_JOBS_KEPT")]
    pub ended_jobs_kept: Option<usize>,
    /// Seconds after which an ended job is forgotten (default 86400).
    #[arg(long, env = "JOADER_ENDED_JOB_TTL_S")]
    pub ended_job_ttl_s: Option<u64>,
    /// Seconds a job name's counters and metric series outlive its last job (default 600;
    /// keep it above the scrape interval).
    #[arg(long, env = "JOADER_METRICS_RETENTION_S")]
    pub metrics_retention_s: Option<u64>,
    /// HTTP worker threads (default: number of cores, between 2 and 8).
    #[arg(long, env = "JOADER_HTTP_WORKERS")]
    pub http_workers: Option<usize>,
    /// Folders datasets may be read from (repeat; default: the current directory).
    #[arg(
        long = "allowed-root",
        env = "JOADER_ALLOWED_ROOTS",
        value_delimiter = ','
    )]
    pub allowed_roots: Vec<PathBuf>,
    /// S3 buckets or prefixes `s3` datasets may name, as `s3://bucket[/prefix]` (repeat;
    /// default: none, and `s3` sources are refused). Credentials come from the AWS_*
    /// environment variables.
    #[arg(long = "allowed-s3", env = "JOADER_ALLOWED_S3", value_delimiter = ',')]
    pub allowed_s3: Vec<String>,
    /// Endpoints `s3` datasets may name, besides AWS_ENDPOINT_URL (repeat): the server sends
    /// its signed requests, credentials included, there.
    #[arg(
        long = "allowed-s3-endpoint",
        env = "JOADER_ALLOWED_S3_ENDPOINTS",
        value_delimiter = ','
    )]
    pub allowed_s3_endpoints: Vec<String>,
    /// Object-store requests in flight at once (default 64).
    #[arg(long, env = "JOADER_S3_MAX_IN_FLIGHT")]
    pub s3_max_in_flight: Option<usize>,
    /// Seconds an element may spend retrying transient object-store failures (default 15).
    #[arg(long, env = "JOADER_S3_RETRY_BUDGET_S")]
    pub s3_retry_budget_s: Option<f64>,
    /// Keys per object-store listing page (default 1000, the most S3 returns).
    #[arg(long, env = "JOADER_S3_LIST_PAGE")]
    pub s3_list_page: Option<usize>,
    /// Bearer token required by the REST API (and sent to the leader by a follower).
    #[arg(long, env = "JOADER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Mode (octal, such as 660) of the shared memory clients open: training processes of
    /// another user open it through the group of `--shm-gid` (default 600).
    #[arg(long, env = "JOADER_SHM_MODE", value_parser = parse_mode)]
    pub shm_mode: Option<u32>,
    /// Group id given to the shared memory clients open (the server's user must belong to it).
    #[arg(long, env = "JOADER_SHM_GID")]
    pub shm_gid: Option<u32>,
    /// Follow this leader (`http://HOST:PORT`): register this node, load and serve the
    /// leader's samples of multi-node jobs. Without it the server is a leader.
    #[arg(long, env = "JOADER_LEADER")]
    pub leader: Option<String>,
    /// This node's name in the cluster (default: `<hostname>-<instance>`; keep it stable).
    #[arg(long, env = "JOADER_NODE_NAME")]
    pub node_name: Option<String>,
    /// The URL the leader and followers reach this server at (default: http:// + --bind).
    #[arg(long, env = "JOADER_ADVERTISE")]
    pub advertise: Option<String>,
    /// A leader that serves no ranks itself (its pod is not a training node).
    #[arg(long, env = "JOADER_LEADER_ONLY")]
    pub leader_only: bool,
    /// Milliseconds between heartbeats (default 500).
    #[arg(long, env = "JOADER_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// A node (or the leader) silent this long is lost: its multi-node jobs fail (default 2000).
    #[arg(long, env = "JOADER_NODE_TIMEOUT_MS")]
    pub node_timeout_ms: Option<u64>,
}

/// An octal mode: `660`, `0660` or `0o660`.
fn parse_mode(s: &str) -> std::result::Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    u32::from_str_radix(digits, 8).map_err(|_| format!("'{s}' is not an octal mode such as 660"))
}

impl ServeArgs {
    pub fn into_config(self) -> Result<Config> {
        let mut c = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read {}", p.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("invalid configuration {}", p.display()))?
            }
            None => Config::default(),
        };
        if let Some(v) = self.bind {
            c.bind = v;
        }
        if let Some(v) = self.data_dir {
            c.data_dir = v;
        }
        if let Some(v) = self.instance {
            c.instance = v;
        }
        if let Some(v) = self.cache_bytes {
            c.cache_bytes = v;
        }
        if let Some(v) = self.cache_slots {
            c.cache_slots = v;
        }
        if let Some(v) = self.cache_policy {
            c.cache_policy = v;
        }
        if let Some(v) = self.loader_workers {
            c.loader_workers = v;
        }
        if let Some(v) = self.http_workers {
            c.http_workers = v;
        }
        if let Some(v) = self.max_pixels {
            c.max_pixels = v;
        }
        if let Some(v) = self.drain_grace_s {
            c.drain_grace_s = v;
        }
        if let Some(v) = self.start_window_ms {
            c.start_window_ms = v;
        }
        if let Some(v) = self.ended_jobs_kept {
            c.ended_jobs_kept = v;
        }
        if let Some(v) = self.ended_job_ttl_s {
            c.ended_job_ttl_s = v;
        }
        if let Some(v) = self.metrics_retention_s {
            c.metrics_retention_s = v;
        }
        if !self.allowed_roots.is_empty() {
            c.allowed_roots = self.allowed_roots;
        }
        if !self.allowed_s3.is_empty() {
            c.allowed_s3 = self.allowed_s3;
        }
        if !self.allowed_s3_endpoints.is_empty() {
            c.allowed_s3_endpoints = self.allowed_s3_endpoints;
        }
        if let Some(v) = self.s3_max_in_flight {
            c.s3_max_in_flight = v;
        }
        if let Some(v) = self.s3_retry_budget_s {
            c.s3_retry_budget_s = v;
        }
        if let Some(v) = self.s3_list_page {
            c.s3_list_page = v;
        }
        if self.token.is_some() {
            c.token = self.token;
        }
        if let Some(m) = self.shm_mode {
            c.shm_mode = m;
        }
        if self.shm_gid.is_some() {
            c.shm_gid = self.shm_gid;
        }
        if self.leader.is_some() {
            c.leader = self.leader;
        }
        if self.node_name.is_some() {
            c.node_name = self.node_name;
        }
        if self.advertise.is_some() {
            c.advertise = self.advertise;
        }
        c.leader_only |= self.leader_only;
        if let Some(v) = self.heartbeat_ms {
            c.heartbeat_ms = v;
        }
        if let Some(v) = self.node_timeout_ms {
            c.node_timeout_ms = v;
        }
        c.validate()?;
        Ok(c)
    }
}

#[derive(Debug, Args)]
pub struct GenDatasetArgs {
    /// Output folder (created; reused when it already holds the same dataset).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    #[arg(long, default_value_t = 100)]
    pub per_class: u32,
    #[arg(long, default_value_t = 500)]
    pub width: u32,
    #[arg(long, default_value_t = 375)]
    pub height: u32,
    #[arg(long, default_value_t = 90)]
    pub quality: u8,
    #[arg(long, default_value_t = 2022)]
    pub seed: u64,
}

fn gen_dataset(a: GenDatasetArgs) -> Result<()> {
    let spec = crate::synth::SynthSpec {
        classes: a.classes,
        per_class: a.per_class,
        width: a.width,
        height: a.height,
        quality: a.quality,
        seed: a.seed,
    };
    let n = crate::synth::generate_image_folder(&a.out, &spec, &mut |_| {})
        .with_context(|| format!("cannot generate the dataset in {}", a.out.display()))?;
    println!("{n} images in {}", a.out.display());
    Ok(())
}

#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// The dead server's shared-memory instance name.
    #[arg(long, env = "JOADER_INSTANCE", default_value = "default")]
    pub instance: String,
}

fn cleanup(args: CleanupArgs) -> Result<()> {
    let removed = dataplane::remove_dead_instance(&args.instance).with_context(|| {
        format!(
            "cannot clean up instance {:?} (a running server removes its own on stop)",
            args.instance
        )
    })?;
    // The lock is always in the list (taking it creates it when the dead server's is gone).
    if removed.len() <= 1 {
        println!("instance {:?} had nothing left in /dev/shm", args.instance);
    } else {
        for name in &removed {
            println!("removed /dev/shm/{name}");
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Server URL.
    #[arg(long, env = "JOADER_SERVER", default_value = "http://127.0.0.1:7480")]
    pub server: String,
    /// The job registration, as the JSON body of POST /v1/jobs.
    #[arg(long)]
    pub job: String,
    /// Which rank's ring to read.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Sleep this many microseconds per sample (a slower training step).
    #[arg(long, default_value_t = 0)]
    pub sample_us: u64,
    /// Stop after this many samples without acknowledging more (tests kill it then).
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// Write each element's payload as `<dir>/<epoch>-<position>-<element>.bin`.
    #[arg(long)]
    pub dump: Option<PathBuf>,
    #[arg(long, env = "JOADER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

fn consume(args: ConsumeArgs) -> Result<()> {
    let client = crate::client::Client::new(args.server.clone()).with_token(args.token.clone());
    let body: serde_json::Value = serde_json::from_str(&args.job).context("--job is not JSON")?;
    let reg = client.ok("POST", "/v1/jobs", Some(&body))?;
    let rank = reg["ranks"]
        .as_array()
        .and_then(|r| r.iter().find(|x| x["rank"] == args.rank))
        .with_context(|| format!("the server returned no rank {}", args.rank))?;
    let instance = rank["instance"]
        .as_str()
        .context("no instance")?
        .to_string();
    let ring = rank["ring"].as_str().context("no ring")?.to_string();
    let batch = body["batch_size"].as_u64().unwrap_or(32) as usize;
    // Tell a waiting test that the job is registered.
    eprintln!("registered ring={ring}");
    let per = Duration::from_micros(args.sample_us);
    let mut dump_err = None;
    let got = match crate::client::consume(
        &instance,
        &ring,
        // Hold the unacknowledged batch until killed.
        crate::client::ReadOptions {
            batch,
            max_samples: args.stop_after,
            hold: Duration::from_secs(3600),
        },
        |n, _| per * n as u32,
        |_| {},
        |meta, data| {
            if let Some(dir) = &args.dump {
                let p = dir.join(format!(
                    "{}-{}-{}.bin",
                    meta.epoch, meta.position, meta.element_id
                ));
                if let Err(e) = std::fs::write(&p, data) {
                    dump_err.get_or_insert(e);
                }
            }
        },
    ) {
        Ok(got) => got,
        Err(e) => {
            // A closed ring: say why when the server failed the job (a multi-node job whose
            // node or leader was lost is `job_failed`).
            let closed = e
                .downcast_ref::<dataplane::Error>()
                .is_some_and(|d| d.code() == "ring_closed");
            let name = body["name"].as_str().unwrap_or_default();
            if closed
                && let Ok(job) = client.ok("GET", &format!("/v1/jobs/{name}"), None)
                && job["state"] == "failed"
            {
                let reason = job["reason"].as_str().unwrap_or("");
                let reason = reason.strip_prefix("job_failed: ").unwrap_or(reason);
                bail!("job_failed: job {name} failed: {reason}");
            }
            return Err(e);
        }
    };
    if let Some(e) = dump_err {
        return Err(e).context("cannot write a payload");
    }
    let summary = serde_json::json!({
        "samples": got.samples,
        "elapsed_s": got.elapsed.as_secs_f64(),
        "first_wait_s": got.first_wait.as_secs_f64(),
        "longest_wait_s": got.longest_wait.as_secs_f64(),
        "epochs": got.epochs.iter().map(|e| e.iter().map(|(id, label)| [i64::from(*id), *label]).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "errors": got.errors,
    });
    println!("{summary}");
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
    let config = args.into_config()?;
    let listener = std::net::TcpListener::bind(config.bind)
        .with_context(|| format!("cannot bind {}", config.bind))?;
    actix_web::rt::System::new().block_on(crate::run(
        listener,
        config,
        std::future::pending::<()>(),
    ))
}

pub fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Demo(args) => demo::run(args),
        Command::Consume(args) => consume(args),
        Command::Cleanup(args) => cleanup(args),
        Command::GenDataset(args) => gen_dataset(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(BenchCommand::Sampler(args)) => bench::sampler::sampler(args),
        Command::Bench(BenchCommand::Dataplane) => {
            let report = dataplane::bench::run(&dataplane::bench::BenchOptions::default())?;
            println!("{report}");
            Ok(())
        }
        Command::Bench(BenchCommand::E2e(args)) => bench::e2e::run(args),
        Command::Bench(BenchCommand::Decode(args)) => bench::decode::decode(args),
        Command::Bench(BenchCommand::Scale(args)) => bench::scale::run(args),
        Command::Bench(BenchCommand::Cluster(args)) => bench::cluster::run(args),
    }
}

/// Reads a scenario file (TOML or JSON).
pub fn read_scenario(path: &std::path::Path) -> Result<joader_core::sim::Scenario> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let scn = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text)
            .with_context(|| format!("invalid scenario {}", path.display()))?
    } else {
        toml::from_str(&text).with_context(|| format!("invalid scenario {}", path.display()))?
    };
    Ok(scn)
}

pub fn check_exclusive(args: &SimulateArgs) -> Result<()> {
    let sources = usize::from(args.preset.is_some())
        + usize::from(args.config.is_some())
        + usize::from(!args.jobs.is_empty());
    if sources != 1 {
        bail!("give exactly one of --preset, --config or --job (one or more)");
    }
    Ok(())
}

//! `joader serve`: its command-line arguments, merged over the configuration file and the
//! defaults into a [`Config`], and the blocking entry point that runs the server.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use joader_core::cache::PolicyKind;

use crate::Config;

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
    /// Object-store requests in flight at once, at most (default 256; the limit starts at 16
    /// and adapts below this to what the store sustains).
    #[arg(long, env = "JOADER_S3_MAX_IN_FLIGHT")]
    pub s3_max_in_flight: Option<usize>,
    /// The fetch-ahead buffer: bytes or a size such as 64MiB (default 64MiB; 0 turns
    /// fetch-ahead off). It holds the encoded bytes of elements the Sampler picked beyond
    /// what the Cache loads now, fetched from the object store before their load.
    #[arg(long, env = "JOADER_S3_FETCH_AHEAD_BYTES", value_parser = crate::config::parse_bytes)]
    pub s3_fetch_ahead_bytes: Option<u64>,
    /// A folder on local disk for the tier of encoded bytes fetched from object stores (the
    /// second tier, below the decoded cache in shared memory; one server per folder).
    #[arg(long, env = "JOADER_DISK_CACHE")]
    pub disk_cache: Option<PathBuf>,
    /// The disk tier's size: bytes or a size such as 200GiB (required with --disk-cache).
    #[arg(long, env = "JOADER_DISK_CACHE_BYTES", value_parser = crate::config::parse_bytes)]
    pub disk_cache_bytes: Option<u64>,
    /// Bytes of decoded rows the reader of each parquet dataset keeps (a compressed row
    /// group's images decompressed): a size such as 512MiB (default: the larger of 64MiB and
    /// an eighth of --cache-bytes).
    #[arg(long, env = "JOADER_PARQUET_DECODED_BYTES", value_parser = crate::config::parse_bytes)]
    pub parquet_decoded_bytes: Option<u64>,
    /// Bytes of row directories the reader of each parquet dataset keeps (default 64MiB).
    #[arg(long, env = "JOADER_PARQUET_DIRECTORY_BYTES", value_parser = crate::config::parse_bytes)]
    pub parquet_directory_bytes: Option<u64>,
    /// Bytes of small-field values the reader of each parquet dataset keeps (default 32MiB).
    #[arg(long, env = "JOADER_PARQUET_FIELD_BYTES", value_parser = crate::config::parse_bytes)]
    pub parquet_field_bytes: Option<u64>,
    /// Bytes the readers of every parquet dataset together may spill to
    /// <data-dir>/parquet-spill of their zstd and gzip row groups decoded, so that a row read
    /// later costs its own bytes (default: the smaller of 16GiB and half the data folder's
    /// free space; 1 spills nothing).
    #[arg(long, env = "JOADER_PARQUET_SPILL_BYTES", value_parser = crate::config::parse_bytes)]
    pub parquet_spill_bytes: Option<u64>,
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
    /// How long a leader restart may take (default: five node timeouts): followers keep their
    /// multi-node jobs paused this long and resume them with the restarted leader, which
    /// waits as long for them; 0 fails the jobs when the leader is lost.
    #[arg(long, env = "JOADER_LEADER_GRACE_MS")]
    pub leader_grace_ms: Option<u64>,
}

/// An octal mode: `660`, `0660` or `0o660`.
fn parse_mode(s: &str) -> std::result::Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    u32::from_str_radix(digits, 8).map_err(|_| format!("'{s}' is not an octal mode such as 660"))
}

/// `overlay!(args, config; field, ...)`: a field given as an argument (`Some`) replaces the
/// configuration's.
macro_rules! overlay {
    ($a:ident, $c:ident; $($f:ident),* $(,)?) => {
        $(if let Some(v) = $a.$f {
            $c.$f = v;
        })*
    };
}

/// As `overlay!`, for a field that is optional in the configuration too.
macro_rules! overlay_optional {
    ($a:ident, $c:ident; $($f:ident),* $(,)?) => {
        $(if $a.$f.is_some() {
            $c.$f = $a.$f;
        })*
    };
}

/// As `overlay!`, for a list: one given (non-empty) replaces the configuration's.
macro_rules! overlay_list {
    ($a:ident, $c:ident; $($f:ident),* $(,)?) => {
        $(if !$a.$f.is_empty() {
            $c.$f = $a.$f;
        })*
    };
}

impl ServeArgs {
    /// The configuration: the file's (`--config`) or the defaults, with the arguments given
    /// over it, validated.
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
        let a = self;
        // Each argument given on the command line replaces the file's (or the default) value.
        overlay!(a, c; bind, data_dir, instance, cache_bytes, cache_slots, cache_policy,
            loader_workers, http_workers, max_pixels, drain_grace_s, start_window_ms,
            ended_jobs_kept, ended_job_ttl_s, metrics_retention_s, s3_max_in_flight,
            s3_fetch_ahead_bytes, disk_cache_bytes, s3_retry_budget_s, s3_list_page, shm_mode,
            parquet_decoded_bytes, parquet_directory_bytes, parquet_field_bytes, parquet_spill_bytes,
            heartbeat_ms, node_timeout_ms);
        overlay_optional!(a, c; disk_cache, token, shm_gid, leader, node_name, advertise,
            leader_grace_ms);
        overlay_list!(a, c; allowed_roots, allowed_s3, allowed_s3_endpoints);
        c.leader_only |= a.leader_only;
        c.validate()?;
        Ok(c)
    }
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let config = args.into_config()?;
    let listener = std::net::TcpListener::bind(config.bind)
        .with_context(|| format!("cannot bind {}", config.bind))?;
    actix_web::rt::System::new().block_on(crate::run(
        listener,
        config,
        std::future::pending::<()>(),
    ))
}

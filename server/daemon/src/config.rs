//! Server configuration: defaults, a TOML file, `JOADER_*` environment variables and flags
//! (`serve.rs` merges the command line over them in that order).

use std::net::SocketAddr;
use std::path::PathBuf;

use joader_core::cache::PolicyKind;
use joader_pipeline::Pipeline;
use serde::{Deserialize, Serialize};

/// Everything `joader serve` needs; `Config::default()` is a working single-user setup.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the REST API. Loopback by default; set `token` when binding wider.
    pub bind: SocketAddr,
    /// Where the catalog of datasets lives.
    pub data_dir: PathBuf,
    /// Names the shared-memory segments (`/dev/shm/joader-<instance>-*`): two servers on one
    /// machine need two instances.
    pub instance: String,
    /// Bytes of decoded data the cache may hold in shared memory: an integer or a size as
    /// users write it (`"2GiB"`, `"512MiB"`, `"1.5 GB"`).
    #[serde(deserialize_with = "de_bytes")]
    pub cache_bytes: u64,
    /// Number of cache slots (elements cached at most).
    pub cache_slots: u32,
    pub cache_policy: PolicyKind,
    /// Decode threads (default: number of cores).
    pub loader_workers: usize,
    /// HTTP worker threads (default: number of cores, between 2 and 8). Handlers never block
    /// them (catalog commits run on the blocking pool), but a slow client must not hold the
    /// only one.
    pub http_workers: usize,
    /// Dataset paths must lie under one of these folders (default: the current directory).
    pub allowed_roots: Vec<PathBuf>,
    /// What `s3` sources may name: `s3://bucket` or `s3://bucket/prefix` entries. Empty (the
    /// default): `s3` sources are refused.
    pub allowed_s3: Vec<String>,
    /// Endpoints `s3` sources may name besides the environment's `AWS_ENDPOINT_URL` (the
    /// server sends its signed requests there).
    pub allowed_s3_endpoints: Vec<String>,
    /// Object-store requests in flight at once, for the whole server, at most: the limit
    /// starts at 16 and grows while fetches wait, halving when the store throttles.
    pub s3_max_in_flight: usize,
    /// The fetch-ahead buffer's size (bytes of encoded elements fetched from object stores
    /// before their load; 0: no fetch-ahead).
    #[serde(deserialize_with = "de_bytes")]
    pub s3_fetch_ahead_bytes: u64,
    /// Seconds one element (or listing page) may spend retrying transient failures.
    pub s3_retry_budget_s: f64,
    /// Seconds one object-store request may take.
    pub s3_request_timeout_s: f64,
    /// Keys per listing page (S3 returns at most 1000).
    pub s3_list_page: usize,
    /// A folder on local disk for the tier of encoded bytes fetched from object stores (see
    /// `joader_storage::tier`); unset: no disk tier.
    pub disk_cache: Option<PathBuf>,
    /// The disk tier's size (an integer or a size such as `"200GiB"`); required with
    /// `disk_cache`.
    #[serde(deserialize_with = "de_bytes")]
    pub disk_cache_bytes: u64,
    /// What the reader of each `parquet` dataset keeps of decoded rows (a compressed row
    /// group's image column decompressed, in bytes): 0, the default, sizes it from the cache,
    /// `max(64 MiB, cache_bytes / 8)`.
    #[serde(deserialize_with = "de_bytes")]
    pub parquet_decoded_bytes: u64,
    /// What it keeps of row directories (where each row lies in a group's pages).
    #[serde(deserialize_with = "de_bytes")]
    pub parquet_directory_bytes: u64,
    /// What it keeps of row groups' small-field values.
    #[serde(deserialize_with = "de_bytes")]
    pub parquet_field_bytes: u64,
    /// What the readers of every `parquet` dataset together may spill to local disk
    /// (`<data_dir>/parquet-spill`) of zstd and gzip row groups decoded: 0, the default, is
    /// the smaller of 16 GiB and half the space free in the data folder's file system at
    /// start-up; a size below a row group's spills nothing.
    #[serde(deserialize_with = "de_bytes")]
    pub parquet_spill_bytes: u64,
    /// Bearer token required by the REST API when set.
    pub token: Option<String>,
    /// Records per delivery ring (per job rank); 0 means 2 × batch size, at least 64.
    pub ring_capacity: u32,
    /// The shared pipeline of jobs that do not name one.
    pub default_pipeline: Pipeline,
    /// Images with more pixels are refused (reported as failed elements).
    pub max_pixels: u64,
    /// Sampler pass interval, in milliseconds.
    pub sampler_tick_ms: u64,
    /// Milliseconds a job's first samples wait for other jobs of its dataset starting at about
    /// the same time, so that jobs launched together are sampled together from their first
    /// element (0: no wait).
    pub start_window_ms: u64,
    /// Acknowledgement polling interval while polls find acknowledgements, in milliseconds
    /// (polls that find nothing back off to at most 8 ms, see the Cache's `liveness.rs`).
    pub cache_tick_ms: u64,
    /// Seconds running jobs get to finish after SIGTERM before the server stops (new jobs
    /// are refused meanwhile).
    pub drain_grace_s: u64,
    /// Ended jobs (finished and read, or failed) the API still lists; older ones are forgotten.
    pub ended_jobs_kept: usize,
    /// Seconds after which an ended job is forgotten however few there are.
    pub ended_job_ttl_s: u64,
    /// Seconds a job name's counters and metric series outlive its last job (keep it above
    /// the Prometheus scrape interval, so that the last values are scraped).
    pub metrics_retention_s: u64,
    /// Mode of the shared-memory objects clients open (the data segment and the rings), e.g.
    /// `0o660` in TOML: training processes of another user open them through the group.
    pub shm_mode: u32,
    /// Group id given to those objects (the server's user must belong to it; Kubernetes: the
    /// training pods' `supplementalGroups`). Default: the server's group.
    pub shm_gid: Option<u32>,
    /// The leader's URL (`http://HOST:PORT`): this server is a follower node of that leader's
    /// cluster. Unset: this server is a leader (and, alone, a standalone server as before).
    pub leader: Option<String>,
    /// This node's name in the cluster (default: `<hostname>-<instance>`); placement hashes it,
    /// so keep it stable across restarts.
    pub node_name: Option<String>,
    /// The URL other servers reach this one at (default: `http://` + the bound address).
    pub advertise: Option<String>,
    /// A leader that serves no ranks itself (Kubernetes: the leader's pod is not a training
    /// node); followers and a standalone leader serve ranks.
    pub leader_only: bool,
    /// Milliseconds between a node's heartbeats.
    pub heartbeat_ms: u64,
    /// A node silent this long is lost (the leader fails its multi-node jobs); a leader
    /// unreachable this long makes a follower fail its multi-node jobs.
    pub node_timeout_ms: u64,
    /// How long a leader restart may take (default: five `node_timeout_ms`). A follower that
    /// loses its leader keeps its multi-node jobs paused this long, their rings open, and
    /// resumes them with a leader that comes back (a new generation); a restarted leader
    /// waits as long for the nodes of its journaled jobs. 0: a lost leader fails the jobs at
    /// once.
    pub leader_grace_ms: Option<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:7480".parse().expect("a valid address"),
            data_dir: PathBuf::from("joader-data"),
            instance: "default".into(),
            cache_bytes: 1 << 30,
            cache_slots: 16384,
            cache_policy: PolicyKind::RefCnt,
            loader_workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            http_workers: std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8)),
            allowed_roots: vec![std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))],
            allowed_s3: Vec::new(),
            allowed_s3_endpoints: Vec::new(),
            s3_max_in_flight: 256,
            s3_retry_budget_s: 15.0,
            s3_request_timeout_s: 10.0,
            s3_list_page: 1000,
            s3_fetch_ahead_bytes: joader_storage::s3::DEFAULT_FETCH_AHEAD_BYTES,
            disk_cache: None,
            disk_cache_bytes: 0,
            parquet_decoded_bytes: 0,
            parquet_directory_bytes: joader_storage::DIRECTORY_BUDGET as u64,
            parquet_field_bytes: joader_storage::FIELDS_BUDGET as u64,
            parquet_spill_bytes: 0,
            token: None,
            ring_capacity: 0,
            default_pipeline: Pipeline::Decode {
                resize_shorter: Some(256),
                center_crop: Some([224, 224]),
            },
            max_pixels: 100_000_000,
            sampler_tick_ms: 2,
            start_window_ms: 200,
            cache_tick_ms: 1,
            drain_grace_s: 30,
            ended_jobs_kept: 100,
            ended_job_ttl_s: 24 * 3600,
            metrics_retention_s: 600,
            shm_mode: 0o600,
            shm_gid: None,
            leader: None,
            node_name: None,
            advertise: None,
            leader_only: false,
            heartbeat_ms: 500,
            node_timeout_ms: 2000,
            leader_grace_ms: None,
        }
    }
}

/// Parses a byte size as users write it: `1073741824`, `512MiB`, `2GiB`, `1.5 GB` (binary
/// units with `i`, decimal without; the `bytesize` crate's grammar).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("'{s}' is not a byte size such as 512MiB or 2GiB ({e})"))
}

/// A byte-size setting in a configuration file: an integer or a string such as `"2GiB"`.
fn de_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    bytesize::ByteSize::deserialize(d).map(|b| b.as_u64())
}

/// How long state about jobs is kept: a long-running server's memory must not grow with
/// the number of jobs it has served.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Ended jobs (finished and closed, or failed) still listed; older ones are forgotten.
    pub ended_jobs: usize,
    /// Ended jobs are also forgotten this long after they ended.
    pub ended_ttl: std::time::Duration,
    /// A name's counters (and metric series) are kept this long after its last job stopped
    /// or was forgotten, longer than any scrape interval, then dropped.
    pub metrics: std::time::Duration,
}

impl Config {
    /// What the registry keeps of ended jobs, and for how long (`ended_jobs_kept`,
    /// `ended_job_ttl_s`, `metrics_retention_s`).
    pub fn retention(&self) -> Retention {
        Retention {
            ended_jobs: self.ended_jobs_kept,
            ended_ttl: std::time::Duration::from_secs(self.ended_job_ttl_s),
            metrics: std::time::Duration::from_secs(self.metrics_retention_s),
        }
    }

    /// The budgets of each `parquet` dataset's reader (`parquet_decoded_bytes` 0: the
    /// larger of 64 MiB and an eighth of the cache).
    pub fn parquet_budgets(&self) -> joader_storage::ParquetBudgets {
        let size = |b: u64| usize::try_from(b).unwrap_or(usize::MAX);
        let decoded = match self.parquet_decoded_bytes {
            0 => size(self.cache_bytes / 8).max(joader_storage::DECODED_BUDGET),
            b => size(b),
        };
        joader_storage::ParquetBudgets {
            decoded,
            directories: size(self.parquet_directory_bytes),
            fields: size(self.parquet_field_bytes),
        }
    }

    /// Where each `parquet` dataset's reader spills its zstd and gzip groups, and how much
    /// it may (`parquet_spill_bytes`, or the default rule on the data folder now).
    pub fn parquet_spill(&self) -> joader_storage::ParquetSpill {
        let dir = self.data_dir.join("parquet-spill");
        let bytes = match self.parquet_spill_bytes {
            0 => joader_storage::default_spill_bytes(&self.data_dir),
            b => b,
        };
        joader_storage::ParquetSpill { dir, bytes }
    }

    /// The object-store stage's settings.
    pub fn fetch_config(&self) -> joader_storage::s3::FetchConfig {
        joader_storage::s3::FetchConfig {
            max_in_flight: self.s3_max_in_flight,
            budget: std::time::Duration::from_secs_f64(self.s3_retry_budget_s),
            request_timeout: std::time::Duration::from_secs_f64(self.s3_request_timeout_s),
            list_page: self.s3_list_page,
            ahead_bytes: self.s3_fetch_ahead_bytes,
        }
    }

    /// How long a leader restart may take ([`Config::leader_grace_ms`]).
    pub fn leader_grace(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.leader_grace_ms
                .unwrap_or(self.node_timeout_ms.saturating_mul(5)),
        )
    }

    /// This node's name in the cluster.
    pub fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "node".into());
            format!("{host}-{}", self.instance)
        })
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        joader_storage::s3::S3Allow::parse(&self.allowed_s3, &self.allowed_s3_endpoints)
            .map_err(|e| anyhow::anyhow!("allowed_s3 / allowed_s3_endpoints: {e}"))?;
        anyhow::ensure!(
            self.s3_max_in_flight > 0 && (1..=1000).contains(&self.s3_list_page),
            "s3_max_in_flight must be positive and s3_list_page between 1 and 1000"
        );
        anyhow::ensure!(
            self.s3_retry_budget_s.is_finite()
                && self.s3_retry_budget_s >= 0.0
                && self.s3_request_timeout_s.is_finite()
                && self.s3_request_timeout_s > 0.0,
            "s3_retry_budget_s must be at least 0 and s3_request_timeout_s positive"
        );
        if let Some(dir) = &self.disk_cache {
            anyhow::ensure!(
                self.disk_cache_bytes > 0,
                "disk_cache {} needs its size: set disk_cache_bytes (--disk-cache-bytes 200GiB)",
                dir.display()
            );
        }
        dataplane::names::validate_instance(&self.instance)
            .map_err(|e| anyhow::anyhow!("instance: {e}"))?;
        anyhow::ensure!(self.cache_slots > 0, "cache_slots must be positive");
        anyhow::ensure!(
            self.cache_bytes >= 1 << 20,
            "cache_bytes must be at least 1 MiB"
        );
        anyhow::ensure!(self.loader_workers > 0, "loader_workers must be positive");
        anyhow::ensure!(self.http_workers > 0, "http_workers must be positive");
        anyhow::ensure!(
            !self.allowed_roots.is_empty(),
            "allowed_roots must name at least one folder"
        );
        anyhow::ensure!(
            self.sampler_tick_ms > 0 && self.cache_tick_ms > 0,
            "ticks must be positive"
        );
        anyhow::ensure!(
            self.shm_mode & !0o777 == 0
                && self.shm_mode & 0o600 == 0o600
                && self.shm_mode & 0o111 == 0,
            "shm_mode {:o}: read and write bits only, the owner's included (such as 600, 660, 666)",
            self.shm_mode
        );
        if let Some(l) = &self.leader {
            anyhow::ensure!(
                l.starts_with("http://") || l.starts_with("https://"),
                "leader must be a URL such as http://HOST:7480, not '{l}'"
            );
            anyhow::ensure!(
                !self.leader_only,
                "leader_only is for a leader: drop --leader"
            );
        }
        anyhow::ensure!(
            self.heartbeat_ms > 0 && self.node_timeout_ms > 2 * self.heartbeat_ms,
            "node_timeout_ms must exceed two heartbeats (heartbeat_ms)"
        );
        self.default_pipeline
            .validate()
            .map_err(|e| anyhow::anyhow!("default_pipeline: {e}"))?;
        if !self.bind.ip().is_loopback() && self.token.is_none() {
            tracing::warn!(bind = %self.bind, "the REST API is bound beyond loopback without a token");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_are_read_as_users_write_them() {
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1073741824"), Ok(1 << 30));
        assert_eq!(parse_bytes(" 1.5 GB "), Ok(1_500_000_000));
        let e = parse_bytes("lots").unwrap_err();
        assert!(e.contains("'lots'") && e.contains("512MiB"), "{e}");
        let c: Config = toml::from_str("cache_bytes = \"96MiB\"").unwrap();
        assert_eq!(c.cache_bytes, 96 << 20);
        let c: Config = toml::from_str("cache_bytes = 1048576").unwrap();
        assert_eq!(c.cache_bytes, 1 << 20);
        assert!(toml::from_str::<Config>("cache_bytes = \"many\"").is_err());
    }

    #[test]
    fn the_fetch_ahead_buffer_is_a_size_and_0_turns_it_off() {
        let c: Config = toml::from_str("s3_fetch_ahead_bytes = \"128MiB\"").unwrap();
        assert_eq!(c.fetch_config().ahead_bytes, 128 << 20);
        let c: Config = toml::from_str("s3_fetch_ahead_bytes = 0").unwrap();
        assert_eq!(c.fetch_config().ahead_bytes, 0);
        assert_eq!(
            Config::default().fetch_config().ahead_bytes,
            joader_storage::s3::DEFAULT_FETCH_AHEAD_BYTES
        );
    }

    #[test]
    fn a_disk_cache_is_read_from_toml_and_needs_its_size() {
        let c: Config =
            toml::from_str("disk_cache = \"/nvme/tier\"\ndisk_cache_bytes = \"200GiB\"").unwrap();
        assert_eq!(c.disk_cache, Some(PathBuf::from("/nvme/tier")));
        assert_eq!(c.disk_cache_bytes, 200 << 30);
        c.validate().unwrap();
        let c: Config = toml::from_str("disk_cache = \"/nvme/tier\"").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--disk-cache-bytes"), "{e}");
    }

    #[test]
    fn parquet_budgets_follow_the_cache_unless_set() {
        let mut c = Config::default();
        assert_eq!(c.parquet_budgets().decoded, 128 << 20, "a 1 GiB cache");
        c.cache_bytes = 128 << 20;
        assert_eq!(c.parquet_budgets().decoded, 64 << 20, "never below 64 MiB");
        let c: Config = toml::from_str(
            "parquet_decoded_bytes = \"2GiB\"\nparquet_directory_bytes = \"16MiB\"\nparquet_field_bytes = 1024",
        )
        .unwrap();
        let b = c.parquet_budgets();
        assert_eq!(
            (b.decoded, b.directories, b.fields),
            (2 << 30, 16 << 20, 1024)
        );
    }
}

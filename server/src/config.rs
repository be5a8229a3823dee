//! Server configuration: defaults, a TOML file, `JOADER_*` environment variables and flags
//! (the command line in `cli.rs` merges them in that order).

use std::net::SocketAddr;
use std::path::PathBuf;

use actors::pipeline::Pipeline;
use joader_core::cache::PolicyKind;
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
    /// Bytes of decoded data the cache may hold in shared memory.
    pub cache_bytes: u64,
    /// Number of cache slots (elements cached at most).
    pub cache_slots: u32,
    pub cache_policy: PolicyKind,
    /// Decode threads (default: number of cores).
    pub loader_workers: usize,
    /// Dataset paths must lie under one of these folders (default: the current directory).
    pub allowed_roots: Vec<PathBuf>,
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
    /// Acknowledgement polling interval, in milliseconds.
    pub cache_tick_ms: u64,
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
            allowed_roots: vec![std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))],
            token: None,
            ring_capacity: 0,
            default_pipeline: Pipeline::Decode {
                resize_shorter: Some(256),
                center_crop: Some([224, 224]),
            },
            max_pixels: 100_000_000,
            sampler_tick_ms: 2,
            cache_tick_ms: 1,
        }
    }
}

impl Config {
    pub fn validate(&self) -> anyhow::Result<()> {
        dataplane::names::validate_instance(&self.instance)
            .map_err(|e| anyhow::anyhow!("instance: {e}"))?;
        anyhow::ensure!(self.cache_slots > 0, "cache_slots must be positive");
        anyhow::ensure!(
            self.cache_bytes >= 1 << 20,
            "cache_bytes must be at least 1 MiB"
        );
        anyhow::ensure!(self.loader_workers > 0, "loader_workers must be positive");
        anyhow::ensure!(
            !self.allowed_roots.is_empty(),
            "allowed_roots must name at least one folder"
        );
        anyhow::ensure!(
            self.sampler_tick_ms > 0 && self.cache_tick_ms > 0,
            "ticks must be positive"
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

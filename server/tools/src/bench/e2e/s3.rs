//! `joader bench e2e --source s3`: the scenarios again with the dataset in an object store, a
//! local `s3s-fs` on loopback serving a copy of the bench's dataset, beside the same dataset
//! on local disk. Both are served by a `joader serve` child process (the object store's keys
//! reach the server through its environment, the way AWS tools read them), the same consumers
//! read both, so the rows differ only in where the bytes come from. With `--s3-latency-ms`
//! the store is also read through a [`DelayProxy`] per latency, so that the rows show what a
//! store answering that much later (a real one: 20–60 ms) costs.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::Ctx;
use super::pin::Split;
use super::proxy::DelayProxy;
use super::scenarios::Scenario;
use super::systems::{Outcome, run_jobs, summarize_runs};
use crate::bench::scale::procs::{DEADLINE, ServerProc, wait_for};
use crate::client::Client;
use server::procstat::process_cpu;

const BUCKET: &str = "bench";
/// The folder of the bucket the dataset is copied to (its key prefix).
const PREFIX: &str = "images";

/// `--source`: local disk only, or also a local S3 server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    Disk,
    S3,
}

/// Where a scenario's dataset is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Where {
    Disk,
    S3,
}

/// One way to the store: directly, or through a proxy adding `latency_ms` to each request.
pub(super) struct Route {
    /// `None`: straight to `s3s-fs`.
    pub(super) latency_ms: Option<u64>,
    proxy: Option<DelayProxy>,
}

impl Route {
    /// The rows' system name.
    pub(super) fn system(&self) -> &'static str {
        match self.latency_ms {
            None => "joader serve, s3",
            // A handful per run: leaked so that the rows' names stay `&'static str`.
            Some(ms) => Box::leak(format!("joader serve, s3 +{ms} ms").into_boxed_str()),
        }
    }
}

/// One scenario's S3 figures: the bytes the server read from the store while the scenario's
/// jobs read one epoch each, the bytes of the union of the jobs' subsets, and where a remote
/// element's time went (from the server's `/metrics`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Fetched {
    pub(super) latency_ms: Option<u64>,
    pub(super) store_bytes: f64,
    pub(super) union_bytes: u64,
    /// Mean time of a GET, from its first attempt's start to its last byte (s).
    pub(super) get_s: f64,
    /// Mean time a fetch waited for a place among the requests in flight (s).
    pub(super) queued_s: f64,
    /// The server-wide limit on requests in flight at the end of the scenario.
    pub(super) limit: f64,
    /// Loads whose bytes were fetched ahead and waiting, and those whose bytes were on their
    /// way, per GET.
    pub(super) ready: f64,
    pub(super) on_way: f64,
    /// CPU of the store on this machine (`s3s-fs` and the delay proxy) per sample, ms.
    pub(super) store_cpu_ms_per_sample: f64,
}

/// A local `s3s-fs` over a copy of the bench's dataset, with keys made up for this run.
pub(super) struct Store {
    s3: S3sFs,
    endpoint: String,
    /// Each element's size in bytes, by id (the files of the local dataset).
    sizes: Vec<u64>,
    /// The ways to the store the S3 rows are measured through.
    pub(super) routes: Vec<Route>,
    root: PathBuf,
    /// The store's own CPUs, with `--store-cpus`.
    split: Option<Split>,
    _dir: tempfile::TempDir,
}

/// `n` random bytes as hex, from the kernel.
fn random_hex(n: usize) -> Result<String> {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Copies (hard-links where it can) the image folder `from` into `to`.
pub(crate) fn copy_folder(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_folder(&e.path(), &target)?;
        } else if std::fs::hard_link(e.path(), &target).is_err() {
            std::fs::copy(e.path(), &target)?;
        }
    }
    Ok(())
}

impl Store {
    /// Starts `s3s_fs` on a free port over a copy of the dataset of `ctx`, and a delaying
    /// proxy in front of it for each of `latencies_ms` (none: the store directly).
    /// With `split`, `s3s-fs` and the proxies run on the store's CPUs (`pin.rs`).
    pub(super) fn start(
        ctx: &Ctx,
        s3s_fs: &Path,
        latencies_ms: &[u64],
        split: Option<Split>,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("joader-e2e-s3-")
            .tempdir()?;
        copy_folder(&ctx.root, &dir.path().join(BUCKET).join(PREFIX))?;
        let sizes = (0..ctx.index.len() as u32)
            .map(|id| match ctx.index.location(id) {
                Some(joader_storage::Location::File(p)) => Ok(std::fs::metadata(p)?.len()),
                _ => bail!("element {id} of the bench's image folder is no file"),
            })
            .collect::<Result<Vec<u64>>>()?;
        let s3 = S3sFs::start(s3s_fs, dir.path())?;
        if let Some(split) = &split {
            split.pin_store_process(s3.pid())?;
        }
        let upstream = s3.addr();
        let routes = if latencies_ms.is_empty() {
            vec![Route {
                latency_ms: None,
                proxy: None,
            }]
        } else {
            latencies_ms
                .iter()
                .map(|&ms| {
                    let delay = std::time::Duration::from_millis(ms);
                    Ok(Route {
                        latency_ms: Some(ms),
                        proxy: Some(DelayProxy::start_pinned(upstream, delay, split)?),
                    })
                })
                .collect::<Result<_>>()?
        };
        Ok(Store {
            endpoint: s3.endpoint(),
            s3,
            sizes,
            routes,
            root: ctx.root.clone(),
            split,
            _dir: dir,
        })
    }

    /// A `joader serve` child over the local dataset or the store (through `route`), with
    /// dataset `d` indexed; `extra`: more flags (the disk tier's, `tier.rs`).
    pub(super) fn server(
        &self,
        ctx: &Ctx,
        tag: &str,
        source: Where,
        route: &Route,
        extra: &[String],
    ) -> Result<(ServerProc, Client)> {
        let spec = match source {
            Where::Disk => json!({"kind": "image_folder", "path": self.root}),
            Where::S3 => json!({"kind": "s3", "url": format!("s3://{BUCKET}/{PREFIX}"),
                                "layout": "image_folder"}),
        };
        self.server_of(ctx, tag, route, extra, (&spec, &[]))
    }

    /// The `s3://` url of the bench's image folder in the bucket.
    pub(super) fn images_url(&self) -> String {
        format!("s3://{BUCKET}/{PREFIX}")
    }

    /// Copies the local folder `from` into the bucket under `prefix` (hard links where it
    /// can); returns its `s3://` url.
    pub(super) fn put_folder(&self, from: &Path, prefix: &str) -> Result<String> {
        copy_folder(from, &self._dir.path().join(BUCKET).join(prefix))?;
        Ok(format!("s3://{BUCKET}/{prefix}"))
    }

    /// [`Store::server`] with dataset `d` of `spec` (`roots`: local folders it reads besides
    /// the bench's image folder).
    pub(super) fn server_of(
        &self,
        ctx: &Ctx,
        tag: &str,
        route: &Route,
        extra: &[String],
        (spec, roots): (&serde_json::Value, &[PathBuf]),
    ) -> Result<(ServerProc, Client)> {
        let endpoint = route
            .proxy
            .as_ref()
            .map_or_else(|| self.endpoint.clone(), DelayProxy::endpoint);
        let mut args = vec![
            "--cache-slots".to_owned(),
            "8192".to_owned(),
            "--loader-workers".to_owned(),
            ctx.workers.to_string(),
            "--allowed-s3".to_owned(),
            format!("s3://{BUCKET}"),
        ];
        args.extend_from_slice(extra);
        // The store's keys reach the server through its environment only.
        let env = self.s3.env(&endpoint);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let all_roots: Vec<PathBuf> = std::iter::once(self.root.clone())
            .chain(roots.iter().cloned())
            .collect();
        let server = ServerProc::start_with(tag, &all_roots, ctx.cache_bytes, &args, &env)?;
        let client = server.client();
        client.ok(
            "POST",
            "/v1/datasets",
            Some(&json!({"name": "d", "source": spec})),
        )?;
        let d = client.wait_ready("d", DEADLINE)?;
        if d.items != Some(self.sizes.len() as u64) {
            bail!(
                "the dataset {spec} has {:?} items, the bench's {}",
                d.items,
                self.sizes.len()
            );
        }
        Ok((server, client))
    }

    /// Runs `sc` from disk, then from the store through each route: the disk's outcome, and
    /// each route's with its figures.
    pub(super) fn run_all(
        &self,
        sc: &Scenario,
        ctx: &Ctx,
        tag: usize,
    ) -> Result<(Outcome, Vec<(Outcome, Fetched)>)> {
        let (disk, _) = self.run(sc, ctx, tag, Where::Disk, &self.routes[0])?;
        let mut s3 = Vec::new();
        for (i, route) in self.routes.iter().enumerate() {
            let (o, fetched) = self.run(sc, ctx, tag * 16 + i, Where::S3, route)?;
            s3.push((o, fetched.context("no S3 figures")?));
        }
        Ok((disk, s3))
    }

    /// Runs `sc` on a `joader serve` child reading from `source`: its outcome (CPU of the
    /// server and of the consumers), and for the store the bytes read from it.
    pub(super) fn run(
        &self,
        sc: &Scenario,
        ctx: &Ctx,
        tag: usize,
        source: Where,
        route: &Route,
    ) -> Result<(Outcome, Option<Fetched>)> {
        let name = format!(
            "e2e{tag}_{}",
            if source == Where::S3 { "s3" } else { "disk" }
        );
        let (server, client) = self.server(ctx, &name, source, route, &[])?;
        let before = Scrape::of(&server.url)?;
        let store0 = self.store_cpu();
        let cpu0 = server_cpu(&client)? + process_cpu();
        let runs = run_jobs(&client, sc)?;
        let stats = client.ok("GET", "/v1/stats", None)?;
        // The delay proxy's threads run in this process: their CPU is the store's.
        let store = self.store_cpu() - store0;
        let cpu = server_cpu(&client)? + process_cpu() - cpu0 - store.proxy;
        let after = Scrape::of(&server.url)?;
        let system = match source {
            Where::Disk => "joader serve, disk",
            Where::S3 => route.system(),
        };
        let outcome = summarize_runs(
            system,
            &runs,
            cpu,
            stats["decodes"].as_f64().unwrap_or(0.0),
            stats["hit_ratio"].as_f64(),
        );
        let mut union = vec![false; self.sizes.len()];
        for job in &sc.jobs {
            for id in job.subset.clone() {
                union[id as usize] = true;
            }
        }
        let union_bytes = union
            .iter()
            .zip(&self.sizes)
            .filter(|(u, _)| **u)
            .map(|(_, s)| s)
            .sum();
        let gets = after.gets - before.gets;
        let fetched = (source == Where::S3).then_some(Fetched {
            latency_ms: route.latency_ms,
            store_bytes: after.bytes - before.bytes,
            union_bytes,
            get_s: (after.get_s - before.get_s) / gets.max(1.0),
            queued_s: (after.queued_s - before.queued_s) / gets.max(1.0),
            limit: after.limit,
            ready: (after.ahead_hits - before.ahead_hits) / gets.max(1.0),
            on_way: (after.ahead_joined - before.ahead_joined) / gets.max(1.0),
            store_cpu_ms_per_sample: outcome.cpu_ms_per_sample * (store.s3s_fs + store.proxy)
                / cpu.max(1e-9),
        });
        Ok((outcome, fetched))
    }

    /// CPU seconds so far of the store: `s3s-fs`, and the delay proxies' threads (in this
    /// process).
    fn store_cpu(&self) -> StoreCpu {
        let ticks = |s: &procfs::process::Stat| {
            (s.utime + s.stime) as f64 / procfs::ticks_per_second().max(1) as f64
        };
        let s3s_fs = procfs::process::Process::new(self.s3.pid() as i32)
            .and_then(|p| p.stat())
            .map_or(0.0, |s| ticks(&s));
        let proxy = procfs::process::Process::myself()
            .and_then(|p| p.tasks())
            .map_or(0.0, |tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| t.stat().ok())
                    .filter(|s| s.comm.starts_with("bench-delay"))
                    .map(|s| ticks(&s))
                    .sum()
            });
        StoreCpu { s3s_fs, proxy }
    }
}

/// CPU seconds of the local store's parts (see [`Store::store_cpu`]).
#[derive(Clone, Copy, Debug)]
struct StoreCpu {
    s3s_fs: f64,
    proxy: f64,
}

impl std::ops::Sub for StoreCpu {
    type Output = StoreCpu;
    fn sub(self, o: StoreCpu) -> StoreCpu {
        StoreCpu {
            s3s_fs: self.s3s_fs - o.s3s_fs,
            proxy: self.proxy - o.proxy,
        }
    }
}

impl Store {
    /// The bytes of the whole dataset (its files).
    pub(super) fn dataset_bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }
}

/// `s3s-fs` serving the folder `root` (a bucket is a folder of it) on a free loopback port,
/// with keys made up for the run; killed when dropped.
pub(crate) struct S3sFs {
    child: Child,
    port: u16,
    key: String,
    secret: String,
}

impl S3sFs {
    pub(crate) fn start(bin: &Path, root: &Path) -> Result<Self> {
        let (key, secret) = (random_hex(10)?, random_hex(20)?);
        // s3s-fs takes a port, not a listener: another if someone bound this one meanwhile.
        for _ in 0..10 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let mut child = Command::new(bin)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--access-key", &key, "--secret-key", &secret])
                .arg(root)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .with_context(|| format!("cannot start {}", bin.display()))?;
            let up = wait_for("s3s-fs to accept connections or exit", || {
                if child.try_wait()?.is_some() {
                    return Ok(Some(false));
                }
                Ok(std::net::TcpStream::connect(("127.0.0.1", port))
                    .is_ok()
                    .then_some(true))
            })?;
            if up {
                return Ok(Self {
                    child,
                    port,
                    key,
                    secret,
                });
            }
        }
        bail!("s3s-fs found no free port in 10 tries")
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The environment of a `joader serve` that reads the store at `endpoint` (the store's
    /// own, or a proxy's in front of it).
    pub(crate) fn env(&self, endpoint: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", self.key.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret.clone()),
            ("AWS_ENDPOINT_URL", endpoint.to_owned()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
        ]
    }
}

impl Drop for S3sFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's CPU seconds so far.
pub(super) fn server_cpu(client: &Client) -> Result<f64> {
    client.ok("GET", "/v1/stats", None)?["process_cpu_s"]
        .as_f64()
        .context("the server reports no process_cpu_s")
}

/// The server's object-store series, as its `/metrics` gives them (0 before any read).
pub(super) struct Scrape {
    pub(super) bytes: f64,
    pub(super) gets: f64,
    get_s: f64,
    queued_s: f64,
    limit: f64,
    ahead_hits: f64,
    ahead_joined: f64,
}

impl Scrape {
    pub(super) fn of(url: &str) -> Result<Self> {
        let text = ureq::get(&format!("{url}/metrics"))
            .call()?
            .into_body()
            .read_to_string()?;
        let value = |series: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        Ok(Self {
            bytes: value("joader_s3_read_bytes_total"),
            gets: value("joader_s3_requests_total{op=\"get\"}"),
            // No listing runs during a scenario: every request timed is a GET.
            get_s: value("joader_s3_request_duration_seconds_sum"),
            queued_s: value("joader_s3_queued_seconds_total"),
            limit: value("joader_s3_in_flight_limit"),
            ahead_hits: value("joader_s3_fetch_ahead_hits_total"),
            ahead_joined: value("joader_s3_fetch_ahead_joined_total"),
        })
    }
}

impl Store {
    /// The S3 section of the report: per scenario, the store's rows beside the disk's, and
    /// the bytes read from the store against the union of the jobs' subsets.
    pub(super) fn report(&self, rows: &[(String, Outcome, Outcome, Fetched)]) -> String {
        let cpus = self
            .split
            .as_ref()
            .map_or_else(|| "on the same CPUs as joader".to_owned(), Split::describe);
        report(rows, &format!("s3s-fs at {}, {cpus}", self.endpoint))
    }
}

fn report(rows: &[(String, Outcome, Outcome, Fetched)], endpoint_note: &str) -> String {
    let mut s = format!(
        "\nS3 beside local disk ({endpoint_note}); both served by a `joader serve` child, read by the same consumers. \
         added latency: what the proxy adds to each request (-: the store directly); GET ms: a GET's mean time from its first attempt to its last byte; \
         queued ms: the mean time a fetch waited for a place among the requests in flight; limit: that limit at the end (it adapts); \
         ready, on its way: loads whose bytes were fetched ahead and waiting, or on their way, per GET (the rest fetched on demand); \
         store CPU: `s3s-fs` and the delay proxy (not in the s3 CPU column; on CPUs of their own with --store-cpus), per sample; \
         busy / disk: the CPU the s3 row kept busy (its samples/s times its and the store's CPU per sample) over the disk row's (about 1: no time lost waiting on the store, \
         the gap in samples/s is the store's own CPU on these cores)\n\n\
         | scenario | added latency | disk samples/s | s3 samples/s | s3 / disk | disk CPU ms/sample | s3 CPU ms/sample | s3 CPU / disk | bytes read from the store | union of the jobs' subsets | read / union | GET ms | queued ms | limit | ready | on its way | store CPU ms/sample | busy / disk |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (name, disk, s3, f) in rows {
        s.push_str(&format!(
            "| {name} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} | {:.2} | {:.1} | {:.1} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            f.latency_ms.map_or("-".to_owned(), |ms| format!("{ms} ms")),
            disk.aggregate,
            s3.aggregate,
            s3.aggregate / disk.aggregate.max(1e-9),
            disk.cpu_ms_per_sample,
            s3.cpu_ms_per_sample,
            s3.cpu_ms_per_sample / disk.cpu_ms_per_sample.max(1e-9),
            f.store_bytes,
            f.union_bytes,
            f.store_bytes / (f.union_bytes.max(1) as f64),
            f.get_s * 1e3,
            f.queued_s * 1e3,
            f.limit,
            f.ready,
            f.on_way,
            f.store_cpu_ms_per_sample,
            s3.aggregate * (s3.cpu_ms_per_sample + f.store_cpu_ms_per_sample)
                / (disk.aggregate * disk.cpu_ms_per_sample).max(1e-9),
        ));
    }
    s
}

/// The `s3s-fs` binary: `--s3s-fs`, else `JOADER_S3S_FS`, else an error saying how to get it.
pub(crate) fn s3s_fs(flag: Option<&Path>) -> Result<PathBuf> {
    let path = flag
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("JOADER_S3S_FS").map(PathBuf::from))
        .filter(|p| p.is_file());
    path.context(
        "--source s3 needs an s3s-fs binary: pass --s3s-fs PATH or set JOADER_S3S_FS \
         (cargo install s3s-fs --version 0.14.1 --features binary --locked; tests/all.sh \
         keeps one in $CARGO_TARGET_DIR/tools/bin)",
    )
}

//! A small Rust client of the REST API and a ring consumer, used by `joader demo`, the bench
//! and the integration tests. (Training code reads rings with `dataplane::Reader`, or the
//! Python package.)

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde::de::DeserializeOwned;
use serde_json::Value;
use server::http::views::{DatasetState, DatasetView, JobList, JobView, Registration, Stats};

/// REST client; non-2xx answers become errors carrying the server's code and message.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    token: Option<String>,
}

impl Client {
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into().trim_end_matches('/').to_string(),
            agent: Self::agent(Duration::from_secs(30)),
            token: None,
        }
    }

    fn agent(timeout: Duration) -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into()
    }

    /// The same client, waiting up to `timeout` for each answer (30 s by default).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.agent = Self::agent(timeout);
        self
    }

    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// Sends a request; returns (status, body).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let url = format!("{}{}", self.base, path);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut resp = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("authorization", a);
                }
                r.call()
            }
            ("DELETE", _) => {
                let mut r = self.agent.delete(&url);
                if let Some(a) = &auth {
                    r = r.header("authorization", a);
                }
                r.call()
            }
            ("POST", b) => {
                let mut r = self.agent.post(&url);
                if let Some(a) = &auth {
                    r = r.header("authorization", a);
                }
                r.send_json(b.cloned().unwrap_or(Value::Null))
            }
            _ => bail!("unsupported method {method}"),
        }
        .map_err(|e| anyhow!("{method} {url}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, body))
    }

    /// Like [`Client::call`], failing on a non-2xx status with the server's error.
    pub fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, v) = self.call(method, path, body)?;
        if !(200..300).contains(&status) {
            bail!(
                "{method} {path}: {status} {}: {}",
                v["error"]["code"].as_str().unwrap_or("?"),
                v["error"]["message"].as_str().unwrap_or("")
            );
        }
        Ok(v)
    }

    /// A successful answer read as the server's view type `T` (the typed side of
    /// [`Client::ok`], which keeps the raw JSON for tests of the wire itself).
    pub fn typed<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T> {
        let v = self.ok(method, path, body)?;
        serde_json::from_value(v).with_context(|| format!("{method} {path}: unexpected answer"))
    }

    /// `GET /v1/datasets/{name}`.
    pub fn dataset(&self, name: &str) -> Result<DatasetView> {
        self.typed("GET", &format!("/v1/datasets/{name}"), None)
    }

    /// `GET /v1/jobs/{name}`.
    pub fn job(&self, name: &str) -> Result<JobView> {
        self.typed("GET", &format!("/v1/jobs/{name}"), None)
    }

    /// `GET /v1/jobs`.
    pub fn jobs(&self) -> Result<Vec<JobView>> {
        Ok(self.typed::<JobList>("GET", "/v1/jobs", None)?.jobs)
    }

    /// `GET /v1/stats`.
    pub fn stats(&self) -> Result<Stats> {
        self.typed("GET", "/v1/stats", None)
    }

    /// `POST /v1/jobs` with the request `body`.
    pub fn register(&self, body: &Value) -> Result<Registration> {
        self.typed("POST", "/v1/jobs", Some(body))
    }

    /// Waits until a dataset is `ready` (or fails with its error).
    pub fn wait_ready(&self, dataset: &str, timeout: Duration) -> Result<DatasetView> {
        let start = Instant::now();
        loop {
            let d = self.dataset(dataset)?;
            match d.state {
                DatasetState::Ready => return Ok(d),
                DatasetState::Failed => bail!(
                    "dataset {dataset} failed to index: {}",
                    d.error.unwrap_or_default()
                ),
                DatasetState::Indexing if start.elapsed() > timeout => {
                    bail!("dataset {dataset} is still indexing after {timeout:?}")
                }
                DatasetState::Indexing => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// What a consumer received.
#[derive(Debug, Default, Clone)]
pub struct Consumed {
    /// Per epoch: (element, label) in delivery order.
    pub epochs: Vec<Vec<(u32, i64)>>,
    /// Per epoch: failed elements (element, error code).
    pub errors: Vec<Vec<(u32, u32)>>,
    pub samples: u64,
    pub elapsed: Duration,
    /// How long the first `next_batch` waited (the job's start: registration and attach are
    /// before it, the Sampler's start window and the first loads in it).
    pub first_wait: Duration,
    /// The longest time one later `next_batch` waited (the longest the reader went without
    /// data once it had started).
    pub longest_wait: Duration,
}

/// How [`consume`] reads.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    pub batch: usize,
    pub max_samples: Option<u64>,
    pub hold: Duration,
}

/// The longest one read waits before it returns what it has (maybe nothing) and reads again.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A ring gave no record (data, error or end) for a whole deadline of [`consume_within`]: its
/// job stalled or deadlocked. A caller that knows the job adds the server's word on it.
#[derive(Debug, Clone)]
pub struct Stalled {
    pub ring: String,
    /// How long the ring gave nothing.
    pub waited: Duration,
    /// Samples (data and error records) read before.
    pub samples: u64,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ring {} gave no record for {:.0} s, after {} samples",
            self.ring,
            self.waited.as_secs_f64(),
            self.samples
        )
    }
}

impl std::error::Error for Stalled {}

/// Reads a ring until end of stream (or `max_samples`), acknowledging each batch after
/// `pause(batch_len, fetch_time)`; calls `progress(samples)` after each batch. With
/// `max_samples`, the last batch is kept unacknowledged and the reader attached for `hold`
/// before returning (a client that stops reading without leaving). Waits for records as long
/// as the server lives: [`consume_within`] gives up when none comes.
pub fn consume(
    instance: &str,
    ring: &str,
    opts: ReadOptions,
    pause: impl FnMut(usize, Duration) -> Duration,
    progress: impl FnMut(u64),
    check: impl FnMut(&dataplane::ItemMeta, &[u8]),
) -> Result<Consumed> {
    consume_within(instance, ring, opts, None, pause, progress, check)
}

/// [`consume`], failing with [`Stalled`] when the ring gives no record for `deadline` (a
/// read's timeout returns an empty batch: without a deadline, a job that never delivers again
/// would be read for ever).
pub fn consume_within(
    instance: &str,
    ring: &str,
    opts: ReadOptions,
    deadline: Option<Duration>,
    mut pause: impl FnMut(usize, Duration) -> Duration,
    mut progress: impl FnMut(u64),
    mut check: impl FnMut(&dataplane::ItemMeta, &[u8]),
) -> Result<Consumed> {
    let ReadOptions {
        batch,
        max_samples,
        hold,
    } = opts;
    let reader = dataplane::Reader::open(instance, ring)?;
    let mut out = Consumed::default();
    let start = Instant::now();
    // Since when the reader has been waiting for a record (its own pauses do not count).
    let mut waiting_since = start;
    let mut got_records = false;
    loop {
        let t = Instant::now();
        if got_records {
            waiting_since = t;
        }
        let timeout = deadline.map_or(READ_TIMEOUT, |d| {
            READ_TIMEOUT.min(d.saturating_sub(t.duration_since(waiting_since)))
        });
        let b = reader.next_batch(batch, Some(timeout))?;
        let fetch = t.elapsed();
        got_records = !b.is_empty()
            || !b.errors().is_empty()
            || b.end_of_epoch().is_some()
            || b.end_of_stream();
        if let Some(d) = deadline
            && !got_records
            && waiting_since.elapsed() >= d
        {
            return Err(Stalled {
                ring: ring.to_string(),
                waited: waiting_since.elapsed(),
                samples: out.samples,
            }
            .into());
        }
        if out.samples == 0 {
            out.first_wait = fetch;
        } else {
            out.longest_wait = out.longest_wait.max(fetch);
        }
        for item in b.items() {
            let e = item.meta.epoch as usize;
            if out.epochs.len() <= e {
                out.epochs.resize_with(e + 1, Vec::new);
                out.errors.resize_with(e + 1, Vec::new);
            }
            check(&item.meta, item.data);
            out.epochs[e].push((item.meta.element_id, item.meta.label));
        }
        for err in b.errors() {
            let e = err.epoch as usize;
            if out.errors.len() <= e {
                out.epochs.resize_with(e + 1, Vec::new);
                out.errors.resize_with(e + 1, Vec::new);
            }
            out.errors[e].push((err.element_id, err.code));
        }
        out.samples += (b.len() + b.errors().len()) as u64;
        let done = b.end_of_stream() || max_samples.is_some_and(|m| out.samples >= m);
        let n = b.len();
        if max_samples.is_some_and(|m| out.samples >= m) {
            progress(out.samples);
            std::thread::sleep(hold);
            break;
        }
        let wait = pause(n, fetch);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        drop(b);
        progress(out.samples);
        if done {
            break;
        }
    }
    out.elapsed = start.elapsed();
    Ok(out)
}

//! Observability end to end: `/metrics` after real jobs, the dashboards against what the
//! server exports, a real Prometheus scraping the server, and the web dashboard in a real
//! headless Chromium.
//!
//! The Prometheus and Chromium tests need Debian's `prometheus` and `chromium` packages.
//! `tests/all.sh` installs them and sets `JOADER_REQUIRE_TOOLS=1`, which turns a missing tool
//! into a failure; a plain `cargo test` without them prints that it skips those tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{TempDir, TestServer, joader_bin, unique_instance};

const CLASSES: u32 = 3;
const PER_CLASS: u32 = 10;

/// A small ImageFolder dataset with one file that is not an image (generated once).
fn dataset() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("joader-it-obs-data-{}", std::process::id()));
        let spec = actors::synth::SynthSpec {
            classes: CLASSES,
            per_class: PER_CLASS,
            width: 64,
            height: 48,
            quality: 90,
            seed: 11,
        };
        actors::synth::generate_image_folder(&dir, &spec, &mut |_| {})
            .expect("generate the test dataset");
        std::fs::write(dir.join("class_00").join("zz_not_an_image.jpg"), b"text").unwrap();
        dir
    })
}

/// Items in [`dataset`] (the broken file included).
const ITEMS: u64 = (CLASSES * PER_CLASS + 1) as u64;

struct Env {
    server: TestServer,
    _state: TempDir,
}

fn start(tag: &str, extra: &[&str]) -> Env {
    let state = TempDir::new(tag);
    let server = TestServer::start(&unique_instance(tag), &state.0, dataset(), extra);
    let env = Env {
        server,
        _state: state,
    };
    let c = env.server.client();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "imgs", "source": {"kind": "image_folder", "path": dataset()}})),
    )
    .unwrap();
    c.wait_ready("imgs", Duration::from_secs(60)).unwrap();
    env
}

/// `joader consume` in its own process.
fn consumer(url: &str, job: &Value, extra: &[&str]) -> Child {
    Command::new(joader_bin())
        .args(["consume", "--server", url, "--job", &job.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn joader consume")
}

fn finish(child: Child) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "consumer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn try_get_text(url: &str, token: Option<&str>) -> Result<(u16, String), ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let mut req = agent.get(url);
    if let Some(t) = token {
        req = req.header("authorization", &format!("Bearer {t}"));
    }
    let mut res = req.call()?;
    let status = res.status().as_u16();
    Ok((status, res.body_mut().read_to_string()?))
}

fn get_text(url: &str, token: Option<&str>) -> (u16, String) {
    try_get_text(url, token).unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// One sample of the Prometheus text format.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text exposition format strictly enough to catch malformed output:
/// every sample belongs to a family with a `# TYPE`, label sets are well-formed, values are
/// numbers, and no family is declared twice.
fn parse_prometheus(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let ctx = || format!("line {}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (name, ty) = (it.next().unwrap(), it.next().unwrap());
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty),
                "{}",
                ctx()
            );
            assert!(
                types.insert(name.to_string(), ty.to_string()).is_none(),
                "family declared twice: {}",
                ctx()
            );
            continue;
        }
        if line.starts_with('#') {
            assert!(line.starts_with("# HELP "), "{}", ctx());
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("{}", ctx()));
        let name = &line[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "bad metric name: {}",
            ctx()
        );
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(r) = rest.strip_prefix('{') {
            let close = r.rfind('}').unwrap_or_else(|| panic!("{}", ctx()));
            let mut body = &r[..close];
            while !body.is_empty() {
                let eq = body.find("=\"").unwrap_or_else(|| panic!("{}", ctx()));
                let key = &body[..eq];
                assert!(
                    key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "bad label name: {}",
                    ctx()
                );
                let mut value = String::new();
                let mut chars = body[eq + 2..].char_indices();
                let end = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, c)) => value.push(c),
                            None => panic!("{}", ctx()),
                        },
                        Some((i, '"')) => break eq + 2 + i + 1,
                        Some((_, c)) => value.push(c),
                        None => panic!("unterminated label value: {}", ctx()),
                    }
                };
                labels.insert(key.to_string(), value);
                body = body[end..].strip_prefix(',').unwrap_or(&body[end..]);
            }
            rest = &r[close + 1..];
        }
        let value = rest
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("{}", ctx()));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {}", ctx())),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        assert!(
            types.contains_key(family),
            "sample without # TYPE: {}",
            ctx()
        );
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    (types, samples)
}

/// The value of `name` with `labels` (a subset of its labels), summed over the other labels.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<f64> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

fn scrape(env: &Env) -> (BTreeMap<String, String>, Vec<Sample>) {
    let (status, text) = get_text(&format!("{}/metrics", env.server.url), None);
    assert_eq!(status, 200, "{text}");
    parse_prometheus(&text)
}

#[test]
fn metrics_count_what_the_jobs_did() {
    let env = start("metrics", &[]);
    let url = env.server.url.clone();
    let a = consumer(
        &url,
        &json!({"name": "a", "dataset": "imgs", "batch_size": 4, "epochs": 2}),
        &[],
    );
    let b = consumer(
        &url,
        &json!({"name": "b", "dataset": "imgs", "batch_size": 3, "epochs": 1, "seed": 5}),
        &[],
    );
    finish(a);
    finish(b);
    let c = env.server.client();
    // Route patterns, not raw paths, and refused or unknown requests are counted too.
    c.ok("GET", "/v1/jobs/a", None).unwrap();
    assert_eq!(c.call("GET", "/v1/jobs/nope", None).unwrap().0, 404);
    assert_eq!(c.call("GET", "/no/such/route", None).unwrap().0, 404);
    let stats = c.ok("GET", "/v1/stats", None).unwrap();
    let (types, s) = scrape(&env);
    let v = |name: &str, labels: &[(&str, &str)]| {
        value(&s, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in /metrics"))
    };

    for (family, ty) in [
        ("joader_cache_requests_total", "counter"),
        ("joader_cache_hits_total", "counter"),
        ("joader_cache_misses_total", "counter"),
        ("joader_decodes_total", "counter"),
        ("joader_decodes_saved_total", "counter"),
        ("joader_loads_total", "counter"),
        ("joader_storage_read_bytes_total", "counter"),
        ("joader_load_errors_total", "counter"),
        ("joader_load_failures_total", "counter"),
        ("joader_cache_evictions_total", "counter"),
        ("joader_sampler_rounds_total", "counter"),
        ("joader_sampler_picks_total", "counter"),
        ("joader_sampler_pick_jobs_total", "counter"),
        ("joader_loader_busy_seconds_total", "counter"),
        ("joader_job_delivered_samples_total", "counter"),
        ("joader_job_stall_seconds_total", "counter"),
        ("joader_ring_pushed_total", "counter"),
        ("joader_ring_popped_total", "counter"),
        ("joader_process_cpu_seconds_total", "counter"),
        ("joader_http_requests_total", "counter"),
        ("joader_http_request_duration_seconds", "histogram"),
        ("joader_shm_used_bytes", "gauge"),
        ("joader_shm_capacity_bytes", "gauge"),
        ("joader_cache_slots_in_use", "gauge"),
        ("joader_cache_slots_capacity", "gauge"),
        ("joader_loader_queue_depth", "gauge"),
        ("joader_loader_workers", "gauge"),
        ("joader_process_resident_memory_bytes", "gauge"),
        ("joader_job_samples_per_second", "gauge"),
        ("joader_job_epoch", "gauge"),
        ("joader_jobs", "gauge"),
    ] {
        assert_eq!(
            types.get(family).map(String::as_str),
            Some(ty),
            "{family} is missing or has the wrong type"
        );
    }
    for name in types.keys() {
        assert!(
            name.starts_with("joader_"),
            "{name} lacks the joader_ prefix"
        );
        if types[name] == "counter" {
            assert!(name.ends_with("_total"), "counter {name} lacks _total");
        }
    }

    // Exact counts: job a read 2 epochs, job b one, every element (the broken one as an error
    // record) once per epoch.
    let requests = v("joader_cache_requests_total", &[]);
    assert_eq!(requests, (3 * ITEMS) as f64);
    assert_eq!(
        requests,
        v("joader_cache_hits_total", &[]) + v("joader_cache_misses_total", &[])
    );
    assert!(
        v("joader_cache_hits_total", &[]) > 0.0,
        "the jobs shared nothing"
    );
    assert_eq!(
        v("joader_decodes_saved_total", &[]),
        v("joader_cache_hits_total", &[])
    );
    assert_eq!(
        v(
            "joader_job_delivered_samples_total",
            &[("job", "a"), ("dataset", "imgs")]
        ),
        (2 * ITEMS) as f64
    );
    assert_eq!(
        v("joader_job_delivered_samples_total", &[("job", "b")]),
        ITEMS as f64
    );
    for job in ["a", "b"] {
        assert_eq!(
            v("joader_ring_pushed_total", &[("job", job)]),
            v("joader_ring_popped_total", &[("job", job)]),
            "job {job}'s ring is drained"
        );
        assert!(v("joader_job_sampled_total", &[("job", job)]) > 0.0);
    }
    assert!(
        v("joader_job_stall_seconds_total", &[]) > 0.0,
        "unpaced clients on a cold cache wait for decodes"
    );
    assert_eq!(
        v("joader_decodes_total", &[]),
        stats["decodes"].as_f64().unwrap()
    );
    assert!(v("joader_decodes_total", &[]) >= (ITEMS - 1) as f64);
    assert!(v("joader_loads_total", &[]) >= ITEMS as f64);
    assert!(v("joader_storage_read_bytes_total", &[]) > 1000.0);
    assert!(v("joader_load_failures_total", &[("kind", "not_an_image")]) >= 1.0);
    assert!(v("joader_load_errors_total", &[]) >= 1.0);
    assert!(v("joader_sampler_rounds_total", &[]) > 0.0);
    assert_eq!(v("joader_sampler_pick_jobs_total", &[]), requests);
    assert!(
        v("joader_sampler_picks_total", &[]) < requests,
        "no pick was shared"
    );
    assert!(v("joader_loader_busy_seconds_total", &[]) > 0.0);
    assert!(v("joader_shm_used_bytes", &[]) > 0.0);
    assert_eq!(v("joader_shm_capacity_bytes", &[]), 268_435_456.0);
    assert_eq!(v("joader_cache_slots_in_use", &[]), (ITEMS - 1) as f64);
    assert_eq!(v("joader_cache_slots_capacity", &[]), 4096.0);
    assert!(v("joader_process_cpu_seconds_total", &[]) > 0.0);
    assert!(v("joader_process_resident_memory_bytes", &[]) > 1e6);
    assert_eq!(v("joader_jobs", &[("state", "finished")]), 2.0);
    assert_eq!(v("joader_job_epoch", &[("job", "a")]), 1.0);
    assert_eq!(
        v(
            "joader_http_requests_total",
            &[("method", "POST"), ("route", "/v1/jobs"), ("status", "201")]
        ),
        2.0
    );
    assert_eq!(
        v(
            "joader_http_requests_total",
            &[("route", "/v1/jobs/{name}"), ("status", "404")]
        ),
        1.0
    );
    assert!(
        v(
            "joader_http_requests_total",
            &[("route", "unmatched"), ("status", "404")]
        ) >= 1.0
    );
    assert!(
        v(
            "joader_http_request_duration_seconds_count",
            &[("route", "/v1/jobs/{name}")]
        ) >= 2.0
    );
    // Low cardinality: no raw paths, no element ids.
    for sample in &s {
        for (k, val) in &sample.labels {
            assert!(
                [
                    "job", "dataset", "kind", "state", "method", "route", "status", "le", "version"
                ]
                .contains(&k.as_str()),
                "unexpected label {k} on {}",
                sample.name
            );
            assert!(
                !(k == "route" && (val.contains("/a") || val.contains("nope"))),
                "raw path as a label: {sample:?}"
            );
        }
    }

    // A reused job name continues its series: counters never go down.
    let again = consumer(
        &url,
        &json!({"name": "b", "dataset": "imgs", "batch_size": 3, "epochs": 1, "seed": 6}),
        &[],
    );
    finish(again);
    let (_, s2) = scrape(&env);
    assert_eq!(
        value(&s2, "joader_job_delivered_samples_total", &[("job", "b")]),
        Some((2 * ITEMS) as f64)
    );
    // The process figures are in /v1/stats too (the dashboard reads those).
    let stats = c.ok("GET", "/v1/stats", None).unwrap();
    assert!(stats["process_cpu_s"].as_f64().unwrap() > 0.0, "{stats}");
    assert!(stats["process_rss_bytes"].as_u64().unwrap() > 0, "{stats}");
}

#[test]
fn metrics_require_the_token_when_one_is_set() {
    let state = TempDir::new("obs-token");
    let server = TestServer::start(
        &unique_instance("obstoken"),
        &state.0,
        dataset(),
        &["--token", "s3cret"],
    );
    let url = format!("{}/metrics", server.url);
    let (status, body) = get_text(&url, None);
    assert_eq!(status, 401, "{body}");
    let (status, body) = get_text(&url, Some("wrong"));
    assert_eq!(status, 401, "{body}");
    let (status, body) = get_text(&url, Some("s3cret"));
    assert_eq!(status, 200, "{body}");
    let (_, samples) = parse_prometheus(&body);
    assert_eq!(
        value(
            &samples,
            "joader_http_requests_total",
            &[("route", "/metrics"), ("status", "401")]
        ),
        Some(2.0),
        "refused requests are counted"
    );
    // The dashboard page itself is public; its data calls carry the token.
    let (status, page) = get_text(&format!("{}/", server.url), None);
    assert_eq!(status, 200);
    assert!(page.contains("<title>joader</title>"), "{page}");
}

//! Working sets against a real server: `joader preload` (a separate process) pins a subset,
//! a job started after it decodes nothing, pins outlast another job's pressure until
//! released, and what cannot fit is refused with how much would.

use std::process::Command;

use serde_json::{Value, json};

use crate::common::{consumer, finish, joader_bin, scrape, series};
use crate::server::{create_folder_dataset, dataset, start_with};

/// 160x120 RGB: 57,600 bytes an element.
fn pipeline() -> Value {
    json!({"kind": "decode", "resize_shorter": 120})
}

fn preload_cli(url: &str, dataset: &str, extra: &[&str]) -> std::process::Output {
    Command::new(joader_bin())
        .args(["preload", dataset, "--server", url])
        .args(extra)
        .output()
        .expect("run joader preload")
}

fn decodes(c: &joader_tools::client::Client) -> u64 {
    c.ok("GET", "/v1/stats", None).unwrap()["decodes"]
        .as_u64()
        .unwrap()
}

/// One job over `subset` for `epochs`, read by `joader consume`; returns its summary.
fn job(url: &str, name: &str, subset: Value, epochs: u32) -> Value {
    let job = json!({"name": name, "dataset": "imgs", "batch_size": 4, "epochs": epochs,
        "subset": subset, "pipeline": pipeline(), "ring_capacity": 8});
    finish(consumer(url, &job, &[]))
}

fn job_counts(c: &joader_tools::client::Client, name: &str) -> (u64, u64) {
    let j = c.ok("GET", &format!("/v1/jobs/{name}"), None).unwrap();
    (j["hits"].as_u64().unwrap(), j["misses"].as_u64().unwrap())
}

#[test]
fn a_job_on_a_preloaded_working_set_decodes_nothing() {
    let root = dataset();
    let env = start_with("preload", root, &[]);
    create_folder_dataset(&env, "imgs", root);
    let (url, c) = (env.server.url.clone(), env.server.client());
    let pipe = pipeline().to_string();
    let out = preload_cli(
        &url,
        "imgs",
        &[
            "--subset",
            r#"{"start": 0, "end": 30}"#,
            "--pipeline",
            &pipe,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            p["state"].as_str(),
            p["elements"].as_u64(),
            p["pinned"].as_u64()
        ),
        (Some("ready"), Some(30), Some(30)),
        "{p}"
    );
    assert_eq!(p["pinned_bytes"], json!(30 * 57_600));
    assert_eq!(decodes(&c), 30);
    let d = c.ok("GET", "/v1/datasets/imgs", None).unwrap();
    assert_eq!(d["preload"]["state"], "ready", "{d}");
    assert_eq!(
        d["preload"]["request"]["pipeline"]["resize_shorter"], 120,
        "{d}"
    );
    let text = scrape(&url);
    assert_eq!(
        series(
            &text,
            r#"joader_preload_elements{dataset="imgs",kind="pinned"}"#
        ),
        Some(30.0)
    );
    assert_eq!(
        series(&text, r#"joader_preload_pinned_bytes{dataset="imgs"}"#),
        Some(30.0 * 57_600.0)
    );

    let summary = job(&url, "after", json!({"start": 0, "end": 30}), 2);
    assert_eq!(summary["epochs"].as_array().unwrap().len(), 2);
    assert_eq!(job_counts(&c, "after"), (60, 0), "every delivery a hit");
    assert_eq!(decodes(&c), 30, "the job decoded nothing");

    // One preload per dataset; a working set beyond half the cache is refused with how much fits.
    let (status, body) = c
        .call("POST", "/v1/datasets/imgs/preload", Some(&json!({})))
        .unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("preload_exists")),
        "{body}"
    );
    let (status, _) = c.call("DELETE", "/v1/datasets/imgs/preload", None).unwrap();
    assert_eq!(status, 204);
    let (status, body) = c.call("DELETE", "/v1/datasets/imgs/preload", None).unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("preload_not_found"))
    );
    let huge = json!({"pipeline": {"kind": "decode", "resize_shorter": 2048, "center_crop": [2048, 2048]}});
    let (status, body) = c
        .call("POST", "/v1/datasets/imgs/preload", Some(&huge))
        .unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("pin_budget")),
        "{body}"
    );
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("about 10 elements fit"), "{msg}");
    let (status, body) = c
        .call(
            "POST",
            "/v1/datasets/imgs/preload",
            Some(&json!({"keep": "disk"})),
        )
        .unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let (status, body) = c
        .call(
            "POST",
            "/v1/datasets/imgs/preload",
            Some(&json!({"subset": {"classes": ["none"]}})),
        )
        .unwrap();
    assert_eq!(status / 100, 4, "{body}");
    // The CLI says why it failed, and releases.
    let out = preload_cli(&url, "imgs", &["--pipeline", &huge["pipeline"].to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pin_budget"));
    let out = preload_cli(&url, "imgs", &["--no-wait", "--pipeline", &pipe]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = preload_cli(&url, "imgs", &["--release"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(c.ok("GET", "/v1/datasets/imgs", None).unwrap()["preload"].is_null());
}

#[test]
fn pins_outlast_another_jobs_pressure_until_released() {
    let root = dataset();
    // 1 MiB holds about 18 elements; preloads may pin 9.
    let env = start_with("pins", root, &["--cache-bytes", "1MiB"]);
    create_folder_dataset(&env, "imgs", root);
    let (url, c) = (env.server.url.clone(), env.server.client());
    let body = json!({"subset": {"start": 0, "end": 8}, "pipeline": pipeline()});
    c.ok("POST", "/v1/datasets/imgs/preload", Some(&body))
        .unwrap();
    crate::common::wait_for("the preload to be ready", || {
        let d = c.ok("GET", "/v1/datasets/imgs", None).unwrap();
        (d["preload"]["state"] == "ready").then_some(())
    });
    job(&url, "pressure", json!({"start": 8, "end": 48}), 2);
    let evictions = c.ok("GET", "/v1/stats", None).unwrap()["evictions"]
        .as_u64()
        .unwrap();
    assert!(evictions > 0, "the other job's 40 elements did not fit");
    job(&url, "pinned", json!({"start": 0, "end": 8}), 1);
    assert_eq!(
        job_counts(&c, "pinned"),
        (8, 0),
        "the working set survived the pressure"
    );

    c.ok("DELETE", "/v1/datasets/imgs/preload", None).unwrap();
    job(&url, "pressure2", json!({"start": 8, "end": 48}), 2);
    job(&url, "released", json!({"start": 0, "end": 8}), 1);
    let (_, misses) = job_counts(&c, "released");
    assert!(misses > 0, "released, the working set was evicted");
}

#[test]
fn a_restarted_server_preloads_the_kept_working_set_again_until_released() {
    let root = dataset();
    let state = crate::common::TempDir::new("preload-restart");
    let instance = crate::common::unique_instance("prestart");
    let mut first = crate::common::TestServer::start(&instance, &state.0, root, &[]);
    let c = first.client();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "imgs", "source": {"kind": "image_folder", "path": root}})),
    )
    .unwrap();
    c.wait_ready("imgs", crate::common::DEADLINE).unwrap();
    let body = json!({"subset": {"start": 0, "end": 20}, "pipeline": pipeline()});
    c.ok("POST", "/v1/datasets/imgs/preload", Some(&body))
        .unwrap();
    assert!(first.stop(), "the first server stops cleanly");

    let preloaded = |c: &joader_tools::client::Client| {
        crate::common::wait_for("the kept preload to be ready again", || {
            let d = c.ok("GET", "/v1/datasets/imgs", None).unwrap();
            (d["preload"]["state"] == "ready").then_some(d["preload"].clone())
        })
    };
    let mut second = crate::common::TestServer::start(&instance, &state.0, root, &[]);
    let c = second.client();
    let p = preloaded(&c);
    assert_eq!(
        (p["elements"].as_u64(), p["pinned"].as_u64()),
        (Some(20), Some(20)),
        "{p}"
    );
    assert_eq!(
        decodes(&c),
        20,
        "preloaded again by the new server, before any job"
    );
    job(
        &second.url,
        "after-restart",
        json!({"start": 0, "end": 20}),
        1,
    );
    assert_eq!(job_counts(&c, "after-restart"), (20, 0));
    // Released, it is not preloaded by the next start.
    c.ok("DELETE", "/v1/datasets/imgs/preload", None).unwrap();
    assert!(second.stop());
    let third = crate::common::TestServer::start(&instance, &state.0, root, &[]);
    let c = third.client();
    c.wait_ready("imgs", crate::common::DEADLINE).unwrap();
    let d = c.ok("GET", "/v1/datasets/imgs", None).unwrap();
    assert!(d["preload"].is_null(), "{d}");
    assert_eq!(decodes(&c), 0);
}

//! A tiny `joader bench e2e` so that the benchmark cannot rot.

use crate::common::{TempDir, joader, joader_bin};

#[test]
fn bench_e2e_quick_writes_its_table_and_chart() {
    let dir = TempDir::new("bench");
    let data = dir.0.join("data");
    let out = dir.0.join("out");
    let o = joader(&[
        "bench",
        "e2e",
        "--quick",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("e2e.md")).unwrap();
    for row in [
        "| sync K=1 | joader |",
        "| sync K=2 | independent |",
        "| overlap 50% | joader |",
    ] {
        assert!(md.contains(row), "missing {row} in\n{md}");
    }
    // With two identical jobs joader decodes each element at most once per epoch.
    let k2 = md
        .lines()
        .find(|l| l.starts_with("| sync K=2 | joader |"))
        .unwrap();
    let decodes_per_sample: f64 = k2.split('|').nth(6).unwrap().trim().parse().unwrap();
    assert!(decodes_per_sample <= 0.5 + 1e-9, "{k2}");
    // joader's CPU by stage: a row per scenario, decode and resize measured.
    let stages = md
        .split("joader's CPU by stage")
        .nth(1)
        .unwrap_or_else(|| panic!("no stage table in\n{md}"));
    let header: Vec<&str> = stages
        .lines()
        .find(|l| l.starts_with("| scenario |"))
        .unwrap()
        .split('|')
        .map(str::trim)
        .collect();
    let row: Vec<&str> = stages
        .lines()
        .find(|l| l.starts_with("| sync K=2 |"))
        .unwrap()
        .split('|')
        .map(str::trim)
        .collect();
    for stage in ["decode", "resize", "crop_resize"] {
        let i = header.iter().position(|h| *h == stage).unwrap();
        let ms: f64 = row[i].parse().unwrap();
        assert!(ms > 0.0, "{stage}: {ms} in\n{stages}");
    }
    let png = std::fs::read(out.join("e2e.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
}

/// A tiny `joader bench scale`: it runs its servers and consumers as processes, prints its
/// table and a JSON line with every figure, and leaves nothing in `/dev/shm`. The figures
/// themselves are the benchmark's business, not the test's.
#[test]
fn bench_scale_quick_prints_every_figure() {
    let dir = TempDir::new("bench-scale");
    let child = std::process::Command::new(joader_bin())
        .args(["bench", "scale", "--quick", "--data"])
        .arg(dir.0.join("data"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run joader bench scale");
    // The servers' instances are named after the bench's process.
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for row in [
        "| index: time until ready (index + persist) |",
        "| index: RssAnon growth |",
        "| registration of 8 jobs",
        "| RssAnon growth per registered job |",
        "| idle CPU with 8 registered jobs (from 3 s after the last registration) |",
        "| mix: cache bytes | 38535168 = (1 paused rings x 64 + 2 x 32 x 3 attached jobs) x 150528 |",
        "| mix: fast jobs' rate / rate alone |",
        "| mix: fast jobs' wait for their first batch |",
        "| mix: fast jobs' longest wait for one later batch |",
        "| mix: reloads / evictions_needed |",
    ] {
        assert!(stdout.contains(row), "missing {row} in\n{stdout}");
    }
    let last = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last).expect("a JSON line last");
    assert_eq!(v["bench"], "scale");
    assert_eq!(v["items"], 5000);
    assert_eq!(v["jobs"], 8);
    for key in [
        "ready_s",
        "rss_bytes_per_item",
        "index_bytes_per_item",
        "register_total_s",
        "rss_bytes_per_job",
        "idle_cpu_percent",
        "alone_samples_per_s",
        "alone_longest_wait_s",
        "alone_first_wait_s",
        "alone_stall_s",
    ] {
        assert!(v[key].as_f64().is_some_and(f64::is_finite), "{key} in {v}");
    }
    for key in ["cache_bytes", "reloads", "evictions_needed"] {
        assert!(v[key].as_u64().is_some(), "{key} in {v}");
    }
    for (key, n) in [
        ("fast_fraction_of_alone", 1),
        ("fast_stall_s", 1),
        ("fast_longest_wait_s", 1),
        ("fast_first_wait_s", 1),
        ("slow_samples_per_s", 1),
        ("slow_hit_ratio", 1),
    ] {
        let list = v[key].as_array().unwrap_or_else(|| panic!("{key} in {v}"));
        assert_eq!(list.len(), n, "{key} in {v}");
        assert!(list.iter().all(|x| x.as_f64().is_some()), "{key} in {v}");
    }
    let leftover: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("joader-bench_scale_") && n.contains(&format!("_{pid}-")))
        .collect();
    assert!(leftover.is_empty(), "left in /dev/shm: {leftover:?}");
}

/// A tiny `joader bench cluster`: a leader and three followers as processes; it prints every
/// row and a JSON line whose counts are consistent (decodes between the union and the sum of
/// the subsets; the placement rule's count between N and 2N; a job whose leader was killed
/// and restarted exact in every epoch). The speed figures are the benchmark's business.
#[test]
fn bench_cluster_quick_prints_every_figure() {
    let dir = TempDir::new("bench-cluster");
    let o = std::process::Command::new(joader_bin())
        .args(["bench", "cluster", "--quick", "--data"])
        .arg(dir.0.join("data"))
        .output()
        .expect("run joader bench cluster");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for row in [
        "| 4 multi-node jobs on the same nodes: decodes per epoch / union |",
        "| jobs on nodes {0,1} and {1,2}: decodes per epoch |",
        "| per-rank samples/s: 3-rank job on 3 nodes / on one server |",
        "| leader CPU |",
        "| leader restart: 3-rank job, 3 epochs (",
    ] {
        assert!(stdout.contains(row), "missing {row} in\n{stdout}");
    }
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(v["bench"], "cluster");
    let (loads, union, sum) = (
        v["same_nodes_loads"].as_u64().unwrap(),
        v["same_nodes_union"].as_u64().unwrap(),
        v["same_nodes_sum"].as_u64().unwrap(),
    );
    assert_eq!(union, 105, "{v}");
    assert!(union <= loads && loads <= sum, "{v}");
    let rule = v["node_sets_rule"].as_u64().unwrap();
    assert!((120..=240).contains(&rule), "{v}");
    assert!(v["node_sets_loads"].as_u64().unwrap() >= 120, "{v}");
    assert_eq!(v["cluster_rank_samples_per_s"].as_array().unwrap().len(), 3);
    // Part 5: the job whose leader was killed and restarted finished every epoch exactly (the
    // bench fails otherwise) and decoded every element at least once, as the undisturbed one.
    let restart = &v["restart"];
    assert_eq!(restart["union"], 120, "{v}");
    for run in ["restarted", "steady"] {
        let r = &restart[run];
        assert_eq!(r["exact"], true, "{run}: {v}");
        assert_eq!(
            r["rank_pause_s"].as_array().map(Vec::len),
            Some(3),
            "{run}: {v}"
        );
        assert!(r["loads"].as_u64().unwrap() >= 120, "{run}: {v}");
    }
    assert!(restart["resumed_ms"].as_f64().unwrap() > 0.0, "{v}");
    // Part 4 runs where the tests have s3s-fs (tests/all.sh installs it).
    if crate::s3::s3s_fs("bench_cluster_quick_prints_every_figure (part 4)").is_some() {
        assert!(
            stdout.contains("| 3-rank job from a store +30 ms (s3s-fs;"),
            "{stdout}"
        );
        let store = &v["store"];
        for k in [
            "disk_rank_samples_per_s",
            "store_rank_samples_per_s",
            "store_no_fetch_ahead_rank_samples_per_s",
        ] {
            assert_eq!(store[k].as_array().map(Vec::len), Some(3), "{k}: {v}");
        }
        // Every sample of the store job was read from the store once per epoch: its GETs per
        // sample are at most 1 (fewer where an element was still cached).
        let gets = store["gets_per_sample"].as_f64().unwrap();
        assert!(gets > 0.0 && gets <= 1.0, "{v}");
    }
}

/// `joader bench e2e --quick --only "gpu lock"`: the GPU-lock scenario runs on real photos
/// (those of the installed scikit-image and scikit-learn) with a `joader serve` child and
/// prints its section, every figure present; two jobs of one dataset sampled together share
/// their decodes, far below what two unshared jobs decode.
#[test]
fn bench_e2e_gpu_lock_prints_its_section() {
    let dir = TempDir::new("bench-gpu-lock");
    let out = dir.0.join("out");
    let o = joader(&[
        "bench",
        "e2e",
        "--quick",
        "--only",
        "gpu lock",
        "--data",
        dir.0.join("data").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("e2e.md")).unwrap();
    let figure = |name: &str| -> f64 {
        let line = md
            .lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no row {name:?} in\n{md}"));
        let cell = line.split('|').nth(2).unwrap().trim();
        cell.split([' ', 'x'])
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    assert!(md.contains("### GPU lock: 2 jobs"), "{md}");
    // 2 jobs x 2 epochs of 240 images, a cache of 36% of them. Shared decodes: each image
    // once in the first epoch and the misses of the second, (240 + 0.64 x 240) / 960 = 0.41.
    // Without sharing each job decodes its own first epoch and its misses of the second:
    // (480 + 0.64 x 480) / 960 = 0.82. The bound lies between, with room for what the
    // small cache evicts early.
    let decodes = figure("decodes per delivered image");
    assert!(decodes > 0.0 && decodes <= 0.6, "{md}");
    assert!(figure("server CPU ms per decode") > 0.0, "{md}");
    assert!(figure("bare pipeline CPU ms per image") > 0.0, "{md}");
    assert!(figure("bare pipeline on") > 0.0, "{md}");
    assert!(
        figure("server CPU per decode / bare pipeline on") > 0.0,
        "{md}"
    );
    assert!(figure("images/s, all jobs") > 0.0, "{md}");
    // No other scenario ran.
    assert!(!md.contains("| sync K=1 |"), "{md}");
}

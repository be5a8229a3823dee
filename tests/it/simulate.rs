//! `joader simulate` end to end: flags, JSON output, traces, presets and errors.

use std::collections::BTreeSet;

use crate::common::{TempDir, joader};

fn json_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn simulate_jobs_json_and_trace() {
    let dir = TempDir::new("sim");
    let trace = dir.0.join("trace.jsonl");
    let out = joader(&[
        "simulate",
        "--job",
        "range:0:200",
        "--job",
        "range:100:300,start=5,speed=0.5,epochs=2",
        "--job",
        "ids:3,150,250,999",
        "--sampler",
        "dsa,isa",
        "--policy",
        "refcnt,lru",
        "--cache-sizes",
        "1,50,1000",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = json_lines(&out.stdout);
    assert_eq!(rows.len(), 2 * 2 * 3);
    for r in &rows {
        let misses = r["misses"].as_f64().unwrap();
        assert!(misses >= r["union_size"].as_f64().unwrap());
        assert!(misses <= r["sum_sizes"].as_f64().unwrap());
        assert_eq!(r["accesses"].as_f64().unwrap(), 200.0 + 400.0 + 4.0);
    }
    let lines = json_lines(&std::fs::read(&trace).unwrap());
    // 2 samplers x (job 0: 1 epoch, job 1: 2 epochs, job 2: 1 epoch)
    assert_eq!(lines.len(), 2 * 4);
    for l in &lines {
        let ids: Vec<u64> = l["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let set: BTreeSet<u64> = ids.iter().copied().collect();
        assert_eq!(set.len(), ids.len(), "an id repeats within an epoch");
        let want: BTreeSet<u64> = match l["job"].as_u64().unwrap() {
            0 => (0..200).collect(),
            1 => (100..300).collect(),
            _ => [3, 150, 250, 999].into(),
        };
        assert_eq!(set, want);
    }
}

#[test]
fn simulate_preset_paper_a2() {
    let out = joader(&[
        "simulate",
        "--preset",
        "paper-a2",
        "--cache-sizes",
        "1,10000",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = json_lines(&out.stdout);
    // 10 two-sampler cases and 2 five-policy cases, two cache sizes each.
    assert_eq!(rows.len(), (10 * 2 + 2 * 5) * 2);
    let identical = rows
        .iter()
        .find(|r| {
            r["scenario"].as_str().unwrap().starts_with("fig4a")
                && r["scenario"]
                    .as_str()
                    .unwrap()
                    .ends_with("D2=range:0:10000")
                && r["sampler"] == "dsa"
                && r["cache_size"] == 1
        })
        .unwrap();
    assert_eq!(
        identical["misses"], 10000.0,
        "DSA shares everything between identical datasets"
    );
    // A cache that holds the union misses each element exactly once.
    for r in rows
        .iter()
        .filter(|r| r["union_size"].as_f64().unwrap() <= r["cache_size"].as_f64().unwrap())
    {
        assert_eq!(r["misses"], r["union_size"], "{r}");
    }
}

#[test]
fn simulate_reads_a_toml_scenario() {
    let dir = TempDir::new("simtoml");
    let path = dir.0.join("s.toml");
    std::fs::write(
        &path,
        "seed = 3\nsamplers = [\"dsa\"]\npolicies = [\"clairvoyant\", \"fifo\"]\ncache_sizes = [10]\n\
         [[jobs]]\ndataset = \"range:0:100\"\n[[jobs]]\ndataset = [1, 2, 3, 50]\nstart = 2\nspeed = 0.25\n",
    )
    .unwrap();
    let out = joader(&["simulate", "--config", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("dsa/clairvoyant") && text.contains("dsa/fifo"),
        "{text}"
    );
}

#[test]
fn simulate_rejects_bad_input_clearly() {
    for (args, needle) in [
        (
            vec!["simulate", "--job", "range:5:5"],
            "range start must be below its end",
        ),
        (
            vec!["simulate", "--job", "range:0:10,speed=-1"],
            "speed must be a positive number",
        ),
        (
            vec!["simulate", "--job", "range:0:10", "--policy", "mru"],
            "unknown cache policy",
        ),
        (vec!["simulate"], "exactly one of"),
        (
            vec!["simulate", "--config", "/nonexistent/x.toml"],
            "cannot read",
        ),
    ] {
        let out = joader(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: stderr was {err}");
    }
}

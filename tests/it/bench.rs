//! A tiny `joader bench e2e` so that the benchmark cannot rot.

use crate::common::{TempDir, joader};

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
    let png = std::fs::read(out.join("e2e.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
}

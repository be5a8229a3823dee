//! Samples with several fields (issue 29) and samples that are not images (issue 45) in the
//! benches: `joader bench e2e --fields` and `--arrays`, tiny,
//! so that the bench cannot rot. The Python suite (`tests/python/test_fields.py`) checks the
//! fields themselves against a real `joader serve`; the storage crate's tests check the
//! layouts' parsing.

use crate::common::{TempDir, joader};
use crate::parquet::cells;

/// Both declarations' rows with every figure, for the WebDataset shards and for the Parquet
/// files; what is exact is checked: four jobs of one dataset decode no element for more than
/// one of them, and an item with fields reads its key's whole range, more bytes than its image
/// alone (shards).
#[test]
fn bench_e2e_fields_prints_its_rows() {
    let dir = TempDir::new("bench-fields");
    let out = dir.0.join("out");
    let o = joader(&[
        "bench",
        "e2e",
        "--quick",
        "--fields",
        "--only",
        "fields",
        "--data",
        dir.0.join("data").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("e2e.md")).unwrap();
    let mut read = Vec::new();
    for declaration in ["image + class", "+ caption + json"] {
        let row = cells(&md, &format!("| joader serve, {declaration} | 1 |"));
        let figures: Vec<f64> = row[3..8].iter().map(|c| c.parse().unwrap()).collect();
        assert!(figures.iter().all(|f| *f > 0.0), "{declaration}: {row:?}");
        assert!(figures[2] <= 1.0, "{declaration}: {row:?}");
        read.push(figures[4]);
    }
    assert!(read[1] > read[0], "{md}");
    for declaration in ["parquet image + class", "parquet + caption + struct"] {
        let row = cells(&md, &format!("| joader serve, {declaration} | 1 |"));
        let figures: Vec<f64> = row[3..8].iter().map(|c| c.parse().unwrap()).collect();
        assert!(figures.iter().all(|f| *f > 0.0), "{declaration}: {row:?}");
        assert!(figures[2] <= 1.0, "{declaration}: {row:?}");
    }
    assert_eq!(
        md.matches("with fields / without, mean of the rounds: throughput")
            .count(),
        2,
        "{md}"
    );
    assert!(md.contains("the same Parquet files: a string column and a struct column"));
}

/// `joader bench e2e --arrays`, tiny: the rows of a `.npy` file through an `array` dataset and
/// through NumPy memmap readers, every figure printed; what is exact is checked: the server
/// read each row once for the four jobs (its cache holds them all), each NumPy process read its
/// own.
#[test]
fn bench_e2e_arrays_prints_its_rows() {
    let dir = TempDir::new("bench-arrays");
    let out = dir.0.join("out");
    let o = joader(&[
        "bench",
        "e2e",
        "--quick",
        "--arrays",
        "--only",
        "arrays",
        "--data",
        dir.0.join("data").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("e2e.md")).unwrap();
    for system in ["numpy memmap", "joader"] {
        let row = cells(&md, &format!("| 1 | {system} |"));
        let rate: f64 = row[3].parse().unwrap();
        let cpu: f64 = row[4].split_whitespace().next().unwrap().parse().unwrap();
        assert!(rate > 0.0 && cpu > 0.0, "{row:?}");
        let reads = row[7];
        if system == "joader" {
            assert_eq!(reads, "1.00", "{md}");
        } else {
            assert!(reads.starts_with("4 "), "{md}");
        }
    }
    assert!(
        md.contains("joader / numpy memmap, mean of the rounds"),
        "{md}"
    );
    // With an s3s-fs (the test command builds one), the rows in a bucket: dependent sampling
    // fetches each row once for the 4 jobs.
    if std::env::var_os("JOADER_S3S_FS").is_some() {
        let dsa = cells(&md, "| 1 | joader, s3, dsa |");
        assert_eq!((dsa[5], dsa[7]), ("1.00", "1.00"), "{md}");
        let isa = cells(&md, "| 1 | joader, s3, isa |");
        assert!(isa[5].parse::<f64>().unwrap() >= 1.0, "{md}");
        assert!(md.contains("DSA / ISA, mean of the rounds"), "{md}");
    }
}

//! The generated dataset: deterministic, reused, decodable, photo-like in size.

use super::*;
use joader_pipeline::{Limits, Output, Pipeline, run};

fn small() -> SynthSpec {
    SynthSpec {
        classes: 3,
        per_class: 4,
        width: 160,
        height: 120,
        quality: 90,
        seed: 7,
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for class in fs::read_dir(dir).unwrap() {
        let class = class.unwrap().path();
        if class.is_dir() {
            for f in fs::read_dir(&class).unwrap() {
                out.push(f.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn writes_an_image_folder_that_decodes() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = small();
    let mut seen = Vec::new();
    let n = generate_image_folder(tmp.path(), &spec, &mut |k| seen.push(k)).unwrap();
    assert_eq!(n, 12);
    assert_eq!(seen.last(), Some(&12));
    let all = files(tmp.path());
    assert_eq!(all.len(), 12);
    assert_eq!(all[0], tmp.path().join("class_00/img_00000.jpg"));
    assert_eq!(all[11], tmp.path().join("class_02/img_00003.jpg"));
    assert!(tmp.path().join(MARKER).is_file());
    for f in &all {
        let bytes = fs::read(f).unwrap();
        let out = run(
            &Pipeline::Decode {
                resize_shorter: None,
                center_crop: None,
            },
            &bytes,
            &Limits::default(),
        )
        .unwrap();
        let Output::Hwc {
            data,
            height,
            width,
            ..
        } = out
        else {
            panic!("not pixels")
        };
        assert_eq!((height, width), (120, 160));
        // Not flat: many distinct values and a real spread.
        let mut distinct = [false; 256];
        for v in &data {
            distinct[*v as usize] = true;
        }
        assert!(
            distinct.iter().filter(|d| **d).count() > 100,
            "{}",
            f.display()
        );
    }
}

#[test]
fn reruns_reuse_and_other_specs_regenerate() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = small();
    generate_image_folder(tmp.path(), &spec, &mut |_| {}).unwrap();
    let first = fs::read(image_path(tmp.path(), 1, 2)).unwrap();

    // Same spec: nothing is written (a file we damage stays damaged).
    fs::write(image_path(tmp.path(), 0, 0), b"damaged").unwrap();
    let mut calls = 0;
    let n = generate_image_folder(tmp.path(), &spec, &mut |_| calls += 1).unwrap();
    assert_eq!((n, calls), (12, 0));
    assert_eq!(fs::read(image_path(tmp.path(), 0, 0)).unwrap(), b"damaged");

    // A smaller spec with another seed: regenerated, stale files removed, other files kept.
    fs::write(tmp.path().join("notes.txt"), b"mine").unwrap();
    let other = SynthSpec {
        classes: 2,
        per_class: 3,
        seed: 8,
        ..spec
    };
    assert_eq!(
        generate_image_folder(tmp.path(), &other, &mut |_| {}).unwrap(),
        6
    );
    assert_eq!(files(tmp.path()).len(), 6);
    assert!(tmp.path().join("notes.txt").is_file());
    assert_ne!(fs::read(image_path(tmp.path(), 1, 2)).unwrap(), first);

    // Back to the first spec: the very same bytes (deterministic).
    generate_image_folder(tmp.path(), &spec, &mut |_| {}).unwrap();
    assert_eq!(fs::read(image_path(tmp.path(), 1, 2)).unwrap(), first);
    assert_eq!(files(tmp.path()).len(), 12);
}

#[test]
fn images_differ_within_and_across_classes() {
    let spec = small();
    let mut a = Scratch::default();
    let mut b = Scratch::default();
    render(&spec, 0, 0, &mut a);
    render(&spec, 0, 1, &mut b);
    assert_ne!(a.pixels, b.pixels);
    render(&spec, 1, 0, &mut b);
    assert_ne!(a.pixels, b.pixels);
    render(&spec, 0, 0, &mut b);
    assert_eq!(a.pixels, b.pixels);
}

#[test]
fn bad_specs_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for spec in [
        SynthSpec {
            classes: 0,
            ..small()
        },
        SynthSpec {
            width: 0,
            ..small()
        },
        SynthSpec {
            quality: 0,
            ..small()
        },
        SynthSpec {
            height: 20_000,
            ..small()
        },
    ] {
        let err = generate_image_folder(tmp.path(), &spec, &mut |_| {}).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
    assert!(!tmp.path().join(MARKER).exists());
}

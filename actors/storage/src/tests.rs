//! Tests of the storage backends on tiny datasets built in temporary folders.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;
use crate::fields::npy_f32;

/// Distinct bytes per file, so that reads can be compared.
fn content(tag: &str) -> Vec<u8> {
    let mut v = format!("bytes of {tag}|").into_bytes();
    v.extend((0..300u32).map(|i| (i * 7 + tag.len() as u32) as u8));
    v
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

fn index_ok(spec: &SourceSpec, roots: &[PathBuf]) -> DatasetIndex {
    index(spec, roots, &mut |_| {}).unwrap()
}

fn index_err(spec: &SourceSpec, roots: &[PathBuf]) -> StorageError {
    index(spec, roots, &mut |_| {}).unwrap_err()
}

fn folder(path: &Path) -> SourceSpec {
    SourceSpec::ImageFolder {
        path: path.to_owned(),
    }
}

fn manifest(path: &Path) -> SourceSpec {
    SourceSpec::Manifest {
        path: path.to_owned(),
        format: None,
        fields: None,
    }
}

/// Checks that every item reads back as the file it points to, and returns the file names.
fn names_and_check_reads(ix: &DatasetIndex) -> Vec<String> {
    (0..ix.len() as u32)
        .map(|id| {
            let Some(Location::File(p)) = ix.location(id) else {
                panic!("not a file item")
            };
            assert_eq!(ix.read(id).unwrap(), fs::read(p).unwrap());
            let root = p.ancestors().nth(2).unwrap();
            p.strip_prefix(root).unwrap().display().to_string()
        })
        .collect()
}

#[test]
fn the_whole_fingerprint_is_kept_once_computed_and_changes_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ds");
    for f in ["a/1.jpg", "a/2.jpg", "b/3.jpg"] {
        write(&root.join(f), &content(f));
    }
    let ix = index_ok(&folder(&root), std::slice::from_ref(&root));
    let fresh = DatasetIndex::from_bytes(&ix.to_bytes()).unwrap();
    let whole = ix.fingerprint(3).unwrap();
    assert!(whole.starts_with("3:"));
    // Kept: asked again, from a clone, it is the same, and a copy that never computed it
    // (read back from the bytes) computes the same.
    assert_eq!(ix.fingerprint(3).unwrap(), whole);
    assert_eq!(ix.clone().fingerprint(3).unwrap(), whole);
    assert_eq!(fresh.fingerprint(3).unwrap(), whole);
    // Not part of the index's value or bytes; the first items' fingerprint is its own.
    assert_eq!(DatasetIndex::from_bytes(&ix.to_bytes()).unwrap(), ix);
    assert_eq!(fresh.to_bytes(), ix.to_bytes());
    let first = ix.fingerprint(2).unwrap();
    assert_ne!(first, whole);
    assert!(ix.fingerprint_matches(&first) && ix.fingerprint_matches(&whole));
    // An index with another item has another whole fingerprint.
    write(&root.join("b/4.jpg"), &content("b/4.jpg"));
    let grown = index_ok(&folder(&root), std::slice::from_ref(&root));
    assert_ne!(grown.fingerprint(4).unwrap(), whole);
    assert!(grown.fingerprint_matches(&whole));
}

#[test]
fn image_folder_labels_follow_sorted_class_names() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ds");
    for f in [
        "dog/d1.jpg",
        "cat/c2.png",
        "cat/c1.JPG",
        "bird/b1.jpeg",
        "bird/notes.txt",
        "bird/._b0.jpg",
        "cat/noext",
        ".ipynb_checkpoints/x.jpg",
    ] {
        write(&root.join(f), &content(f));
    }
    write(&root.join("top.jpg"), b"a file at the top is no class");
    fs::create_dir_all(root.join("empty_class")).unwrap();

    let ix = index_ok(&folder(&root), &[tmp.path().to_owned()]);
    assert_eq!(ix.classes(), ["bird", "cat", "dog", "empty_class"]);
    assert_eq!(
        names_and_check_reads(&ix),
        ["bird/b1.jpeg", "cat/c1.JPG", "cat/c2.png", "dog/d1.jpg"]
    );
    let labels: Vec<i64> = (0..4).map(|id| ix.label(id).unwrap()).collect();
    assert_eq!(labels, [0, 1, 1, 2]);
    assert_eq!(ix.label(4), None);
    assert!(ix.shards().is_empty());
    let Some(Location::File(p)) = ix.location(0) else {
        panic!()
    };
    assert!(p.is_absolute());
}

#[test]
fn image_folder_walks_nested_folders_in_torchvision_order() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ds");
    for f in [
        "a/z.jpg",
        "a/sub/b.jpg",
        "a/x.jpg",
        "a/sub/a.png",
        "a/sub2/0.jpg",
    ] {
        write(&root.join(f), &content(f));
    }
    let ix = index_ok(&folder(&root), std::slice::from_ref(&root));
    let order: Vec<String> = (0..ix.len() as u32)
        .map(|id| String::from_utf8_lossy(&ix.read(id).unwrap()[..30]).into_owned())
        .map(|s| {
            s.split('|')
                .next()
                .unwrap()
                .trim_start_matches("bytes of ")
                .to_owned()
        })
        .collect();
    assert_eq!(
        order,
        [
            "a/x.jpg",
            "a/z.jpg",
            "a/sub/a.png",
            "a/sub/b.jpg",
            "a/sub2/0.jpg"
        ]
    );
}

#[test]
fn progress_is_reported_while_indexing() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..600 {
        write(&tmp.path().join(format!("c{}/{i:04}.jpg", i % 2)), b"x");
    }
    let mut seen = Vec::new();
    let ix = index(&folder(tmp.path()), &[tmp.path().to_owned()], &mut |n| {
        seen.push(n)
    })
    .unwrap();
    assert_eq!(ix.len(), 600);
    assert_eq!(seen, [256, 512, 600]);
}

#[test]
fn symlinks_inside_the_roots_are_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ds");
    let store = tmp.path().join("store");
    write(&store.join("real.jpg"), &content("real"));
    write(&store.join("cls/inner.jpg"), &content("inner"));
    fs::create_dir_all(root.join("a")).unwrap();
    symlink(store.join("real.jpg"), root.join("a/link.jpg")).unwrap();
    symlink(store.join("cls"), root.join("b")).unwrap();
    let ix = index_ok(&folder(&root), &[tmp.path().to_owned()]);
    assert_eq!(ix.classes(), ["a", "b"]);
    assert_eq!(ix.read(0).unwrap(), content("real"));
    assert_eq!(ix.read(1).unwrap(), content("inner"));
    assert_eq!(
        ix.location(0).unwrap(),
        Location::File(&fs::canonicalize(store.join("real.jpg")).unwrap())
    );
}

#[test]
fn paths_outside_the_roots_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = tmp.path().join("allowed");
    let outside = tmp.path().join("outside");
    write(&allowed.join("ds/c/a.jpg"), &content("a"));
    write(&outside.join("ds/c/b.jpg"), &content("b"));
    write(&outside.join("secret.jpg"), &content("secret"));
    let roots = [allowed.clone()];

    // The source itself, directly, through `..`, and a missing path outside (refused without
    // saying whether it exists).
    for p in [
        outside.join("ds"),
        allowed.join("../outside/ds"),
        allowed.join("ds/../../outside/ds"),
        outside.join("missing"),
        PathBuf::from("/"),
    ] {
        let err = index_err(&folder(&p), &roots);
        assert_eq!(err.code(), "outside_roots", "{}: {err}", p.display());
    }
    // No roots at all: nothing is allowed.
    assert_eq!(
        index_err(&folder(&allowed.join("ds")), &[]).code(),
        "outside_roots"
    );
    // A missing path inside the roots is just missing.
    assert_eq!(
        index_err(&folder(&allowed.join("nope")), &roots).code(),
        "not_found"
    );

    // A symlinked file and a symlinked class folder pointing outside.
    let ds = allowed.join("ds");
    symlink(outside.join("secret.jpg"), ds.join("c/evil.jpg")).unwrap();
    assert_eq!(index_err(&folder(&ds), &roots).code(), "outside_roots");
    fs::remove_file(ds.join("c/evil.jpg")).unwrap();
    symlink(outside.join("ds/c"), ds.join("evil_class")).unwrap();
    assert_eq!(index_err(&folder(&ds), &roots).code(), "outside_roots");
    fs::remove_file(ds.join("evil_class")).unwrap();
    // A symlinked root folder pointing outside.
    symlink(outside.join("ds"), allowed.join("alias")).unwrap();
    assert_eq!(
        index_err(&folder(&allowed.join("alias")), &roots).code(),
        "outside_roots"
    );
    assert_eq!(index_ok(&folder(&ds), &roots).len(), 1);

    // Manifest entries: relative with `..`, absolute, and through a symlink.
    let m = allowed.join("m.csv");
    for entry in [
        "../outside/secret.jpg".to_owned(),
        outside.join("secret.jpg").display().to_string(),
        "alias/c/b.jpg".to_owned(),
    ] {
        fs::write(&m, format!("ds/c/a.jpg,0\n{entry},1\n")).unwrap();
        let err = index_err(&manifest(&m), &roots);
        assert_eq!(err.code(), "outside_roots", "{entry}: {err}");
    }

    // Tar shards outside, or a folder of shards holding a symlink to one outside.
    write(
        &outside.join("s.tar"),
        &shard(&[("x.jpg", b"x"), ("x.cls", b"1")]),
    );
    let spec = SourceSpec::TarShards {
        paths: vec![outside.join("s.tar")],
        fields: None,
    };
    assert_eq!(index_err(&spec, &roots).code(), "outside_roots");
    fs::create_dir_all(allowed.join("shards")).unwrap();
    symlink(outside.join("s.tar"), allowed.join("shards/s.tar")).unwrap();
    let spec = SourceSpec::TarShards {
        paths: vec![allowed.join("shards")],
        fields: None,
    };
    assert_eq!(index_err(&spec, &roots).code(), "outside_roots");
}

#[test]
fn empty_datasets_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ds");
    fs::create_dir_all(root.join("a")).unwrap();
    write(&root.join("b/readme.txt"), b"no image");
    let roots = [tmp.path().to_owned()];
    let err = index_err(&folder(&root), &roots);
    assert_eq!(err.code(), "empty_dataset");
    assert_eq!(err.to_string(), "the dataset is empty: no image found");

    let m = tmp.path().join("m.jsonl");
    fs::write(&m, "\n\n").unwrap();
    assert_eq!(index_err(&manifest(&m), &roots).code(), "empty_dataset");

    let s = tmp.path().join("s.tar");
    write(&s, &shard(&[("a.json", b"{}")]));
    let spec = SourceSpec::TarShards {
        paths: vec![s],
        fields: None,
    };
    assert_eq!(index_err(&spec, &roots).code(), "empty_dataset");

    let file = root.join("b/readme.txt");
    assert_eq!(index_err(&folder(&file), &roots).code(), "not_a_directory");
}

/// A tar archive (GNU headers) with the given members, in order.
fn shard(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn tar_shards_group_members_by_key_and_read_at_random() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shards");
    let long = format!("{}/s2", "deep".repeat(40));
    let img = |k: &str| content(k);
    let (a0, a1, a2) = (img("a0"), img("a1"), img("a2"));
    let (b0, c0) = (img("b0"), img("c0"));
    // Written out of name order: shards are indexed in sorted order.
    write(
        &dir.join("shard-001.tar"),
        &shard(&[("b0.cls", b"7\n"), ("b0.jpg", &b0)]),
    );
    write(
        &dir.join("shard-000.tar"),
        &shard(&[
            ("s0.jpg", &a0),
            ("s0.cls", b"2"),
            ("s0.json", b"{}"),
            ("meta.json", b"{}"),
            ("s1.cls", b" 0 "),
            ("s1.PNG", &a1),
            ("s1.jpeg", b"second image member is ignored"),
            (&format!("{long}.jpg"), &a2),
            (&format!("{long}.cls"), b"1"),
            ("README", b"no extension"),
        ]),
    );
    write(&dir.join("notes.txt"), b"not a shard");
    let single = tmp.path().join("extra.tar");
    write(&single, &shard(&[("c0.cls", b"3"), ("c0.png", &c0)]));

    let spec = SourceSpec::TarShards {
        paths: vec![dir.clone(), single.clone()],
        fields: None,
    };
    let mut last = 0;
    let ix = index(&spec, &[tmp.path().to_owned()], &mut |n| last = n).unwrap();
    assert_eq!(last, 5);
    assert_eq!(
        ix.shards(),
        [
            fs::canonicalize(dir.join("shard-000.tar")).unwrap(),
            fs::canonicalize(dir.join("shard-001.tar")).unwrap(),
            fs::canonicalize(&single).unwrap(),
        ]
    );
    let labels: Vec<i64> = ix.labels().collect();
    assert_eq!(labels, [2, 0, 1, 7, 3]);
    assert_eq!(ix.classes(), ["0", "1", "2", "3", "4", "5", "6", "7"]);
    for id in [4u32, 0, 3, 2, 1, 0] {
        let expected = [&a0, &a1, &a2, &b0, &c0][id as usize];
        assert_eq!(&ix.read(id).unwrap(), expected, "item {id}");
    }
    assert!(matches!(
        ix.location(3).unwrap(),
        Location::TarMember { shard: 1, .. }
    ));
    assert!(ix.describe(3).unwrap().contains("shard-001.tar@"));
}

#[test]
fn tar_labels_must_be_present_and_well_formed() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [tmp.path().to_owned()];
    for (members, what) in [
        (vec![("a.jpg", &b"x"[..])], "no .cls member"),
        (vec![("a.jpg", &b"x"[..]), ("a.cls", b" \n")], "empty class"),
        (vec![("a.jpg", &b"x"[..]), ("a.cls", b"-2")], "not in 0.."),
        (vec![("a.jpg", &b"x"[..]), ("a.cls", &[b'1'; 100])], "bytes"),
    ] {
        let s = tmp.path().join("s.tar");
        write(&s, &shard(&members));
        let err = index_err(
            &SourceSpec::TarShards {
                paths: vec![s],
                fields: None,
            },
            &roots,
        );
        assert_eq!(err.code(), "bad_label", "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
}

#[test]
fn a_minus_one_tar_label_is_an_unlabelled_item() {
    let tmp = tempfile::tempdir().unwrap();
    let s = tmp.path().join("s.tar");
    write(
        &s,
        &shard(&[
            ("a.jpg", &b"x"[..]),
            ("a.cls", b"-1"),
            ("b.jpg", b"y"),
            ("b.cls", b"2"),
        ]),
    );
    let spec = SourceSpec::TarShards {
        paths: vec![s],
        fields: None,
    };
    let index = index_ok(&spec, &[tmp.path().to_owned()]);
    assert_eq!(index.labels().collect::<Vec<_>>(), vec![-1, 2]);
    assert_eq!(index.classes(), ["0", "1", "2"]);
    // It survives the index's own check and its bytes.
    let back = DatasetIndex::from_bytes(&index.to_bytes()).unwrap();
    assert_eq!(back.labels().collect::<Vec<_>>(), vec![-1, 2]);
}

#[test]
fn truncated_shards_fail_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [tmp.path().to_owned()];
    let big = vec![42u8; 5000];
    let bytes = shard(&[
        ("a.jpg", &big),
        ("a.cls", b"0"),
        ("b.jpg", &big),
        ("b.cls", b"1"),
    ]);
    let s = tmp.path().join("s.tar");
    let spec = SourceSpec::TarShards {
        paths: vec![s.clone()],
        fields: None,
    };

    // Cut where the second image's data begins: indexing refuses the shard.
    write(&s, &bytes[..512 * 14]);
    let err = index_err(&spec, &roots);
    assert_eq!(err.code(), "bad_shard", "{err}");
    // Cut inside the second image's header (members: a.jpg header at block 0, its data in
    // blocks 1-10, a.cls in blocks 11-12, b.jpg header in block 13).
    write(&s, &bytes[..512 * 13 + 100]);
    assert_eq!(index_err(&spec, &roots).code(), "bad_shard");

    // Truncated after indexing: the read fails, the other item still reads.
    write(&s, &bytes);
    let ix = index_ok(&spec, &roots);
    assert_eq!(ix.len(), 2);
    write(&s, &bytes[..512 * 14]);
    let err = ix.read(1).unwrap_err();
    assert_eq!(err.code(), "read_failed", "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
    assert_eq!(ix.read(0).unwrap(), big);

    // Garbage is not a tar.
    write(&s, &[7u8; 1024]);
    assert_eq!(index_err(&spec, &roots).code(), "bad_shard");
}

#[test]
fn manifest_csv_with_header_quotes_and_relative_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    for f in ["x/1.jpg", "x/2.jpg", "odd, \"name\".png"] {
        write(&data.join(f), &content(f));
    }
    let m = data.join("list.csv");
    let abs = data.join("x/2.jpg");
    fs::write(
        &m,
        format!(
            "path,label\nx/1.jpg,2\n\n\"odd, \"\"name\"\".png\", 0\n{},2\nx/./1.jpg,1\n",
            abs.display()
        ),
    )
    .unwrap();
    let ix = index_ok(&manifest(&m), &[tmp.path().to_owned()]);
    assert_eq!(ix.len(), 4);
    assert_eq!(ix.classes(), ["0", "1", "2"]);
    let labels: Vec<i64> = ix.labels().collect();
    assert_eq!(labels, [2, 0, 2, 1]);
    assert_eq!(ix.read(0).unwrap(), content("x/1.jpg"));
    assert_eq!(ix.read(1).unwrap(), content("odd, \"name\".png"));
    assert_eq!(ix.read(2).unwrap(), content("x/2.jpg"));
    assert_eq!(ix.read(3).unwrap(), content("x/1.jpg"));

    // Text labels are class names, sorted.
    fs::write(&m, "x/1.jpg,dog\nx/2.jpg,cat\nx/1.jpg,7\n").unwrap();
    let ix = index_ok(&manifest(&m), &[tmp.path().to_owned()]);
    assert_eq!(ix.classes(), ["7", "cat", "dog"]);
    let labels: Vec<i64> = ix.labels().collect();
    assert_eq!(labels, [2, 1, 0]);
}

#[test]
fn manifest_json_lines_and_array() {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["a.jpg", "b.jpg"] {
        write(&tmp.path().join(f), &content(f));
    }
    let roots = [tmp.path().to_owned()];
    let m = tmp.path().join("m.jsonl");
    fs::write(
        &m,
        "{\"path\":\"a.jpg\",\"label\":1,\"caption\":\"extra fields are fine\"}\n\n{\"path\":\"b.jpg\",\"label\":0}\n",
    )
    .unwrap();
    let ix = index_ok(&manifest(&m), &roots);
    assert_eq!(ix.classes(), ["0", "1"]);
    assert_eq!((ix.label(0), ix.label(1)), (Some(1), Some(0)));
    assert_eq!(ix.read(1).unwrap(), content("b.jpg"));

    let m = tmp.path().join("m.json");
    fs::write(
        &m,
        r#"[{"path":"b.jpg","label":"zebra"},{"path":"a.jpg","label":"ant"}]"#,
    )
    .unwrap();
    let ix = index_ok(&manifest(&m), &roots);
    assert_eq!(ix.classes(), ["ant", "zebra"]);
    assert_eq!((ix.label(0), ix.label(1)), (Some(1), Some(0)));
    assert_eq!(ix.read(0).unwrap(), content("b.jpg"));
}

#[test]
fn bad_manifests_name_the_line() {
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("a.jpg"), b"a");
    let roots = [tmp.path().to_owned()];
    for (name, text, line) in [
        ("m.csv", "a.jpg,1\na.jpg,1,extra\n", 2),
        ("m.csv", "a.jpg\n", 1),
        ("m.csv", "a.jpg,1\n\"a.jpg,1\n", 2),
        ("m.csv", "a.jpg,\n", 1),
        ("m.jsonl", "{\"path\":\"a.jpg\",\"label\":1}\nnot json\n", 2),
        ("m.jsonl", "{\"path\":\"a.jpg\"}\n", 1),
        ("m.jsonl", "{\"path\":\"a.jpg\",\"label\":1.5}\n", 1),
        ("m.jsonl", "{\"path\":\"a.jpg\",\"label\":[1]}\n", 1),
        (
            "m.jsonl",
            "{\"path\":\"a.jpg\",\"label\":1}\n{\"path\":\"a.jpg\",\"label\":\"cat\"}\n",
            2,
        ),
        ("m.txt", "a.jpg,1\n", 0),
    ] {
        let m = tmp.path().join(name);
        fs::write(&m, text).unwrap();
        match index_err(&manifest(&m), &roots) {
            StorageError::BadManifest {
                line: l, reason, ..
            } => {
                assert_eq!(l, line, "{text:?}: {reason}");
                assert_eq!(reason, reason.to_lowercase());
            }
            other => panic!("{text:?}: {other}"),
        }
    }
    let m = tmp.path().join("m.csv");
    fs::write(&m, "a.jpg,1\nmissing.jpg,0\n").unwrap();
    assert_eq!(index_err(&manifest(&m), &roots).code(), "not_found");
    fs::write(&m, "a.jpg,-3\n").unwrap();
    assert_eq!(index_err(&manifest(&m), &roots).code(), "bad_label");
}

#[test]
fn read_errors_have_codes() {
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("c/a.jpg"), b"a");
    write(&tmp.path().join("c/b.jpg"), b"b");
    let ix = index_ok(&folder(tmp.path()), &[tmp.path().to_owned()]);
    fs::remove_file(tmp.path().join("c/b.jpg")).unwrap();
    assert_eq!(ix.read(0).unwrap(), b"a");
    assert_eq!(ix.read(1).unwrap_err().code(), "not_found");
    let err = ix.read(2).unwrap_err();
    assert_eq!(err.code(), "no_such_item");
    assert_eq!(err.to_string(), "no item 2: the dataset has 2 items");
}

#[test]
fn specs_and_indexes_serialize() {
    let spec: SourceSpec =
        serde_json::from_str(r#"{"kind":"tar_shards","paths":["/a","/b.tar"]}"#).unwrap();
    assert_eq!(
        spec,
        SourceSpec::TarShards {
            paths: vec!["/a".into(), "/b.tar".into()],
            fields: None,
        }
    );
    let spec: SourceSpec =
        serde_json::from_str(r#"{"kind":"image_folder","path":"/data"}"#).unwrap();
    assert_eq!(spec, folder(Path::new("/data")));
    for bad in [
        r#"{"kind":"image_folder","path":"/d","extra":1}"#,
        r#"{"kind":"manifest"}"#,
        r#"{"kind":"s3","path":"/d"}"#,
    ] {
        assert!(serde_json::from_str::<SourceSpec>(bad).is_err(), "{bad}");
    }

    let tmp = tempfile::tempdir().unwrap();
    let s = tmp.path().join("s.tar");
    write(&s, &shard(&[("a.jpg", b"x"), ("a.cls", b"1")]));
    write(&tmp.path().join("f/c/x.png"), b"y");
    for spec in [
        SourceSpec::TarShards {
            paths: vec![s],
            fields: None,
        },
        folder(&tmp.path().join("f")),
    ] {
        let ix = index_ok(&spec, &[tmp.path().to_owned()]);
        let back = DatasetIndex::from_bytes(&ix.to_bytes()).unwrap();
        assert_eq!(back, ix);
        assert_eq!(back.read(0).unwrap(), ix.read(0).unwrap());
    }
}

#[test]
fn manifest_entries_resolve_symlinks_and_stay_in_the_roots() {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = tmp.path().join("allowed");
    let outside = tmp.path().join("outside");
    write(&allowed.join("store/real.jpg"), &content("real"));
    write(&outside.join("secret.jpg"), &content("secret"));
    fs::create_dir_all(allowed.join("links")).unwrap();
    symlink(
        allowed.join("store/real.jpg"),
        allowed.join("links/file.jpg"),
    )
    .unwrap();
    symlink(allowed.join("store"), allowed.join("dirlink")).unwrap();
    symlink(outside.join("secret.jpg"), allowed.join("links/escape.jpg")).unwrap();
    symlink(&outside, allowed.join("outdir")).unwrap();
    let roots = [allowed.clone()];
    let real = fs::canonicalize(allowed.join("store/real.jpg")).unwrap();
    let m = allowed.join("m.csv");
    // The same folder many times (its canonical path is remembered), through a symlinked
    // file, a symlinked folder and `..`.
    fs::write(
        &m,
        "store/real.jpg,0\nlinks/file.jpg,1\ndirlink/real.jpg,2\nlinks/../store/real.jpg,3\n",
    )
    .unwrap();
    let ix = index_ok(&manifest(&m), &roots);
    for id in 0..4 {
        assert_eq!(ix.location(id), Some(Location::File(&real)), "item {id}");
        assert_eq!(ix.label(id), Some(i64::from(id)));
    }
    for entry in [
        "links/escape.jpg",
        "outdir/secret.jpg",
        "../outside/secret.jpg",
    ] {
        fs::write(&m, format!("store/real.jpg,0\n{entry},1\n")).unwrap();
        assert_eq!(
            index_err(&manifest(&m), &roots).code(),
            "outside_roots",
            "{entry}"
        );
    }
    // "x/" and "x/." name x as a folder: a file there is not found as a folder.
    for entry in ["store/real.jpg/", "store/real.jpg/."] {
        fs::write(&m, format!("{entry},0\n")).unwrap();
        assert!(
            index(&manifest(&m), &roots, &mut |_| {}).is_err(),
            "{entry}"
        );
    }
}

#[test]
fn indexes_are_compact_by_column() {
    // 20,000 entries naming three files over and over: at most 32 bytes per item besides
    // the path bytes (12 in fact: a label and a path end).
    let tmp = tempfile::tempdir().unwrap();
    let names = ["n01/a.jpg", "n02/b.jpg", "n03/c.jpg"];
    for f in names {
        write(&tmp.path().join(f), &content(f));
    }
    let n = 20_000u32;
    let m = tmp.path().join("m.csv");
    let text: String = (0..n)
        .map(|i| format!("{},{}\n", names[i as usize % 3], i % 1000))
        .collect();
    fs::write(&m, text).unwrap();
    let ix = index_ok(&manifest(&m), &[tmp.path().to_owned()]);
    assert_eq!(ix.len(), n as usize);
    let path_bytes: u64 = (0..n)
        .map(|id| match ix.location(id).unwrap() {
            Location::File(p) => p.as_os_str().len() as u64,
            Location::TarMember { .. }
            | Location::ParquetRow { .. }
            | Location::ArrayRow { .. } => unreachable!(),
        })
        .sum();
    assert!(
        ix.heap_bytes() <= 32 * u64::from(n) + path_bytes,
        "{} bytes for {n} items and {path_bytes} path bytes",
        ix.heap_bytes()
    );
    assert_eq!(ix.label(1234), Some(234));
    assert_eq!(ix.classes().len(), 1000);
    assert_eq!(ix.read(4).unwrap(), content(names[1]));

    // Tar members: shard, offset, length and label columns.
    let s = tmp.path().join("s.tar");
    let members: Vec<(String, Vec<u8>)> = (0..500)
        .flat_map(|i| {
            [
                (format!("k{i:04}.jpg"), content(&i.to_string())),
                (format!("k{i:04}.cls"), (i % 7).to_string().into_bytes()),
            ]
        })
        .collect();
    let refs: Vec<(&str, &[u8])> = members
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    write(&s, &shard(&refs));
    let ix = index_ok(
        &SourceSpec::TarShards {
            paths: vec![s],
            fields: None,
        },
        &[tmp.path().to_owned()],
    );
    assert_eq!(ix.len(), 500);
    assert!(ix.heap_bytes() <= 32 * 500, "{}", ix.heap_bytes());
    assert_eq!(ix.read(321).unwrap(), content("321"));
    assert_eq!(ix.label(321), Some(321 % 7));
}

#[test]
fn persisted_indexes_round_trip_and_other_formats_are_recognised() {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["a.jpg", "b.jpg"] {
        write(&tmp.path().join(f), &content(f));
    }
    let m = tmp.path().join("m.jsonl");
    fs::write(
        &m,
        "{\"path\":\"a.jpg\",\"label\":\"cat\"}\n{\"path\":\"b.jpg\",\"label\":\"ant\"}\n",
    )
    .unwrap();
    let ix = index_ok(&manifest(&m), &[tmp.path().to_owned()]);
    let bytes = ix.to_bytes();
    let back = DatasetIndex::from_bytes(&bytes).unwrap();
    assert_eq!(back, ix);
    assert_eq!(back.classes(), ["ant", "cat"]);
    assert_eq!(back.read(1).unwrap(), content("b.jpg"));
    // Version 2 (before fields): the same columns without the fields' trailing `None`.
    let v2 = [b"JOADIDX\x02".as_slice(), &bytes[8..bytes.len() - 1]].concat();
    assert_eq!(DatasetIndex::from_bytes(&v2).unwrap(), ix);

    // What joader wrote before the columnar index: JSON.
    let old =
        r#"{"items":[{"location":{"File":"/d/a.jpg"},"label":0}],"classes":["0"],"shards":[]}"#;
    assert!(matches!(
        DatasetIndex::from_bytes(old.as_bytes()),
        Err(IndexFormatError::OtherVersion)
    ));
    for damaged in [
        &bytes[..bytes.len() - 3],
        &bytes[..8],
        b"garbage".as_slice(),
    ] {
        assert!(
            matches!(
                DatasetIndex::from_bytes(damaged),
                Err(IndexFormatError::Damaged(_))
            ),
            "{damaged:?}"
        );
    }
}

fn tar_spec(dir: &Path, fields: serde_json::Value) -> SourceSpec {
    serde_json::from_value(serde_json::json!({
        "kind": "tar_shards", "paths": [dir], "fields": fields
    }))
    .unwrap()
}

#[test]
fn tar_fields_read_one_range_per_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shards");
    let long = format!("{}/x", "d".repeat(120)); // a GNU long name before its member
    let emb = npy_f32(&[1.0, 2.0]);
    let members: Vec<(String, Vec<u8>)> = vec![
        ("a.jpg".into(), content("a")),
        ("a.txt".into(), b"a cat".to_vec()),
        ("a.json".into(), br#"{"k": 1}"#.to_vec()),
        ("a.cls".into(), b"2".to_vec()),
        ("a.npy".into(), emb.clone()),
        (format!("{long}.png"), content("b")),
        (format!("{long}.cls"), b"0".to_vec()),
        (format!("{long}.txt"), "un chien".as_bytes().to_vec()),
        (format!("{long}.json"), b"[1]".to_vec()),
        (format!("{long}.npy"), npy_f32(&[3.0, 4.0])),
    ];
    let refs: Vec<(&str, &[u8])> = members
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    write(&dir.join("s.tar"), &shard(&refs));
    let fields = serde_json::json!({
        "img": {"kind": "image", "from": "jpg;png"},
        "y": {"kind": "class"},
        "caption": {"kind": "text", "from": "txt"},
        "meta": {"kind": "json", "from": "json"},
        "emb": {"kind": "npy", "from": "npy", "shape": [2]},
    });
    let roots = [tmp.path().to_owned()];
    let ix = index_ok(&tar_spec(&dir, fields.clone()), &roots);
    assert_eq!(ix.len(), 2);
    assert_eq!(ix.label(0), Some(2));
    assert_eq!(ix.label(1), Some(0));
    assert!(ix.has_small_fields());
    // One range per key, members and headers included: the second key starts where the
    // first one's last member ends.
    let (
        Some(Location::TarMember {
            offset: o0,
            len: l0,
            ..
        }),
        Some(Location::TarMember { offset: o1, .. }),
    ) = (ix.location(0), ix.location(1))
    else {
        panic!("tar items")
    };
    assert_eq!((o0, o0 + l0), (0, o1));
    let s = ix.split(1, ix.read(1).unwrap()).unwrap();
    assert_eq!(s.image, content("b"));
    let got: Vec<(&str, &[u8])> = s
        .fields
        .iter()
        .map(|f| (f.name.as_str(), f.value.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            ("caption", "un chien".as_bytes()),
            ("emb", &npy_f32(&[3.0, 4.0])[..]),
            ("meta", b"[1]".as_slice())
        ]
    );
    assert!(s.fields[1].fixed_shape && !s.fields[0].fixed_shape);
    let s = ix.split(0, ix.read(0).unwrap()).unwrap();
    assert_eq!((s.image, &s.fields[1].value), (content("a"), &emb));
    // The declaration persists with the index.
    let back = DatasetIndex::from_bytes(&ix.to_bytes()).unwrap();
    assert_eq!(back, ix);
    assert_eq!(
        back.split(0, back.read(0).unwrap()).unwrap().fields.len(),
        3
    );

    // Without `fields`, the same shards are images and classes, as before.
    let plain = index_ok(
        &SourceSpec::TarShards {
            paths: vec![dir.clone()],
            fields: None,
        },
        &roots,
    );
    assert!(!plain.has_small_fields());
    assert_eq!(plain.read(0).unwrap(), content("a"));
    assert_eq!(plain.split(0, content("a")).unwrap().fields, []);
}

#[allow(
    clippy::too_many_lines,
    reason = "a test that reads straight through, one case after another"
)]
#[test]
fn tar_fields_missing_or_malformed() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [tmp.path().to_owned()];
    let fields = serde_json::json!({
        "image": {"kind": "image"},
        "caption": {"kind": "text", "from": "txt"},
        "meta": {"kind": "json"},
        "emb": {"kind": "npy", "shape": [2]},
    });
    // A key missing a declared field fails the indexing, naming the key and the field.
    let dir = tmp.path().join("missing");
    write(
        &dir.join("s.tar"),
        &shard(&[
            ("k1.jpg", b"x"),
            ("k1.txt", b"t"),
            ("k1.meta", b"{}"),
            ("k1.emb", &npy_f32(&[1.0, 2.0])),
            ("k2.jpg", b"y"),
            ("k2.meta", b"{}"),
            ("k2.emb", &npy_f32(&[1.0, 2.0])),
        ]),
    );
    let e = index_err(&tar_spec(&dir, fields.clone()), &roots);
    assert_eq!(e.code(), "missing_field");
    let says = e.to_string();
    assert!(
        says.contains("k2 in") && says.contains("`caption`"),
        "{says}"
    );

    // Declared optional, the key's missing caption is absent from its sample.
    let mut optional = fields.clone();
    optional["caption"]["optional"] = serde_json::json!(true);
    let ix = index_ok(&tar_spec(&dir, optional), &roots);
    let names = |id: u32| -> Vec<String> {
        let s = ix.split(id, ix.read(id).unwrap()).unwrap();
        s.fields.iter().map(|f| f.name.clone()).collect()
    };
    assert_eq!(names(0), ["caption", "emb", "meta"]);
    assert_eq!(names(1), ["emb", "meta"]);
    // Only small fields may be optional.
    let mut image = fields.clone();
    image["image"]["optional"] = serde_json::json!(true);
    let refused = serde_json::from_value::<SourceSpec>(serde_json::json!({
        "kind": "tar_shards", "paths": [dir], "fields": image
    }));
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("only small fields"),
    );

    // Malformed values are the element's error when it is read, never a panic.
    let dir = tmp.path().join("bad");
    let good_emb = npy_f32(&[1.0, 2.0]);
    // (key, text, json, npy, what the error says)
    type Case<'a> = (&'a str, &'a [u8], &'a [u8], &'a [u8], &'a str);
    let cases: [Case<'_>; 4] = [
        ("ok", b"fine", b"{}", &good_emb, ""),
        (
            "text",
            b"\xff\xfe",
            b"{}",
            &good_emb,
            "field `caption` is not UTF-8",
        ),
        (
            "json",
            b"t",
            b"{nope",
            &good_emb,
            "field `meta` is not a JSON document",
        ),
        (
            "npy",
            b"t",
            b"{}",
            b"\x93NUMPY\x01\x00\x04\x00{}\n",
            "field `emb` is a bad .npy header",
        ),
    ];
    let mut members: Vec<(String, Vec<u8>)> = Vec::new();
    for (k, t, m, n, _) in &cases {
        members.push((format!("{k}.jpg"), b"img".to_vec()));
        members.push((format!("{k}.txt"), t.to_vec()));
        members.push((format!("{k}.meta"), m.to_vec()));
        members.push((format!("{k}.emb"), n.to_vec()));
    }
    let refs: Vec<(&str, &[u8])> = members
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    write(&dir.join("s.tar"), &shard(&refs));
    let ix = index_ok(&tar_spec(&dir, fields.clone()), &roots);
    assert_eq!(ix.len(), 4);
    assert_eq!(ix.label(0), Some(0), "no class field: label 0");
    for (id, (_, _, _, _, says)) in cases.iter().enumerate() {
        let r = ix.split(id as u32, ix.read(id as u32).unwrap());
        if says.is_empty() {
            assert_eq!(r.unwrap().fields.len(), 3);
        } else {
            let e = r.unwrap_err();
            assert_eq!(e.code(), "bad_field");
            assert!(e.to_string().contains(says), "{e}");
        }
    }
    // A shape other than the declared one, too.
    let mut other = fields.clone();
    other["emb"]["shape"] = serde_json::json!([3]);
    let ix = index_ok(&tar_spec(&dir, other), &roots);
    let e = ix.split(0, ix.read(0).unwrap()).unwrap_err();
    assert!(e.to_string().contains("declares [3]"), "{e}");
}

#[allow(
    clippy::too_many_lines,
    reason = "a test that reads straight through, one case after another"
)]
#[test]
fn manifest_fields_from_columns_and_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [tmp.path().to_owned()];
    for f in ["a.jpg", "b.jpg"] {
        write(&tmp.path().join(f), &content(f));
    }
    let fields = serde_json::json!({
        "image": {"kind": "image", "from": "file"},
        "label": {"kind": "class", "from": "y"},
        "caption": {"kind": "text"},
        "meta": {"kind": "json", "from": "info"},
    });
    let spec = |name: &str| -> SourceSpec {
        serde_json::from_value(serde_json::json!({
            "kind": "manifest", "path": tmp.path().join(name), "fields": fields
        }))
        .unwrap()
    };
    fs::write(
        tmp.path().join("m.csv"),
        "y,file,caption,info\n1,a.jpg,\"a cat, asleep\",\"{\"\"k\"\": 1}\"\n0,b.jpg,un chien,[2]\n",
    )
    .unwrap();
    fs::write(
        tmp.path().join("m.jsonl"),
        "{\"file\":\"a.jpg\",\"y\":1,\"caption\":\"a cat, asleep\",\"info\":{\"k\":1}}\n\
         {\"file\":\"b.jpg\",\"y\":0,\"caption\":\"un chien\",\"info\":[2]}\n",
    )
    .unwrap();
    for name in ["m.csv", "m.jsonl"] {
        let ix = index_ok(&spec(name), &roots);
        assert_eq!(ix.len(), 2, "{name}");
        assert_eq!((ix.label(0), ix.label(1)), (Some(1), Some(0)), "{name}");
        let s = ix.split(0, ix.read(0).unwrap()).unwrap();
        assert_eq!(s.image, content("a.jpg"));
        let values: Vec<&[u8]> = s.fields.iter().map(|f| f.value.as_slice()).collect();
        assert_eq!(values[0], b"a cat, asleep");
        let meta: serde_json::Value = serde_json::from_slice(values[1]).unwrap();
        assert_eq!(meta, serde_json::json!({"k": 1}), "{name}");
        let s = ix.split(1, ix.read(1).unwrap()).unwrap();
        assert_eq!(s.fields[0].value, "un chien".as_bytes());
        let back = DatasetIndex::from_bytes(&ix.to_bytes()).unwrap();
        assert_eq!(back.split(1, back.read(1).unwrap()).unwrap(), s);
    }
    // An optional field's empty cell, missing key or null is absent; the index keeps that.
    fs::write(
        tmp.path().join("o.csv"),
        "y,file,caption,info\n1,a.jpg,,{}\n0,b.jpg,un chien,[2]\n",
    )
    .unwrap();
    fs::write(
        tmp.path().join("o.jsonl"),
        "{\"file\":\"a.jpg\",\"y\":1,\"info\":{}}\n\
         {\"file\":\"b.jpg\",\"y\":0,\"caption\":null,\"info\":[2]}\n",
    )
    .unwrap();
    let mut optional = fields.clone();
    optional["caption"]["optional"] = serde_json::json!(true);
    for (name, second) in [("o.csv", Some("un chien")), ("o.jsonl", None)] {
        let spec: SourceSpec = serde_json::from_value(serde_json::json!({
            "kind": "manifest", "path": tmp.path().join(name), "fields": optional
        }))
        .unwrap();
        let ix = DatasetIndex::from_bytes(&index_ok(&spec, &roots).to_bytes()).unwrap();
        let caption = |id: u32| {
            let s = ix.split(id, ix.read(id).unwrap()).unwrap();
            s.fields
                .iter()
                .find(|f| f.name == "caption")
                .map(|f| String::from_utf8(f.value.clone()).unwrap())
        };
        assert_eq!(caption(0), None, "{name}");
        assert_eq!(caption(1).as_deref(), second, "{name}");
    }
    // A missing column or key fails the indexing, naming the line and the field.
    fs::write(tmp.path().join("n.csv"), "file,y\na.jpg,1\n").unwrap();
    let e = index_err(&spec("n.csv"), &roots);
    assert_eq!(e.code(), "missing_field");
    assert!(
        e.to_string().contains("line 2") && e.to_string().contains("`caption`"),
        "{e}"
    );
    fs::write(
        tmp.path().join("n.jsonl"),
        "{\"file\":\"a.jpg\",\"y\":1,\"caption\":\"c\",\"info\":1}\n{\"file\":\"b.jpg\",\"y\":0,\"info\":1}\n",
    )
    .unwrap();
    let e = index_err(&spec("n.jsonl"), &roots);
    assert!(
        e.to_string().contains("line 2") && e.to_string().contains("`caption`"),
        "{e}"
    );
    // A text field that is not a string is refused with its line.
    fs::write(
        tmp.path().join("t.jsonl"),
        "{\"file\":\"a.jpg\",\"y\":1,\"caption\":3,\"info\":1}\n",
    )
    .unwrap();
    let e = index_err(&spec("t.jsonl"), &roots);
    assert_eq!(e.code(), "bad_manifest");
    // Kinds an `s3` manifest cannot hold are refused before indexing (a local manifest's
    // `npy` and `bytes` cells name files: `manifest.rs`'s tests).
    let npy: SourceSpec = serde_json::from_value(serde_json::json!({
        "kind": "s3", "url": "s3://bkt/m.csv", "layout": "manifest",
        "fields": {"image": {"kind": "image"}, "emb": {"kind": "npy"}}
    }))
    .unwrap();
    let e = npy.check_fields().unwrap_err();
    assert_eq!(e.code(), "bad_fields");
    assert!(
        e.to_string().contains("`emb`") && e.to_string().contains("s3"),
        "{e}"
    );
}

fn shards(paths: Vec<PathBuf>) -> SourceSpec {
    SourceSpec::TarShards {
        paths,
        fields: None,
    }
}

#[test]
fn shard_paths_take_brace_ranges_and_glob_patterns() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wds");
    for n in 0..12 {
        let key = format!("k{n:02}");
        let jpg = format!("{key}.jpg");
        let cls = format!("{key}.cls");
        let label = (n % 3).to_string();
        write(
            &dir.join(format!("shards-{n:06}.tar")),
            &shard(&[(jpg.as_str(), b"img"), (cls.as_str(), label.as_bytes())]),
        );
    }
    write(&dir.join("shards-000099.tar.md5"), b"not a shard");
    let roots = [tmp.path().to_owned()];
    let size = |p: &str| index_ok(&shards(vec![dir.join(p)]), &roots).len();
    // WebDataset's range, zero-padded; a list; a glob; a range spanning two patterns.
    assert_eq!(size("shards-{000000..000009}.tar"), 10);
    assert_eq!(size("shards-{000001,000003}.tar"), 2);
    assert_eq!(size("shards-*.tar"), 12);
    assert_eq!(size("shards-00001[01].tar"), 2);
    assert_eq!(size("shards-0000{0,1}?.tar"), 12);
    // In the order named: a list keeps its order, a glob its sorted matches.
    let ix = index_ok(
        &shards(vec![
            dir.join("shards-{000002,000001}.tar"),
            dir.join("shards-00000[0].tar"),
        ]),
        &roots,
    );
    let labels: Vec<Option<i64>> = (0..3).map(|i| ix.label(i)).collect();
    assert_eq!(labels, [Some(2), Some(1), Some(0)]);
    // A descending range expands to nothing: refused, not an empty list.
    let down = shards(vec![dir.join("shards-{000002..000001}.tar")]);
    assert_eq!(down.check_roots(&roots).unwrap_err().code(), "bad_pattern");
    // Checked when the dataset is created: a pattern matching nothing, or a range naming a
    // missing shard (that one when indexing, as a missing literal path).
    let spec = shards(vec![dir.join("train-*.tar")]);
    let e = spec.check_roots(&roots).unwrap_err();
    assert_eq!(e.code(), "no_match");
    assert!(e.to_string().contains("train-*.tar"), "{e}");
    let missing = shards(vec![dir.join("shards-{000010..000013}.tar")]);
    missing.check_roots(&roots).unwrap();
    assert_eq!(index_err(&missing, &roots).code(), "not_found");
    let bad = shards(vec![dir.join("shards-[.tar")]);
    assert_eq!(bad.check_roots(&roots).unwrap_err().code(), "bad_pattern");
}

#[test]
fn patterns_list_nothing_outside_the_roots() {
    let tmp = tempfile::tempdir().unwrap();
    let (allowed, outside) = (tmp.path().join("allowed"), tmp.path().join("outside"));
    write(&outside.join("s.tar"), &shard(&[("x.jpg", b"x")]));
    write(&allowed.join("a.tar"), &shard(&[("x.jpg", b"x")]));
    let roots = [allowed.clone()];
    for p in [
        outside.join("*.tar"),
        allowed.join("../outside/*.tar"),
        allowed.join("../*/s.tar"),
    ] {
        let spec = shards(vec![p.clone()]);
        assert_eq!(
            spec.check_roots(&roots).unwrap_err().code(),
            "outside_roots",
            "{}",
            p.display()
        );
        assert_eq!(index_err(&spec, &roots).code(), "outside_roots");
    }
    // A symlink under the roots to a shard outside: matched, then refused.
    symlink(outside.join("s.tar"), allowed.join("b.tar")).unwrap();
    let spec = shards(vec![allowed.join("*.tar")]);
    assert_eq!(index_err(&spec, &roots).code(), "outside_roots");
}

#[test]
fn tar_class_members_may_be_names() {
    let tmp = tempfile::tempdir().unwrap();
    let s = tmp.path().join("s.tar");
    // Names: the classes are the names, sorted; a number among them is a name too.
    write(
        &s,
        &shard(&[
            ("a.jpg", &b"x"[..]),
            ("a.cls", b"tabby cat\n"),
            ("b.jpg", b"y"),
            ("b.cls", b"airplane"),
            ("c.jpg", b"z"),
            ("c.cls", b"tabby cat"),
            ("d.jpg", b"w"),
            ("d.cls", b"7"),
        ]),
    );
    let ix = index_ok(&shards(vec![s.clone()]), &[tmp.path().to_owned()]);
    assert_eq!(ix.classes(), ["7", "airplane", "tabby cat"]);
    let labels: Vec<Option<i64>> = (0..4).map(|i| ix.label(i)).collect();
    assert_eq!(labels, [Some(2), Some(1), Some(2), Some(0)]);
    // Numbers alone stay numbers.
    write(
        &s,
        &shard(&[
            ("a.jpg", &b"x"[..]),
            ("a.cls", b"3"),
            ("b.jpg", b"y"),
            ("b.cls", b" 1 "),
        ]),
    );
    let ix = index_ok(&shards(vec![s]), &[tmp.path().to_owned()]);
    assert_eq!(ix.classes(), ["0", "1", "2", "3"]);
    let labels: Vec<Option<i64>> = (0..2).map(|i| ix.label(i)).collect();
    assert_eq!(labels, [Some(3), Some(1)]);
}

#[test]
fn tar_fields_read_only_the_declared_members_span() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shards");
    let video = vec![7u8; 40_000];
    let mask = vec![9u8; 30_000];
    let members: Vec<(&str, &[u8])> = vec![
        ("a.mp4", &video),
        ("a.jpg", b"jpeg bytes"),
        ("a.cls", b"1"),
        ("a.txt", b"a caption"),
        ("a.seg.png", &mask),
        ("b.mp4", &video),
        ("b.txt", b"b caption"),
        ("b.jpg", b"other jpeg"),
        ("b.cls", b"0"),
        ("b.seg.png", &mask),
    ];
    write(&dir.join("s.tar"), &shard(&members));
    let fields = serde_json::json!({
        "image": {"kind": "image", "from": "jpg"},
        "label": {"kind": "class"},
        "caption": {"kind": "text", "from": "txt"},
    });
    let ix = index_ok(&tar_spec(&dir, fields), &[tmp.path().to_owned()]);
    for (id, (image, caption)) in [("jpeg bytes", "a caption"), ("other jpeg", "b caption")]
        .into_iter()
        .enumerate()
    {
        let stored = ix.read(id as u32).unwrap();
        // The video before the declared members and the mask after them are not read.
        assert!(stored.len() < 4096, "item {id}: {} bytes", stored.len());
        let s = ix.split(id as u32, stored).unwrap();
        assert_eq!(s.image, image.as_bytes());
        assert_eq!(s.fields[0].value, caption.as_bytes());
    }
}

#[test]
fn a_path_that_exists_as_written_is_no_pattern() {
    let tmp = tempfile::tempdir().unwrap();
    // Folders whose names hold pattern characters, and a folder the pattern would name.
    for (dir, n) in [("s[1]", 1), ("s1", 2), ("a{b,c}", 3)] {
        for k in 0..n {
            let (jpg, cls) = (format!("k{k}.jpg"), format!("k{k}.cls"));
            write(
                &tmp.path().join(dir).join(format!("x{k}.tar")),
                &shard(&[(jpg.as_str(), b"i"), (cls.as_str(), b"0")]),
            );
        }
    }
    let roots = [tmp.path().to_owned()];
    let len = |p: &str| index_ok(&shards(vec![tmp.path().join(p)]), &roots).len();
    assert_eq!(len("s[1]"), 1);
    assert_eq!(len("s[1]/x0.tar"), 1);
    assert_eq!(len("a{b,c}"), 3);
    // Written as patterns, they are patterns.
    assert_eq!(len("s[0-9]"), 2);
    assert_eq!(len("s?1?/*.tar"), 1);
}

/// An `.npy` file of `dtype` (as NumPy writes it, `<f4`), `shape` and raw `data`.
fn npy(dtype: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    crate::fields::npy_file(
        &format!("{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape}, }}"),
        data,
    )
}

fn array_spec(paths: &[&Path], fields: Option<serde_json::Value>) -> SourceSpec {
    let mut v = serde_json::json!({"kind": "array", "paths": paths});
    if let Some(f) = fields {
        v["fields"] = f;
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn array_rows_are_samples_read_field_by_field() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [tmp.path().to_owned()];
    // 5 rows of (2, 3) uint8 pixels, 5 float32 pairs, 5 int16 classes (big-endian).
    let x: Vec<u8> = (0..30).collect();
    let emb: Vec<u8> = (0..10)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let y: Vec<u8> = [3i16, 0, 1, 3, 2]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    write(&tmp.path().join("x.npy"), &npy("|u1", "(5, 2, 3)", &x));
    write(&tmp.path().join("emb.npy"), &npy("<f4", "(5, 2)", &emb));
    write(&tmp.path().join("y.npy"), &npy(">i2", "(5,)", &y));
    let (px, pe, py) = (
        tmp.path().join("x.npy"),
        tmp.path().join("emb.npy"),
        tmp.path().join("y.npy"),
    );

    // The default declaration: every file an `npy` field named by it, labels 0.
    let spec = array_spec(&[&px, &pe], None).resolved().unwrap();
    let SourceSpec::Array {
        fields: Some(declared),
        ..
    } = &spec
    else {
        panic!("no default fields: {spec:?}");
    };
    let names: Vec<_> = declared.iter().map(|(n, f)| (n, f.kind)).collect();
    assert_eq!(
        names,
        [
            ("emb", fields::FieldKind::Npy),
            ("x", fields::FieldKind::Npy)
        ]
    );
    assert!(!spec.has_image());
    let ix = index_ok(&spec, &roots);
    assert_eq!(ix.len(), 5);
    assert!(!ix.has_image());
    assert_eq!(ix.label(4), Some(0));
    for id in 0..5u32 {
        let s = ix.split(id, ix.read(id).unwrap()).unwrap();
        assert!(s.image.is_empty());
        let got: Vec<_> = s.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(got, ["emb", "x"]);
        assert!(s.fields.iter().all(|f| f.fixed_shape));
        let (e, xv) = (&s.fields[0].value, &s.fields[1].value);
        assert_eq!(fields::npy_shape(e).unwrap(), [2]);
        assert_eq!(fields::npy_shape(xv).unwrap(), [2, 3]);
        let i = id as usize;
        assert_eq!(&e[e.len() - 8..], &emb[i * 8..i * 8 + 8]);
        assert_eq!(&xv[xv.len() - 6..], &x[i * 6..i * 6 + 6]);
    }
    assert!(ix.describe(2).unwrap().ends_with("row 2"));

    // A class array and fields from other names; the index persists and reads back.
    let fields = serde_json::json!({"pixels": {"kind": "npy", "from": "x", "shape": [2, 3]},
                                    "label": {"kind": "class", "from": "y"}});
    let spec = array_spec(&[&px, &py], Some(fields));
    let ix = index_ok(&spec, &roots);
    let labels: Vec<i64> = ix.labels().collect();
    assert_eq!(labels, [3, 0, 1, 3, 2]);
    assert_eq!(ix.classes(), ["0", "1", "2", "3"]);
    let back = DatasetIndex::from_bytes(&ix.to_bytes()).unwrap();
    assert_eq!(back, ix);
    let s = back.split(3, back.read(3).unwrap()).unwrap();
    assert_eq!(s.fields.len(), 1);
    assert_eq!(
        &s.fields[0].value[s.fields[0].value.len() - 6..],
        &x[18..24]
    );
    // A fingerprint names the files: the same rows of another file differ.
    let fp = ix.fingerprint(5).unwrap();
    assert!(ix.fingerprint_matches(&fp));
    std::fs::copy(&px, tmp.path().join("x2.npy")).unwrap();
    let other = index_ok(
        &array_spec(
            &[&tmp.path().join("x2.npy"), &py],
            Some(serde_json::json!({"pixels": {"kind": "npy", "from": "x2"},
                                    "label": {"kind": "class", "from": "y"}})),
        ),
        &roots,
    );
    assert!(!other.fingerprint_matches(&fp));
}

#[test]
fn bad_arrays_fail_the_indexing_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [tmp.path().to_owned()];
    let p = |n: &str| tmp.path().join(n);
    write(&p("a.npy"), &npy("<f4", "(4, 2)", &[0; 32]));
    write(&p("b.npy"), &npy("<f4", "(3, 2)", &[0; 24]));
    write(&p("f.npy"), &{
        let mut f =
            crate::fields::npy_start("{'descr': '<f4', 'fortran_order': True, 'shape': (4, 2), }");
        f.extend([0; 32]);
        f
    });
    write(&p("short.npy"), &npy("<f4", "(4, 2)", &[0; 20]));
    write(&p("s.npy"), &npy("<f4", "()", &[0; 4]));
    write(&p("c.npy"), &npy("<f4", "(4,)", &[0; 16]));
    write(&p("junk.npy"), b"not an array");
    write(
        &p("huge.npy"),
        &npy("|u1", "(0, 1099511627776, 1099511627776)", &[]),
    );
    for (paths, fields, says) in [
        (vec!["a.npy", "b.npy"], None, "3 rows, but"),
        (vec!["f.npy"], None, "Fortran-ordered"),
        (vec!["short.npy"], None, "truncated"),
        (vec!["s.npy"], None, "0-dimensional"),
        (vec!["junk.npy"], None, "magic"),
        (vec!["huge.npy"], None, "at most 4 GiB a row"),
        (
            vec!["a.npy", "c.npy"],
            Some(serde_json::json!({"a": {"kind": "npy"}, "c": {"kind": "class"}})),
            "1-D array of integers",
        ),
        (
            vec!["a.npy"],
            Some(serde_json::json!({"a": {"kind": "npy", "shape": [3]}})),
            "declares shape [3]",
        ),
    ] {
        let paths: Vec<PathBuf> = paths.iter().map(|n| p(n)).collect();
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let e = index_err(&array_spec(&refs, fields), &roots);
        assert_eq!(e.code(), "bad_array", "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    // Outside the roots.
    let elsewhere = tempfile::tempdir().unwrap();
    write(
        &elsewhere.path().join("a.npy"),
        &npy("<f4", "(1,)", &[0; 4]),
    );
    let e = index_err(
        &array_spec(&[&elsewhere.path().join("a.npy")], None),
        &roots,
    );
    assert_eq!(e.code(), "outside_roots", "{e}");
}

#[test]
fn array_declarations_that_name_no_file_or_another_kind_are_refused_at_once() {
    let p = |n: &str| PathBuf::from("/data").join(n);
    for (paths, fields, says) in [
        (vec!["a.txt"], None, "`.npy` files"),
        (
            vec!["a.npy", "d/a.npy"],
            None,
            "two paths are named `a.npy`",
        ),
        (
            vec!["a.npy", "b.npy"],
            Some(serde_json::json!({"a": {"kind": "npy"}})),
            "`b.npy` is named by no field",
        ),
        (
            vec!["a.npy"],
            Some(serde_json::json!({"a": {"kind": "npy", "from": "z"}})),
            "no path is named `z.npy`",
        ),
        (
            vec!["a.npy"],
            Some(serde_json::json!({"a": {"kind": "text"}})),
            "not `text`",
        ),
    ] {
        let paths: Vec<PathBuf> = paths.iter().map(|n| p(n)).collect();
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let e = array_spec(&refs, fields).check_fields().unwrap_err();
        assert_eq!(e.code(), "bad_fields", "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
}

#[test]
fn text_only_shards_are_samples_without_an_image() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shards");
    let members: [(&str, &[u8]); 5] = [
        ("a.txt", b"first"),
        ("a.json", br#"{"n": 1}"#),
        ("a.cls", b"1"),
        ("b.txt", "zweite".as_bytes()),
        ("b.cls", b"0"),
    ];
    write(&dir.join("s.tar"), &shard(&members));
    let roots = [tmp.path().to_owned()];
    let fields = serde_json::json!({"text": {"kind": "text", "from": "txt"},
                                    "meta": {"kind": "json", "from": "json", "optional": true},
                                    "label": {"kind": "class"}});
    let spec = tar_spec(&dir, fields);
    assert!(!spec.has_image());
    let ix = index_ok(&spec, &roots);
    assert!(!ix.has_image());
    assert_eq!(ix.len(), 2);
    assert_eq!(ix.labels().collect::<Vec<_>>(), [1, 0]);
    let a = ix.split(0, ix.read(0).unwrap()).unwrap();
    assert!(a.image.is_empty());
    let values: Vec<_> = a
        .fields
        .iter()
        .map(|f| (f.name.as_str(), f.value.as_slice()))
        .collect();
    assert_eq!(
        values,
        [("meta", br#"{"n": 1}"#.as_slice()), ("text", b"first")]
    );
    let b = ix.split(1, ix.read(1).unwrap()).unwrap();
    assert_eq!(b.fields.len(), 1);
    assert_eq!(b.fields[0].value, "zweite".as_bytes());
    // A manifest's entries are image files: a declaration without one is refused.
    let m: SourceSpec = serde_json::from_value(serde_json::json!({
        "kind": "manifest", "path": tmp.path().join("m.jsonl"),
        "fields": {"text": {"kind": "text"}}}))
    .unwrap();
    let e = m.check_fields().unwrap_err();
    assert!(
        e.to_string().contains("declare its field of kind `image`"),
        "{e}"
    );
}

//! Tests of [`DatasetIndex::appended`] and [`SourceSpec::appended_parts`] on tiny datasets.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{DatasetIndex, SourceSpec, StorageError, index};

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

fn shard(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap()
}

fn index_of(spec: &SourceSpec, roots: &[PathBuf]) -> DatasetIndex {
    index(spec, roots, &mut |_| {}).unwrap()
}

/// The index of `base` grown by each part of `paths`, as the server appends them.
fn grown(
    base: &DatasetIndex,
    spec: &SourceSpec,
    paths: &[PathBuf],
    roots: &[PathBuf],
) -> DatasetIndex {
    spec.appended_parts(paths)
        .unwrap()
        .iter()
        .fold(base.clone(), |ix, part| {
            ix.appended(&index_of(part, roots)).unwrap()
        })
}

fn refusal(e: StorageError) -> String {
    assert_eq!(e.code(), "cannot_append", "{e}");
    e.to_string()
}

#[test]
fn appended_shards_continue_the_ids_as_one_index_of_them_all() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [tmp.path().to_owned()];
    let shard_of = |s: usize, labels: &[u32]| -> PathBuf {
        let members: Vec<(String, Vec<u8>)> = labels
            .iter()
            .enumerate()
            .flat_map(|(k, l)| {
                let key = format!("s{s}k{k}");
                [
                    (format!("{key}.jpg"), format!("image {key}").into_bytes()),
                    (format!("{key}.cls"), l.to_string().into_bytes()),
                    (format!("{key}.txt"), format!("caption {key}").into_bytes()),
                ]
            })
            .collect();
        let p = tmp.path().join(format!("shard-{s}.tar"));
        write(&p, &shard(&members));
        p
    };
    let paths = [
        shard_of(0, &[0, 1, 1]),
        shard_of(1, &[2]),
        shard_of(2, &[5, 0]),
    ];
    let fields = serde_json::json!({"image": {"kind": "image"}, "label": {"kind": "class"},
                                    "caption": {"kind": "text", "from": "txt"}});
    let spec = |p: &[PathBuf]| -> SourceSpec {
        serde_json::from_value(
            serde_json::json!({"kind": "tar_shards", "paths": p, "fields": fields}),
        )
        .unwrap()
    };
    let base = index_of(&spec(&paths[..2]), &roots);
    let all = index_of(&spec(&paths), &roots);
    let g = grown(&base, &spec(&paths[..2]), &paths[2..], &roots);
    // The same index as one made of all three shards: ids, labels, classes, fields.
    assert_eq!(g, all);
    assert_eq!(g.len(), 6);
    assert_eq!(g.labels().collect::<Vec<_>>(), [0, 1, 1, 2, 5, 0]);
    let caption = |ix: &DatasetIndex, id: u32| {
        let s = ix.split(id, ix.read(id).unwrap()).unwrap();
        (s.image, s.fields[0].value.clone())
    };
    for id in 0..6 {
        assert_eq!(caption(&g, id), caption(&all, id));
    }
    assert_eq!(caption(&g, 4).1, b"caption s2k0");
    // The items before the append keep their fingerprint: a state saved then matches.
    let before = base.fingerprint(base.len()).unwrap();
    assert!(g.fingerprint_matches(&before));
    assert_ne!(g.fingerprint(g.len()).unwrap(), before);
    // A shard of the dataset appended again is refused, naming it.
    let again = spec(&paths[..2]).appended_parts(&paths[1..2]).unwrap();
    let e = refusal(base.appended(&index_of(&again[0], &roots)).unwrap_err());
    assert!(e.contains("shard-1.tar is in the dataset already"), "{e}");
    // Other fields, or another kind of source, are refused.
    let plain = index_of(
        &SourceSpec::TarShards {
            paths: paths[2..].to_vec(),
            fields: None,
        },
        &roots,
    );
    let e = refusal(base.appended(&plain).unwrap_err());
    assert!(e.contains("other fields"), "{e}");
}

#[test]
fn appended_manifests_and_folders_merge_classes_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [tmp.path().to_owned()];
    for f in ["a", "b", "c", "d", "e"] {
        write(&tmp.path().join(format!("img/{f}.jpg")), f.as_bytes());
    }
    fs::write(
        tmp.path().join("m1.csv"),
        "path,label\nimg/a.jpg,dog\nimg/b.jpg,cat\n",
    )
    .unwrap();
    fs::write(
        tmp.path().join("m2.csv"),
        "path,label\nimg/c.jpg,bird\nimg/d.jpg,dog\n",
    )
    .unwrap();
    fs::write(
        tmp.path().join("m3.csv"),
        "path,label\nimg/e.jpg,cat\nimg/a.jpg,cat\n",
    )
    .unwrap();
    let spec = SourceSpec::Manifest {
        path: tmp.path().join("m1.csv"),
        format: None,
        fields: None,
    };
    let base = index_of(&spec, &roots);
    assert_eq!(base.classes(), ["cat", "dog"]);
    let g = grown(&base, &spec, &[tmp.path().join("m2.csv")], &roots);
    // Existing labels stay; a new class takes the next label.
    assert_eq!(g.classes(), ["cat", "dog", "bird"]);
    assert_eq!(g.labels().collect::<Vec<_>>(), [1, 0, 2, 1]);
    assert_eq!(g.read(2).unwrap(), b"c");
    // A file the dataset reads already is refused, naming it.
    let part = &spec.appended_parts(&[tmp.path().join("m3.csv")]).unwrap()[0];
    let e = refusal(g.appended(&index_of(part, &roots)).unwrap_err());
    assert!(e.contains("a.jpg is in the dataset already"), "{e}");

    // Image folders: each appended path is a folder of class folders.
    for (dir, class, file) in [
        ("f1", "cat", "x"),
        ("f1", "dog", "y"),
        ("f2", "ant", "z"),
        ("f2", "dog", "w"),
    ] {
        write(
            &tmp.path().join(format!("{dir}/{class}/{file}.jpg")),
            file.as_bytes(),
        );
    }
    let folders = SourceSpec::ImageFolder {
        path: tmp.path().join("f1"),
    };
    let g = grown(
        &index_of(&folders, &roots),
        &folders,
        &[tmp.path().join("f2")],
        &roots,
    );
    assert_eq!(g.classes(), ["cat", "dog", "ant"]);
    assert_eq!(g.labels().collect::<Vec<_>>(), [0, 1, 2, 1]);
    // Shards are another kind of source (the server makes each part of the dataset's own
    // source, so this is a guard).
    let dir = tmp.path().join("t");
    write(
        &dir.join("s.tar"),
        &shard(&[
            ("k.jpg".into(), b"k".to_vec()),
            ("k.cls".into(), b"0".to_vec()),
        ]),
    );
    let tars = index_of(
        &SourceSpec::TarShards {
            paths: vec![dir],
            fields: None,
        },
        &roots,
    );
    let e = refusal(base.appended(&tars).unwrap_err());
    assert!(e.contains("another kind of source"), "{e}");
}

#[test]
fn sources_that_do_not_grow_say_why() {
    let array: SourceSpec =
        serde_json::from_value(serde_json::json!({"kind": "array", "paths": ["/d/x.npy"]}))
            .unwrap();
    let e = refusal(
        array
            .appended_parts(&[PathBuf::from("/d/y.npy")])
            .unwrap_err(),
    );
    assert!(e.contains("does not grow"), "{e}");
    let s3: SourceSpec = serde_json::from_value(serde_json::json!(
        {"kind": "s3", "url": "s3://b/p", "layout": "tar_shards"}))
    .unwrap();
    let e = refusal(s3.appended_parts(&[PathBuf::from("/d/y.tar")]).unwrap_err());
    assert!(e.contains("reindex"), "{e}");
    let shards = SourceSpec::TarShards {
        paths: vec![PathBuf::from("/d/a.tar")],
        fields: None,
    };
    let e = refusal(shards.appended_parts(&[]).unwrap_err());
    assert!(e.contains("at least one path"), "{e}");
}

//! Small files written by the `parquet` crate's writer in Hugging Face's shape (the
//! integration tests use files written by `pyarrow`).

use std::fs;
use std::sync::Arc;

use parquet::basic::Encoding;
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{
    EnabledStatistics, WriterProperties, WriterPropertiesBuilder, WriterVersion,
};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use super::reader::{Budgets, Reader};
use super::{RowsInfo, read};
use crate::{DatasetIndex, Location, SourceSpec, StorageError, index};

/// A row: image bytes, image path, label (`None`: null).
struct Row {
    bytes: Option<Vec<u8>>,
    path: Option<&'static str>,
    label: Option<i64>,
}

fn row(tag: u8, label: i64) -> Row {
    Row {
        bytes: Some(image(tag)),
        path: None,
        label: Some(label),
    }
}

fn image(tag: u8) -> Vec<u8> {
    (0..200u32).map(|i| (i as u8).wrapping_mul(tag)).collect()
}

/// Writes `rows` as Hugging Face does: `image {bytes, path}`, `label` int64, `per_group`
/// rows per row group, and a `huggingface` metadata naming `names` when given.
fn write_hf(
    path: &std::path::Path,
    rows: &[Row],
    per_group: usize,
    compression: Compression,
    names: Option<&[&str]>,
) {
    let mut props = WriterProperties::builder()
        .set_compression(compression)
        .set_data_page_row_count_limit(2)
        .set_write_batch_size(1);
    if let Some(names) = names {
        let meta = serde_json::json!({"info": {"features": {
            "image": {"_type": "Image"},
            "label": {"names": names, "_type": "ClassLabel"},
        }}});
        props = props.set_key_value_metadata(Some(vec![KeyValue::new(
            "huggingface".into(),
            meta.to_string(),
        )]));
    }
    write_rows(path, rows, per_group, props.build());
}

/// Writes `rows` in Hugging Face's schema with the writer's properties `props`.
fn write_rows(path: &std::path::Path, rows: &[Row], per_group: usize, props: WriterProperties) {
    let schema = parse_message_type(
        "message hf { optional group image { optional binary bytes; \
         optional binary path (STRING); } optional int64 label; }",
    )
    .unwrap();
    let file = fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
    for group in rows.chunks(per_group) {
        let mut g = w.next_row_group().unwrap();
        // image.bytes, image.path, label: definition levels (2 = set, 1 = null in a
        // present struct) and the values that are set.
        let mut c = g.next_column().unwrap().unwrap();
        let defs: Vec<i16> = group.iter().map(|r| 1 + r.bytes.is_some() as i16).collect();
        let vals: Vec<ByteArray> = group
            .iter()
            .filter_map(|r| r.bytes.clone().map(ByteArray::from))
            .collect();
        c.typed::<ByteArrayType>()
            .write_batch(&vals, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        let defs: Vec<i16> = group.iter().map(|r| 1 + r.path.is_some() as i16).collect();
        let vals: Vec<ByteArray> = group
            .iter()
            .filter_map(|r| r.path.map(ByteArray::from))
            .collect();
        c.typed::<ByteArrayType>()
            .write_batch(&vals, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        let defs: Vec<i16> = group.iter().map(|r| r.label.is_some() as i16).collect();
        let vals: Vec<i64> = group.iter().filter_map(|r| r.label).collect();
        c.typed::<Int64Type>()
            .write_batch(&vals, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        g.close().unwrap();
    }
    w.close().unwrap();
}

fn spec(paths: &[&std::path::Path], fields: Option<serde_json::Value>) -> SourceSpec {
    let mut v = serde_json::json!({"kind": "parquet", "paths": paths});
    if let Some(f) = fields {
        v["fields"] = f;
    }
    serde_json::from_value(v).unwrap()
}

fn index_of(spec: &SourceSpec, root: &std::path::Path) -> Result<DatasetIndex, StorageError> {
    index(spec, &[root.to_owned()], &mut |_| {})
}

/// `dir/a.parquet`: two image rows of classes 0 and 1, snappy.
fn two_rows(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("a.parquet");
    write_hf(
        &file,
        &[row(1, 0), row(2, 1)],
        10,
        Compression::SNAPPY,
        None,
    );
    file
}

#[test]
fn rows_read_back_across_files_row_groups_and_codecs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    fs::create_dir_all(&dir).unwrap();
    let codecs = [
        Compression::SNAPPY,
        Compression::ZSTD(ZstdLevel::try_new(3).unwrap()),
        Compression::GZIP(GzipLevel::default()),
        Compression::UNCOMPRESSED,
    ];
    let names = ["cat", "dog", "eel"];
    let mut expected = Vec::new();
    for (f, codec) in codecs.into_iter().enumerate() {
        let rows: Vec<Row> = (0..7u8)
            .map(|i| row(f as u8 * 10 + i + 1, i64::from(i % 3)))
            .collect();
        expected.extend(
            rows.iter()
                .map(|r| (r.bytes.clone().unwrap(), r.label.unwrap())),
        );
        write_hf(
            &dir.join(format!("train-{f:05}.parquet")),
            &rows,
            3,
            codec,
            Some(&names),
        );
    }
    fs::write(dir.join("README.md"), "not a parquet file").unwrap();
    let ix = index_of(&spec(&[&dir], None), tmp.path()).unwrap();
    assert_eq!(ix.len(), expected.len());
    assert_eq!(ix.classes(), names);
    assert_eq!(ix.shards().len(), 4);
    assert_eq!(
        ix.location(4),
        Some(Location::ParquetRow {
            file: 0,
            row_group: 1,
            row: 1
        })
    );
    for (id, (bytes, label)) in expected.iter().enumerate() {
        let id = id as u32;
        assert_eq!(&ix.read(id).unwrap(), bytes, "item {id}");
        assert_eq!(ix.label(id), Some(*label));
    }
    assert!(
        ix.describe(8)
            .unwrap()
            .ends_with("train-00001.parquet row group 0 row 1")
    );
    // The persisted form reads back, rows and all.
    let back = DatasetIndex::from_bytes(&ix.to_bytes()).unwrap();
    assert_eq!(back, ix);
    assert_eq!(back.read(20).unwrap(), expected[20].0);
}

#[test]
fn a_row_with_only_a_path_is_read_from_under_the_roots() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, outside) = (tmp.path().join("root"), tmp.path().join("outside"));
    fs::create_dir_all(root.join("ds/images")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(root.join("ds/images/a.jpg"), image(9)).unwrap();
    fs::write(outside.join("b.jpg"), image(11)).unwrap();
    let path_row = |path| Row {
        bytes: None,
        path: Some(path),
        label: Some(1),
    };
    let rows = [
        row(3, 0),
        path_row("images/a.jpg"),
        path_row("../../outside/b.jpg"),
        path_row("images/missing.jpg"),
        Row {
            bytes: None,
            path: None,
            label: Some(0),
        },
    ];
    let file = root.join("ds/data.parquet");
    write_hf(&file, &rows, 10, Compression::SNAPPY, None);
    let ix = index_of(&spec(&[&file], None), &root).unwrap();
    assert_eq!(ix.classes(), ["0", "1"]);
    assert_eq!(ix.read(0).unwrap(), image(3));
    assert_eq!(ix.read(1).unwrap(), image(9));
    assert_eq!(ix.read(2).unwrap_err().code(), "outside_roots");
    assert_eq!(ix.read(3).unwrap_err().code(), "not_found");
    let e = ix.read(4).unwrap_err();
    assert_eq!(e.code(), "bad_parquet");
    assert!(e.to_string().contains("bytes and path are null"), "{e}");
}

#[test]
fn a_row_of_an_object_with_only_a_path_is_an_error_naming_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("a.jpg"), image(9)).unwrap();
    let rows = [
        row(3, 0),
        Row {
            bytes: None,
            path: Some("a.jpg"),
            label: Some(1),
        },
    ];
    let file = fs::canonicalize(tmp.path()).unwrap().join("data.parquet");
    write_hf(&file, &rows, 10, Compression::SNAPPY, None);
    let store = Store::of(std::slice::from_ref(&file));
    let ix = index_objects(&store, std::slice::from_ref(&file), None, Vec::new()).unwrap();
    super::reader_of(ix.rows_info().unwrap()).set_objects(Arc::new(store));
    assert_eq!(ix.read(0).unwrap(), image(3));
    // No file is read from the local disk for an object's row, even one that exists.
    let e = ix.read(1).unwrap_err();
    assert_eq!(e.code(), "bad_parquet");
    assert!(e.to_string().contains("only the path `a.jpg`"), "{e}");
}

#[test]
fn damaged_files_and_bad_labels_fail_indexing_with_their_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let file = two_rows(tmp.path());
    let whole = fs::read(&file).unwrap();
    let cut = tmp.path().join("cut.parquet");
    fs::write(&cut, &whole[..whole.len() - 20]).unwrap();
    let e = index_of(&spec(&[&cut], None), tmp.path()).unwrap_err();
    assert_eq!(e.code(), "bad_parquet", "{e}");

    let nulls = tmp.path().join("null-label.parquet");
    let no_label = Row {
        bytes: Some(image(1)),
        path: None,
        label: None,
    };
    write_hf(
        &nulls,
        &[row(1, 0), no_label, row(2, -1), row(3, 1)],
        10,
        Compression::SNAPPY,
        Some(&["a", "b"]),
    );
    // A null class and a -1 (a Hugging Face test split's) are unlabelled rows: -1, no class.
    let index = index_of(&spec(&[&nulls], None), tmp.path()).unwrap();
    assert_eq!(index.labels().collect::<Vec<_>>(), vec![0, -1, -1, 1]);
    assert_eq!(index.classes(), ["a", "b"]);
    let below = tmp.path().join("below.parquet");
    write_hf(&below, &[row(1, -2)], 10, Compression::SNAPPY, None);
    let e = index_of(&spec(&[&below], None), tmp.path()).unwrap_err();
    assert_eq!(e.code(), "bad_label", "{e}");
    assert!(e.to_string().contains("or -1: unlabelled"), "{e}");

    let unnamed = tmp.path().join("unnamed.parquet");
    write_hf(
        &unnamed,
        &[row(1, 2)],
        10,
        Compression::SNAPPY,
        Some(&["a", "b"]),
    );
    let e = index_of(&spec(&[&unnamed], None), tmp.path()).unwrap_err();
    assert!(e.to_string().contains("label 2 has no name"), "{e}");

    let other = tmp.path().join("other.parquet");
    write_hf(
        &other,
        &[row(1, 0)],
        10,
        Compression::SNAPPY,
        Some(&["x", "y"]),
    );
    let named = tmp.path().join("named.parquet");
    write_hf(
        &named,
        &[row(1, 0)],
        10,
        Compression::SNAPPY,
        Some(&["a", "b"]),
    );
    let e = index_of(&spec(&[&named, &other], None), tmp.path()).unwrap_err();
    assert!(e.to_string().contains("class names differ"), "{e}");
}

#[test]
fn a_panic_of_the_parquet_reader_is_an_error_of_the_file() {
    let e = super::guarded::<()>(std::path::Path::new("/d/a.parquet"), || {
        panic!("index out of bounds")
    })
    .unwrap_err();
    assert_eq!(e.code(), "bad_parquet");
    assert!(e.to_string().contains("/d/a.parquet"), "{e}");
    assert!(e.to_string().contains("index out of bounds"), "{e}");
}

#[allow(
    clippy::too_many_lines,
    reason = "a test that reads straight through, one case after another"
)]
#[test]
fn fields_name_the_columns_and_refuse_what_is_not_supported() {
    let tmp = tempfile::tempdir().unwrap();
    let file = two_rows(tmp.path());
    let fields = serde_json::json!({
        "img": {"kind": "image", "from": "image"},
        "cls": {"kind": "class", "from": "label"},
    });
    let ix = index_of(&spec(&[&file], Some(fields)), tmp.path()).unwrap();
    assert_eq!(ix.read(1).unwrap(), image(2));

    let missing = serde_json::json!({
        "img": {"kind": "image", "from": "picture"},
        "cls": {"kind": "class"},
    });
    let e = index_of(&spec(&[&file], Some(missing)), tmp.path()).unwrap_err();
    assert!(e.to_string().contains("no column `picture`"), "{e}");
    let not_image = serde_json::json!({
        "img": {"kind": "image", "from": "label"},
        "cls": {"kind": "class"},
    });
    let e = index_of(&spec(&[&file], Some(not_image)), tmp.path()).unwrap_err();
    assert!(e.to_string().contains("is not an image"), "{e}");
    let not_class = serde_json::json!({
        "img": {"kind": "image"},
        "cls": {"kind": "class", "from": "image"},
    });
    let e = index_of(&spec(&[&file], Some(not_class)), tmp.path()).unwrap_err();
    assert!(e.to_string().contains("no class column `image`"), "{e}");

    // Small fields come from columns, checked when the dataset is indexed.
    let missing = serde_json::json!({"image": {"kind": "image"}, "label": {"kind": "class"},
                                     "caption": {"kind": "text", "from": "text"}});
    let e = index_of(&spec(&[&file], Some(missing)), tmp.path()).unwrap_err();
    assert!(
        e.to_string().contains("field `caption`: no column `text`"),
        "{e}"
    );
    let not_text =
        serde_json::json!({"image": {"kind": "image"}, "t": {"kind": "text", "from": "label"}});
    let e = index_of(&spec(&[&file], Some(not_text)), tmp.path()).unwrap_err();
    assert!(
        e.to_string()
            .contains("field `t`: column `label` cannot be a `text` field"),
        "{e}"
    );
    // Declared fields without a class: every label is 0, whatever the files hold.
    let unlabelled =
        serde_json::json!({"image": {"kind": "image"}, "t": {"kind": "json", "from": "label"}});
    let ix = index_of(&spec(&[&file], Some(unlabelled)), tmp.path()).unwrap();
    assert_eq!(ix.labels().collect::<Vec<_>>(), [0, 0]);
    assert_eq!(ix.classes(), ["0"]);
    // A number column read as JSON, or as an array (a scalar), row by row.
    let fields = serde_json::json!({"image": {"kind": "image"}, "label": {"kind": "class"},
                                    "j": {"kind": "json", "from": "label"},
                                    "n": {"kind": "npy", "from": "label"},
                                    "p": {"kind": "bytes", "from": "image"}});
    let e = index_of(&spec(&[&file], Some(fields.clone())), tmp.path()).unwrap_err();
    assert!(
        e.to_string()
            .contains("field `p`: column `image` cannot be a `bytes` field"),
        "{e}"
    );
    let _ = fields;
    let fields = serde_json::json!({"image": {"kind": "image"}, "label": {"kind": "class"},
                                    "j": {"kind": "json", "from": "label"},
                                    "n": {"kind": "npy", "from": "label", "shape": []}});
    let ix = index_of(&spec(&[&file], Some(fields)), tmp.path()).unwrap();
    for id in 0..2u32 {
        let s = ix.split(id, ix.read(id).unwrap()).unwrap();
        assert_eq!(s.image, image(id as u8 + 1));
        assert_eq!(s.fields[0].value, id.to_string().as_bytes());
        let npy = &s.fields[1].value;
        assert_eq!(crate::fields::npy_shape(npy).unwrap(), Vec::<u64>::new());
        assert_eq!(&npy[npy.len() - 8..], &i64::from(id).to_le_bytes());
    }
    // Rows without an image: a declaration without one reads no image column; the sample is
    // its small fields.
    let imageless = serde_json::json!({"label": {"kind": "class"},
                                       "j": {"kind": "json", "from": "label"}});
    let ix = index_of(&spec(&[&file], Some(imageless)), tmp.path()).unwrap();
    assert!(!ix.has_image());
    for id in 0..2u32 {
        let s = ix.split(id, ix.read(id).unwrap()).unwrap();
        assert!(s.image.is_empty());
        assert_eq!(s.fields[0].value, id.to_string().as_bytes());
        let whole = ix.split_whole(id, ix.read_whole_row(id).unwrap()).unwrap();
        assert_eq!(whole, s);
    }
    for (fields, says) in [
        (
            serde_json::json!({"label": {"kind": "class"}}),
            "no field of kind `image`",
        ),
        (
            serde_json::json!({"a": {"kind": "image"}, "b": {"kind": "image"},
                               "label": {"kind": "class"}}),
            "2 fields of kind `image`",
        ),
    ] {
        let v = serde_json::json!({"kind": "parquet", "paths": [&file], "fields": fields});
        let e = serde_json::from_value::<SourceSpec>(v).unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
}

/// Incompressible bytes, as a JPEG's are: `len` of them from `seed`.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The layouts a Parquet writer may choose for an image column: codec, dictionary or not
/// (with a small dictionary limit, so that a chunk holds a dictionary page, dictionary-coded
/// pages and PLAIN pages), data pages v1 or v2, several pages per row group, an offset index
/// or none, and whether its rows can be located (Snappy or no codec, PLAIN values).
fn layouts() -> Vec<(&'static str, WriterProperties, bool)> {
    let base = |codec, dictionary, v2: bool, offset_index: bool| {
        WriterProperties::builder()
            .set_compression(codec)
            .set_dictionary_enabled(dictionary)
            .set_dictionary_page_size_limit(6000)
            .set_writer_version(if v2 {
                WriterVersion::PARQUET_2_0
            } else {
                WriterVersion::PARQUET_1_0
            })
            .set_offset_index_disabled(!offset_index)
            .set_statistics_enabled(if offset_index {
                EnabledStatistics::Page
            } else {
                EnabledStatistics::None
            })
            .set_data_page_row_count_limit(3)
            .set_write_batch_size(1)
    };
    // The crate's v2 pages default to DELTA_BYTE_ARRAY (values that are no slice of their
    // page), without a dictionary or after it: PLAIN where a layout says so, as pyarrow
    // writes.
    let plain = |b: WriterPropertiesBuilder| b.set_encoding(Encoding::PLAIN).build();
    let (snappy, none) = (Compression::SNAPPY, Compression::UNCOMPRESSED);
    let zstd = Compression::ZSTD(ZstdLevel::try_new(3).unwrap());
    let gzip = Compression::GZIP(GzipLevel::default());
    vec![
        (
            "snappy, dictionary, v1",
            base(snappy, true, false, false).build(),
            true,
        ),
        (
            "snappy, plain, v1, index",
            plain(base(snappy, false, false, true)),
            true,
        ),
        (
            "snappy, dictionary, v2, index",
            plain(base(snappy, true, true, true)),
            true,
        ),
        (
            "snappy, plain, v2",
            plain(base(snappy, false, true, false)),
            true,
        ),
        (
            "none, dictionary, v1",
            base(none, true, false, false).build(),
            true,
        ),
        (
            "none, plain, v2, index",
            plain(base(none, false, true, true)),
            true,
        ),
        (
            "snappy, delta, v2",
            base(snappy, false, true, false).build(),
            false,
        ),
        (
            "zstd, dictionary, v1",
            base(zstd, true, false, false).build(),
            false,
        ),
        (
            "gzip, plain, v2",
            plain(base(gzip, false, true, false)),
            false,
        ),
    ]
}

/// One file per layout in `dir`, 3 row groups of 7 rows of noise (some rows compressible,
/// some empty); the rows' bytes in id order.
fn write_layouts(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let mut expected = Vec::new();
    for (f, (_, props, _)) in layouts().into_iter().enumerate() {
        let rows: Vec<Row> = (0..21u64)
            .map(|i| {
                let seed = f as u64 * 100 + i;
                let bytes = match i % 7 {
                    3 => Vec::new(),
                    5 => image(i as u8 + 1).repeat(8),
                    _ => noise(seed, 500 + (seed as usize * 37) % 1500),
                };
                Row {
                    bytes: Some(bytes),
                    path: None,
                    label: Some((i % 3) as i64),
                }
            })
            .collect();
        expected.extend(rows.iter().map(|r| r.bytes.clone().unwrap()));
        write_rows(&dir.join(format!("part-{f:02}.parquet")), &rows, 7, props);
    }
    expected
}

/// Reads item `id` of `ix` through `info` (a reader of its own).
fn read_with(ix: &DatasetIndex, info: &RowsInfo, id: u32) -> Vec<u8> {
    let Some(Location::ParquetRow {
        file,
        row_group,
        row,
    }) = ix.location(id)
    else {
        panic!("item {id} is no Parquet row");
    };
    read(&ix.shards()[file as usize], file, info, row_group, row)
        .unwrap_or_else(|e| panic!("item {id}: {e}"))
}

fn info_with(ix: &DatasetIndex, budgets: Budgets) -> RowsInfo {
    let info = ix.rows_info().unwrap();
    RowsInfo {
        column: info.column.clone(),
        roots: info.roots.clone(),
        state: crate::index::ReadState::with(Reader::with_budgets(budgets)),
    }
}

/// A fixed order that jumps between files and row groups.
fn shuffled(n: u32) -> impl Iterator<Item = u32> {
    (0..n).map(move |i| (i * 7919 + 13) % n)
}

#[test]
fn every_layout_reads_right_and_a_located_row_costs_about_its_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = write_layouts(tmp.path());
    let ix = index_of(&spec(&[tmp.path()], None), tmp.path()).unwrap();
    assert_eq!(ix.len(), expected.len());
    // Nothing kept decoded: a row is read from its directory.
    let info = info_with(
        &ix,
        Budgets {
            decoded: 0,
            ..Budgets::default()
        },
    );
    let n = expected.len() as u32;
    for id in shuffled(n) {
        assert_eq!(
            read_with(&ix, &info, id),
            expected[id as usize],
            "item {id}"
        );
    }
    let first = super::reader_of(&info).reads();
    let groups = layouts().len() as u64 * 3;
    assert_eq!(first.rows, u64::from(n));
    // Snappy and uncompressed groups are decoded once; zstd and gzip (2 files) each time
    // one of their rows is read while their decoded rows are not kept.
    assert!(first.groups_decoded >= groups, "{first:?}");
    for id in shuffled(n) {
        assert_eq!(
            read_with(&ix, &info, id),
            expected[id as usize],
            "item {id}"
        );
    }
    let second = super::reader_of(&info).reads();
    let layouts = layouts();
    let located: Vec<u32> = (0..n)
        .filter(|&id| {
            let Some(Location::ParquetRow { file, .. }) = ix.location(id) else {
                unreachable!()
            };
            layouts[file as usize].2
        })
        .collect();
    let located_files = layouts.iter().filter(|l| l.2).count() as u64;
    // The located layouts cost about their bytes on a second read:
    // the whole of a second pass over them reads and decompresses less than twice their
    // bytes (the compressible rows' pieces start where their back-references reach).
    let info2 = info_with(
        &ix,
        Budgets {
            decoded: 0,
            ..Budgets::default()
        },
    );
    for &id in &located {
        read_with(&ix, &info2, id);
    }
    let built = super::reader_of(&info2).reads();
    for &id in &located {
        assert_eq!(
            read_with(&ix, &info2, id),
            expected[id as usize],
            "item {id}"
        );
    }
    let again = super::reader_of(&info2).reads();
    let bytes: u64 = located
        .iter()
        .map(|&id| expected[id as usize].len() as u64)
        .sum();
    assert_eq!(again.groups_decoded, built.groups_decoded, "{again:?}");
    assert_eq!(again.decoded_hits, 0, "{again:?}");
    assert_eq!(built.groups_decoded, located_files * 3, "{built:?}");
    assert!(
        again.bytes_read - built.bytes_read < 2 * bytes,
        "{built:?} {again:?}"
    );
    assert!(
        again.bytes_decompressed - built.bytes_decompressed < 2 * bytes,
        "{built:?} {again:?}"
    );
    assert!(second.rows == 2 * u64::from(n));
}

#[test]
fn memory_stays_within_the_budgets_and_dropped_state_is_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = write_layouts(tmp.path());
    let ix = index_of(&spec(&[tmp.path()], None), tmp.path()).unwrap();
    let budgets = Budgets {
        files: 2,
        directories: 2000,
        decoded: 20_000,
        ..Budgets::default()
    };
    let info = info_with(&ix, budgets);
    let n = expected.len() as u32;
    for pass in 0..2 {
        for id in shuffled(n) {
            assert_eq!(
                read_with(&ix, &info, id),
                expected[id as usize],
                "pass {pass} item {id}"
            );
            let held = super::reader_of(&info).held();
            assert!(held.files <= budgets.files, "{held:?}");
            assert!(
                held.group_bytes <= budgets.directories || held.groups == 1,
                "{held:?}"
            );
            assert!(held.decoded_bytes <= budgets.decoded, "{held:?}");
        }
    }
    // Groups were dropped and read again.
    assert!(super::reader_of(&info).reads().groups_decoded > layouts().len() as u64 * 3);
}

#[test]
fn loader_threads_share_one_reader() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = write_layouts(tmp.path());
    let ix = index_of(&spec(&[tmp.path()], None), tmp.path()).unwrap();
    let n = expected.len() as u32;
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (ix, expected) = (&ix, &expected);
            s.spawn(move || {
                for id in shuffled(n).map(|i| (i + t * 5) % n) {
                    assert_eq!(ix.read(id).unwrap(), expected[id as usize], "item {id}");
                }
            });
        }
    });
    let reads = ix.parquet_reads().unwrap();
    assert_eq!(reads.rows, 4 * u64::from(n));
}

/// Files read as objects: each a buffer served by ranges, counting the ranges asked for
/// and their bytes (what an `s3` source's GETs would be).
#[derive(Clone, Default)]
struct Store {
    objects: Arc<std::collections::HashMap<std::path::PathBuf, bytes::Bytes>>,
    asked: Arc<std::sync::atomic::AtomicU64>,
    bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Every request fails as a store gone away does.
    down: Arc<std::sync::atomic::AtomicBool>,
}

struct StoreRanges {
    store: Store,
    object: bytes::Bytes,
}

impl super::Ranges for StoreRanges {
    fn get(&self, ranges: &[std::ops::Range<u64>]) -> Result<Vec<bytes::Bytes>, StorageError> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.store.down.load(Relaxed) {
            return Err(StorageError::Remote {
                url: "memory".into(),
                code: "unavailable",
                message: "gave up after 3 attempts".into(),
            });
        }
        self.store.asked.fetch_add(ranges.len() as u64, Relaxed);
        ranges
            .iter()
            .map(|r| {
                let got = self
                    .object
                    .get(r.start as usize..r.end as usize)
                    .ok_or_else(|| StorageError::Remote {
                        url: "memory".into(),
                        code: "refused",
                        message: format!("no bytes {r:?}"),
                    })?;
                self.store.bytes.fetch_add(got.len() as u64, Relaxed);
                Ok(self.object.slice_ref(got))
            })
            .collect()
    }
}

impl Store {
    fn of(files: &[std::path::PathBuf]) -> Store {
        let objects = files
            .iter()
            .map(|f| (f.clone(), bytes::Bytes::from(fs::read(f).unwrap())))
            .collect();
        Store {
            objects: Arc::new(objects),
            ..Store::default()
        }
    }

    fn input(&self, file: &std::path::Path) -> Arc<super::Input> {
        let object = self.objects[file].clone();
        let len = object.len() as u64;
        let ranges = StoreRanges {
            store: self.clone(),
            object,
        };
        super::Input::object(Box::new(ranges), len)
    }

    fn asked(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.asked.load(Relaxed), self.bytes.load(Relaxed))
    }
}

impl super::Objects for Store {
    fn open(&self, _n: u32, recorded: &std::path::Path) -> Result<Arc<super::Input>, StorageError> {
        Ok(self.input(recorded))
    }
}

/// Indexes `files` as objects of `store`.
fn index_objects(
    store: &Store,
    files: &[std::path::PathBuf],
    fields: Option<&crate::fields::Fields>,
    roots: Vec<std::path::PathBuf>,
) -> Result<DatasetIndex, StorageError> {
    let open = |n: usize| Ok(store.input(&files[n]));
    let inputs = super::Files {
        recorded: files.to_vec(),
        named: files.to_vec(),
        open: &open,
        ahead: 2,
    };
    let roots = crate::roots::Roots::from_canonical(roots);
    let mut report = |_| {};
    let mut progress = crate::Progress {
        count: 0,
        report: &mut report,
    };
    super::index_files(&inputs, fields, &roots, &mut progress)
}

#[test]
fn objects_read_through_ranges_give_the_local_rows_at_a_request_per_row() {
    let tmp = tempfile::tempdir().unwrap();
    // Files larger than the tail fetched for a footer: 4 groups of 10 rows of 5000 bytes.
    let mut files = Vec::new();
    let mut expected = Vec::new();
    for f in 0..2u64 {
        let rows: Vec<Row> = (0..40u64)
            .map(|i| Row {
                bytes: Some(noise(f * 1000 + i, 5000)),
                path: None,
                label: Some((i % 3) as i64),
            })
            .collect();
        expected.extend(rows.iter().map(|r| r.bytes.clone().unwrap()));
        let file = tmp.path().join(format!("train-{f}.parquet"));
        write_hf(
            &file,
            &rows,
            10,
            Compression::SNAPPY,
            Some(&["a", "b", "c"]),
        );
        files.push(fs::canonicalize(&file).unwrap());
    }
    let local = index_of(&spec(&[tmp.path()], None), tmp.path()).unwrap();
    let store = Store::of(&files);
    let roots = vec![fs::canonicalize(tmp.path()).unwrap()];
    let ix = index_objects(&store, &files, None, roots).unwrap();
    // The same index: rows, labels and class names.
    assert_eq!(ix, local);
    assert_eq!(ix.classes(), ["a", "b", "c"]);
    // Indexing asked for each footer's tail (twice: rows counted, then read) and each label
    // chunk outside it, never for an image.
    let (asked, bytes) = store.asked();
    assert!(asked <= 2 * 2 + 2 * 4, "{asked} requests");
    let images: u64 = expected.iter().map(|e| e.len() as u64).sum();
    assert!(bytes < images, "{bytes} bytes of {images}");
    // Reads through the objects, nothing kept decoded: a row group's first read takes its
    // chunk, each later row one request of about its own bytes.
    let info = info_with(
        &ix,
        Budgets {
            decoded: 0,
            ..Budgets::default()
        },
    );
    super::reader_of(&info).set_objects(Arc::new(store.clone()));
    let n = expected.len() as u32;
    let read_all = || {
        for id in shuffled(n) {
            let got = read_with(&ix, &info, id);
            assert_eq!(got, expected[id as usize], "item {id}");
        }
    };
    read_all();
    let before = store.asked();
    read_all();
    let after = store.asked();
    assert!(after.0 - before.0 <= u64::from(n), "{before:?} {after:?}");
    assert!(after.1 - before.1 < 2 * images, "{before:?} {after:?}");
    assert_eq!(super::reader_of(&info).reads().rows, 2 * u64::from(n));
}

#[test]
fn a_truncated_object_fails_indexing_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = fs::canonicalize(two_rows(tmp.path())).unwrap();
    let whole = fs::read(&file).unwrap();
    for cut in [whole.len() / 2, 4] {
        let mut store = Store::of(std::slice::from_ref(&file));
        store.objects = Arc::new(
            [(file.clone(), bytes::Bytes::from(whole[..cut].to_vec()))]
                .into_iter()
                .collect(),
        );
        match index_objects(&store, std::slice::from_ref(&file), None, Vec::new()) {
            Err(StorageError::BadParquet { path, reason }) => {
                assert_eq!(path, file, "{reason}");
            }
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
}

#[test]
fn a_store_that_fails_is_the_error_of_indexing_and_of_reads_not_a_damaged_file() {
    use std::sync::atomic::Ordering::Relaxed;
    let tmp = tempfile::tempdir().unwrap();
    let file = fs::canonicalize(two_rows(tmp.path())).unwrap();
    let store = Store::of(std::slice::from_ref(&file));
    let files = std::slice::from_ref(&file);
    store.down.store(true, Relaxed);
    let e = index_objects(&store, files, None, Vec::new()).unwrap_err();
    assert_eq!(e.code(), "s3_unavailable", "{e}");
    store.down.store(false, Relaxed);
    let ix = index_objects(&store, files, None, Vec::new()).unwrap();
    super::reader_of(ix.rows_info().unwrap()).set_objects(Arc::new(store.clone()));
    store.down.store(true, Relaxed);
    let e = ix.read(0).unwrap_err();
    assert_eq!(e.code(), "s3_unavailable", "{e}");
    // The store back: the rows read.
    store.down.store(false, Relaxed);
    assert_eq!(ix.read(1).unwrap(), image(2));
}

/// Loader threads reading rows and their small fields at once (a struct column as `json`,
/// kept per row group): every thread gets the values a lone reader gets, each group's column
/// is read once while kept, and no two threads wait on each other for good (the test fails
/// after a minute instead of hanging).
#[test]
fn loader_threads_share_the_fields_kept() {
    let tmp = tempfile::tempdir().unwrap();
    write_layouts(tmp.path());
    let fields = serde_json::json!({
        "img": {"kind": "image", "from": "image"},
        "label": {"kind": "class"},
        "whole": {"kind": "json", "from": "image"},
    });
    let ix = index_of(&spec(&[tmp.path()], Some(fields.clone())), tmp.path()).unwrap();
    let n = ix.len() as u32;
    let fields_of = |ix: &DatasetIndex, id: u32| {
        let sample = ix.split(id, ix.read(id).unwrap()).unwrap();
        sample
            .fields
            .into_iter()
            .map(|f| f.value)
            .collect::<Vec<_>>()
    };
    // A lone reader on a copy of the index (its own read state).
    let alone = index_of(&spec(&[tmp.path()], Some(fields)), tmp.path()).unwrap();
    let expected: Vec<_> = (0..n).map(|id| fields_of(&alone, id)).collect();
    let (done, finished) = std::sync::mpsc::channel();
    let ix = Arc::new(ix);
    let expected = Arc::new(expected);
    for t in 0..4u32 {
        let (ix, expected, done) = (ix.clone(), expected.clone(), done.clone());
        std::thread::spawn(move || {
            for id in shuffled(n).map(|i| (i + t * 5) % n) {
                assert_eq!(fields_of(&ix, id), expected[id as usize], "item {id}");
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..4 {
        finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a reader thread failed or is stuck");
    }
    let reads = ix.parquet_reads().unwrap();
    assert!(reads.field_groups >= 1, "{reads:?}");
    assert_eq!(
        reads.field_groups + reads.field_hits,
        4 * u64::from(n),
        "{reads:?}"
    );
}

/// A split of a Hugging Face dataset folder: `{"kind": "parquet", "paths": [folder],
/// "split": split}`.
fn split_spec(folder: &std::path::Path, split: &str) -> SourceSpec {
    serde_json::from_value(
        serde_json::json!({"kind": "parquet", "paths": [folder], "split": split}),
    )
    .unwrap()
}

/// Writes `n` rows into `path` (creating its folder).
fn rows_file(path: &std::path::Path, n: u8) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let rows: Vec<Row> = (0..n).map(|i| row(i + 1, i64::from(i % 2))).collect();
    write_hf(path, &rows, 10, Compression::SNAPPY, None);
}

#[test]
fn a_hub_folder_gives_the_split_named_as_the_hub_lays_it_out() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // As `datasets` uploads a dataset: data/<split>-NNNNN-of-NNNNN.parquet.
    let beans = root.join("beans");
    rows_file(&beans.join("data/train-00000-of-00002.parquet"), 3);
    rows_file(&beans.join("data/train-00001-of-00002.parquet"), 4);
    rows_file(&beans.join("data/validation-00000-of-00001.parquet"), 2);
    rows_file(&beans.join("data/test-00000-of-00001.parquet"), 5);
    fs::write(beans.join("README.md"), "# beans\nno front matter\n").unwrap();
    let len = |spec: &SourceSpec| index_of(spec, root).unwrap().len();
    assert_eq!(len(&split_spec(&beans, "train")), 7);
    assert_eq!(len(&split_spec(&beans, "validation")), 2);
    assert_eq!(len(&split_spec(&beans, "test")), 5);
    // The whole folder (not recursive) holds no file: the split is what a user names.
    let e = split_spec(&beans, "dev").check_roots(&[root.to_owned()]);
    assert!(e.is_ok(), "`dev` is a name of the validation split: {e:?}");
    let e = split_spec(&beans, "unlabeled")
        .check_roots(&[root.to_owned()])
        .unwrap_err();
    assert_eq!(e.code(), "no_match");
    assert!(e.to_string().contains("split `unlabeled`"), "{e}");
    // The Hub's Parquet conversion: <config>/<split>/NNNN.parquet; a folder per split.
    let converted = root.join("converted");
    rows_file(&converted.join("default/train/0000.parquet"), 3);
    rows_file(&converted.join("default/test/0000.parquet"), 1);
    assert_eq!(len(&split_spec(&converted, "train")), 3);
    assert_eq!(len(&split_spec(&converted, "test")), 1);
    // A split in the file's name.
    let flat = root.join("flat");
    rows_file(&flat.join("mnist-train-0.parquet"), 2);
    rows_file(&flat.join("mnist-test-0.parquet"), 1);
    assert_eq!(len(&split_spec(&flat, "train")), 2);
    // Glob patterns in `paths` select files too.
    let glob = spec(&[&beans.join("data/train-*.parquet")], None);
    assert_eq!(len(&glob), 7);
}

#[test]
fn a_dataset_card_configs_give_the_split_files() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let ds = root.join("ds");
    rows_file(&ds.join("parts/a-0.parquet"), 3);
    rows_file(&ds.join("parts/a-1.parquet"), 2);
    rows_file(&ds.join("parts/b-0.parquet"), 4);
    // The Hub's layout would find nothing here: the card's configs name the files.
    fs::write(
        ds.join("README.md"),
        "---\nlicense: mit\nconfigs:\n- config_name: small\n  data_files:\n  - split: train\n    path: parts/b-*\n\
         - config_name: full\n  default: true\n  data_files:\n  - split: train\n    path:\n    - parts/a-*\n  \
         - split: test\n    path: parts/b-0.parquet\n---\n# ds\n",
    )
    .unwrap();
    assert_eq!(index_of(&split_spec(&ds, "train"), root).unwrap().len(), 5);
    assert_eq!(index_of(&split_spec(&ds, "test"), root).unwrap().len(), 4);
    let e = split_spec(&ds, "validation")
        .check_roots(&[root.to_owned()])
        .unwrap_err();
    assert_eq!(e.code(), "no_match");
    assert!(e.to_string().contains("names other splits"), "{e}");
}

/// Zstd and gzip groups (one dictionary page per group, as pyarrow writes images) read in a
/// shuffled order with nothing decoded kept: with a spill each group is decoded once, and
/// every later read of a row is its own bytes; without, each read decodes its group again.
#[test]
fn a_spilled_zstd_or_gzip_row_costs_its_own_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let rows: Vec<Row> = (0..60u8)
        .map(|t| row(t.wrapping_add(1), i64::from(t % 3)))
        .collect();
    let zstd = Compression::ZSTD(ZstdLevel::try_new(3).unwrap());
    write_hf(&tmp.path().join("a.parquet"), &rows[..30], 10, zstd, None);
    let gzip = Compression::GZIP(GzipLevel::default());
    write_hf(&tmp.path().join("b.parquet"), &rows[30..], 10, gzip, None);
    let ix = index_of(&spec(&[tmp.path()], None), tmp.path()).unwrap();
    let n = ix.len() as u32;
    let expected: Vec<Vec<u8>> = rows.iter().map(|r| r.bytes.clone().unwrap()).collect();
    let none = Budgets {
        decoded: 0,
        ..Budgets::default()
    };
    let row_bytes: u64 = expected.iter().map(|r| r.len() as u64).sum();

    let spill = super::spill::Spill::new(tmp.path().join("spill"), 1 << 20);
    let ix_info = ix.rows_info().unwrap();
    let info = RowsInfo {
        column: ix_info.column.clone(),
        roots: ix_info.roots.clone(),
        state: crate::index::ReadState::with(Reader::with_spill(none, spill)),
    };
    for pass in 0..2 {
        for id in shuffled(n) {
            assert_eq!(
                read_with(&ix, &info, id),
                expected[id as usize],
                "pass {pass}, item {id}"
            );
        }
    }
    let r = super::reader_of(&info).reads();
    assert_eq!(r.groups_decoded, 6, "each group decoded once: {r:?}");
    assert_eq!(r.spilled_groups, 6, "{r:?}");
    assert_eq!(r.spill_hits, 2 * u64::from(n) - 6, "{r:?}");
    assert_eq!(r.spill_bytes, row_bytes, "{r:?}");
    // Past the groups' first decodes (their chunks read and decompressed), a row costs its
    // bytes: the second pass read exactly the rows' bytes and decompressed nothing.
    let before = r;
    for id in shuffled(n) {
        read_with(&ix, &info, id);
    }
    let after = super::reader_of(&info).reads();
    assert_eq!(after.bytes_read - before.bytes_read, row_bytes);
    assert_eq!(after.bytes_decompressed, before.bytes_decompressed);

    // Without a spill, each of those reads decodes its group again.
    let plain = info_with(&ix, none);
    for id in shuffled(n) {
        read_with(&ix, &plain, id);
    }
    let r = super::reader_of(&plain).reads();
    assert_eq!(r.groups_decoded, u64::from(n), "{r:?}");
    assert_eq!((r.spilled_groups, r.spill_hits), (0, 0));
}

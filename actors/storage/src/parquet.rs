//! `parquet`: Parquet files as the Hugging Face Hub stores image datasets: an image column
//! (Hugging Face's `{bytes: binary, path: string}` struct, or plain binary) beside an
//! integer class column, with the class names in the file's `huggingface` metadata
//! (`features.<column>` of `_type` `ClassLabel`, its `names`).
//!
//! Indexing reads each file's footer and the class column's pages only; an item is a row,
//! located by (file, row group, row in the group). Reading an item parses the footer again
//! (a few KiB for Hugging Face's files, whose row groups hold about 100 rows), reads the page
//! headers of the row group's image column, skips the pages before the row without reading
//! them, and decompresses the one page that holds it: memory is bounded by a page.
//!
//! We use the `parquet` crate's low-level column readers, not its `arrow` feature: an
//! element is one value of one column in one row group, which needs no columnar batch, and
//! the arrow crates would be most of the compile time.
//!
//! A row whose image `bytes` is null and whose `path` is set is read from that path,
//! relative to the Parquet file's folder, if it lies under the allowed roots in force when
//! the dataset was indexed (kept in the index), else the element is an error record.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::Type as PhysicalType;
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{ByteArray, ByteArrayType, DataType, Int32Type, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader, RowGroupMetaData};
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::SchemaDescriptor;

use super::fields::{FieldKind, Fields};
use super::index::IndexBuilder;
use super::roots::Roots;
use super::{
    DatasetIndex, MAX_MEMBER_LEN, Progress, StorageError, is_hidden, numeric_classes, numeric_label,
};

/// The class column when no `class` field names one.
const DEFAULT_CLASS_COLUMN: &str = "label";

/// Labels read from the class column at once.
const LABEL_BATCH: usize = 4096;

/// The Parquet files named by `paths`: files as they are, folders expanded to the
/// `*.parquet` files they hold (not recursive, hidden files skipped), sorted by name.
fn parquet_files(paths: &[PathBuf], roots: &Roots) -> Result<Vec<PathBuf>, StorageError> {
    let mut files = Vec::new();
    for path in paths {
        let canonical = roots.check(path)?;
        if !canonical.is_dir() {
            files.push(canonical);
            continue;
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&canonical).map_err(|e| StorageError::io(path, e))? {
            let entry = entry.map_err(|e| StorageError::io(path, e))?;
            let name = entry.file_name();
            let is_parquet = Path::new(&name)
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
            if is_hidden(&name) || !is_parquet {
                continue;
            }
            let file = roots.check(&entry.path())?;
            if file.is_file() {
                found.push((name, file));
            }
        }
        found.sort();
        files.extend(found.into_iter().map(|(_, f)| f));
    }
    Ok(files)
}

/// The `BadParquet` error of file `path`, for a reason.
fn bad(path: &Path) -> impl Fn(String) -> StorageError + '_ {
    |reason| StorageError::BadParquet {
        path: path.to_owned(),
        reason,
    }
}

/// The `parquet` crate may panic on malformed input: a damaged file must be an error (of
/// the dataset, or of the element), never a dead indexing or Loader thread.
fn guarded<T>(path: &Path, f: impl FnOnce() -> Result<T, StorageError>) -> Result<T, StorageError> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(bad(path)(format!("the Parquet reader failed: {what}")))
    })
}

pub(super) fn index(
    paths: &[PathBuf],
    fields: Option<&Fields>,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let named = paths.first().map_or_else(PathBuf::new, |p| p.clone());
    guarded(&named, || index_files(paths, fields, roots, progress))
}

fn index_files(
    paths: &[PathBuf],
    fields: Option<&Fields>,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let files = parquet_files(paths, roots)?;
    let image_from = fields.and_then(|f| f.from_of(FieldKind::Image).flatten());
    let class_from = fields
        .and_then(|f| f.from_of(FieldKind::Class).flatten())
        .unwrap_or(DEFAULT_CLASS_COLUMN);
    let mut image_column: Option<String> = None;
    let mut names: Option<(PathBuf, Vec<String>)> = None;
    let mut items = IndexBuilder::rows();
    for (n, path) in files.iter().enumerate() {
        let n = u32::try_from(n).map_err(|_| StorageError::TooManyItems)?;
        let bad = bad(path);
        let reader = Pread::open(path).map_err(|e| StorageError::io(path, e))?;
        let meta = reader.metadata(path)?;
        let schema = meta.file_metadata().schema_descr();
        let hf = HfFeatures::of(&meta);
        // The image column is chosen in the first file; the others must hold it too.
        let column = match &image_column {
            Some(c) => c.clone(),
            None => image_from
                .map(str::to_owned)
                .or_else(|| default_image_column(schema, &hf))
                .ok_or_else(|| {
                    bad("no image column: none is a Hugging Face image struct \
                         {bytes, path} or binary; name it with a field of kind `image`"
                        .into())
                })?,
        };
        ImageColumn::find(schema, &column).map_err(&bad)?;
        image_column = Some(column);
        let class = class_leaf(schema, class_from).map_err(&bad)?;
        if let Some(file_names) = hf.class_names(class_from) {
            match &names {
                Some((first, known)) if *known != file_names => {
                    return Err(bad(format!(
                        "its class names differ from those of {}",
                        first.display()
                    )));
                }
                Some(_) => {}
                None => names = Some((path.clone(), file_names)),
            }
        }
        for g in 0..meta.num_row_groups() {
            let group = u32::try_from(g).map_err(|_| StorageError::TooManyItems)?;
            let labels = read_labels(&reader, meta.row_group(g), class).map_err(&bad)?;
            for (row, label) in labels.into_iter().enumerate() {
                let what = || format!("row {row} of row group {g} in {}", path.display());
                let label = label.ok_or_else(|| StorageError::BadLabel {
                    what: what(),
                    reason: format!("column `{class_from}` is null"),
                })?;
                let label = numeric_label(label, &what)?;
                let row = u32::try_from(row).map_err(|_| StorageError::TooManyItems)?;
                items.push_row(n, group, row, label);
                progress.tick()?;
            }
        }
    }
    let classes = match names {
        Some((_, names)) => {
            if let Some(&max) = items.labels_mut().iter().max()
                && max as usize >= names.len()
            {
                return Err(StorageError::BadLabel {
                    what: format!("column `{class_from}`"),
                    reason: format!(
                        "label {max} has no name: the Hugging Face metadata names {} classes",
                        names.len()
                    ),
                });
            }
            names
        }
        None => numeric_classes(items.labels_mut()),
    };
    let rows = RowsInfo {
        column: image_column.unwrap_or_default(),
        roots: roots.canonical().to_vec(),
    };
    Ok(items.finish_rows(classes, files, rows))
}

/// What reading a row needs besides its location: the image column's name, and the allowed
/// roots (canonical) that a row's `path` must lie under.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq, Default)]
pub(crate) struct RowsInfo {
    pub(crate) column: String,
    pub(crate) roots: Vec<PathBuf>,
}

/// Reads the image of row `row` of row group `group` in file `path`.
pub(super) fn read(
    path: &Path,
    info: &RowsInfo,
    group: u32,
    row: u32,
) -> Result<Vec<u8>, StorageError> {
    guarded(path, || read_row(path, info, group, row))
}

fn read_row(path: &Path, info: &RowsInfo, group: u32, row: u32) -> Result<Vec<u8>, StorageError> {
    let bad = bad(path);
    let reader = Pread::open(path).map_err(|e| StorageError::read(path, e))?;
    let meta = reader.metadata(path)?;
    let schema = meta.file_metadata().schema_descr();
    let image = ImageColumn::find(schema, &info.column).map_err(&bad)?;
    let group_meta = (group as usize)
        .lt(&meta.num_row_groups())
        .then(|| meta.row_group(group as usize))
        .ok_or_else(|| {
            bad(format!(
                "no row group {group} (the file changed since indexing?)"
            ))
        })?;
    let cell = |leaf: usize| {
        read_cell(&reader, group_meta, leaf, row as usize)
            .map_err(|e| bad(format!("row {row} of row group {group}: {e}")))
    };
    if let Some(bytes) = cell(image.bytes)? {
        return Ok(bytes.data().to_vec());
    }
    let stored = match image.path {
        Some(leaf) => cell(leaf)?,
        None => None,
    };
    let Some(stored) = stored else {
        return Err(bad(format!(
            "row {row} of row group {group} has no image: its bytes and path are null"
        )));
    };
    let stored = std::str::from_utf8(stored.data()).map_err(|_| {
        bad(format!(
            "row {row} of row group {group}: its path is not UTF-8"
        ))
    })?;
    let folder = path.parent().unwrap_or(Path::new("/"));
    let target = folder.join(stored);
    let canonical = Roots::from_canonical(info.roots.clone()).check(&target)?;
    let len = std::fs::metadata(&canonical)
        .map_err(|e| StorageError::read(&canonical, e))?
        .len();
    if len > MAX_MEMBER_LEN {
        return Err(StorageError::ReadFailed {
            path: canonical,
            source: io::Error::new(io::ErrorKind::InvalidData, "image file too large"),
        });
    }
    std::fs::read(&canonical).map_err(|e| StorageError::read(&canonical, e))
}

/// The leaf columns of an image column: Hugging Face's struct (`bytes` and `path`), or one
/// binary column.
struct ImageColumn {
    bytes: usize,
    path: Option<usize>,
}

impl ImageColumn {
    /// The image column named `name` (a top-level column), checked to have an image's shape.
    fn find(schema: &SchemaDescriptor, name: &str) -> Result<ImageColumn, String> {
        let leaves: Vec<(usize, &[String])> = schema
            .columns()
            .iter()
            .enumerate()
            .filter(|(_, c)| c.path().parts().first().is_some_and(|p| p == name))
            .map(|(i, c)| (i, c.path().parts()))
            .collect();
        if leaves.is_empty() {
            return Err(format!("no column `{name}`"));
        }
        let binary = |i: usize| {
            let c = schema.column(i);
            c.physical_type() == PhysicalType::BYTE_ARRAY && c.max_rep_level() == 0
        };
        let shape = || {
            format!(
                "column `{name}` is not an image: expected binary or a struct {{bytes: \
                 binary, path: string}}"
            )
        };
        match leaves.as_slice() {
            [(i, [_])] if binary(*i) => Ok(ImageColumn {
                bytes: *i,
                path: None,
            }),
            [_, _] => {
                let leaf = |field: &str| {
                    leaves
                        .iter()
                        .find(|(_, p)| p.len() == 2 && p[1] == field)
                        .map(|(i, _)| *i)
                        .filter(|&i| binary(i))
                };
                match (leaf("bytes"), leaf("path")) {
                    (Some(bytes), Some(path)) => Ok(ImageColumn {
                        bytes,
                        path: Some(path),
                    }),
                    _ => Err(shape()),
                }
            }
            _ => Err(shape()),
        }
    }
}

/// The image column when no field names one: the column Hugging Face's metadata types as
/// `Image`, else the first one of an image's shape.
fn default_image_column(schema: &SchemaDescriptor, hf: &HfFeatures) -> Option<String> {
    let candidates: Vec<&str> = schema
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name())
        .filter(|n| ImageColumn::find(schema, n).is_ok())
        .collect();
    candidates
        .iter()
        .find(|n| hf.type_of(n) == Some("Image"))
        .or(candidates.first())
        .map(|n| (*n).to_owned())
}

/// The class column's leaf: a top-level 32- or 64-bit integer column, not repeated.
fn class_leaf(schema: &SchemaDescriptor, name: &str) -> Result<usize, String> {
    let found = schema
        .columns()
        .iter()
        .position(|c| c.path().parts() == [name]);
    let Some(i) = found else {
        return Err(format!(
            "no class column `{name}`: name the class column with a field of kind `class`"
        ));
    };
    let c = schema.column(i);
    let integer = matches!(c.physical_type(), PhysicalType::INT32 | PhysicalType::INT64);
    if !integer || c.max_rep_level() != 0 {
        return Err(format!("column `{name}` is not an integer column"));
    }
    Ok(i)
}

/// The class column's values in one row group (`None` where null).
fn read_labels(
    reader: &Arc<Pread>,
    group: &RowGroupMetaData,
    leaf: usize,
) -> Result<Vec<Option<i64>>, String> {
    match group.schema_descr().column(leaf).physical_type() {
        PhysicalType::INT32 => read_column::<Int32Type>(reader, group, leaf, i64::from),
        _ => read_column::<Int64Type>(reader, group, leaf, |v| v),
    }
    .map_err(|e| e.to_string())
}

/// Every value of a non-repeated column in one row group, nulls as `None`.
fn read_column<T: DataType>(
    reader: &Arc<Pread>,
    group: &RowGroupMetaData,
    leaf: usize,
    convert: fn(T::T) -> i64,
) -> Result<Vec<Option<i64>>, ParquetError>
where
    T::T: Copy,
{
    let rows = usize::try_from(group.num_rows()).unwrap_or(0);
    let mut column = column_reader::<T>(reader, group, leaf)?;
    let max_def = group.schema_descr().column(leaf).max_def_level();
    let mut out = Vec::with_capacity(rows);
    let (mut defs, mut values) = (Vec::new(), Vec::new());
    while out.len() < rows {
        defs.clear();
        values.clear();
        let (records, _, _) =
            column.read_records(LABEL_BATCH, Some(&mut defs), None, &mut values)?;
        if records == 0 {
            return Err(ParquetError::General(format!(
                "the column ends after {} of its {rows} rows",
                out.len()
            )));
        }
        if max_def == 0 {
            out.extend(values.iter().map(|&v| Some(convert(v))));
        } else {
            let mut v = values.iter();
            for &d in &defs[..records] {
                out.push(if d == max_def {
                    v.next().map(|&x| convert(x))
                } else {
                    None
                });
            }
        }
    }
    Ok(out)
}

/// The value of one row of a non-repeated binary column (`None` where null), reading the
/// pages before it by their headers only.
fn read_cell(
    reader: &Arc<Pread>,
    group: &RowGroupMetaData,
    leaf: usize,
    row: usize,
) -> Result<Option<ByteArray>, ParquetError> {
    let mut column = column_reader::<ByteArrayType>(reader, group, leaf)?;
    if column.skip_records(row)? != row {
        return Err(ParquetError::General(
            "the row group has fewer rows than the index says (the file changed since \
             indexing?)"
                .into(),
        ));
    }
    let (mut defs, mut values) = (Vec::new(), Vec::new());
    let (records, _, _) = column.read_records(1, Some(&mut defs), None, &mut values)?;
    if records != 1 {
        return Err(ParquetError::General("the row is missing".into()));
    }
    let max_def = group.schema_descr().column(leaf).max_def_level();
    let present = max_def == 0 || defs.first() == Some(&max_def);
    Ok(if present { values.pop() } else { None })
}

fn column_reader<T: DataType>(
    reader: &Arc<Pread>,
    group: &RowGroupMetaData,
    leaf: usize,
) -> Result<ColumnReaderImpl<T>, ParquetError> {
    let chunk = group.column(leaf);
    let rows = usize::try_from(group.num_rows()).unwrap_or(0);
    let pages = SerializedPageReader::new(reader.clone(), chunk, rows, None)?;
    Ok(ColumnReaderImpl::<T>::new(
        group.schema_descr().column(leaf),
        Box::new(pages),
    ))
}

/// The `huggingface` key of a file's metadata: `{"info": {"features": {...}}}` as the
/// `datasets` library writes it (or `{"features": ...}`).
struct HfFeatures(Option<serde_json::Value>);

impl HfFeatures {
    fn of(meta: &ParquetMetaData) -> HfFeatures {
        let value = meta
            .file_metadata()
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|kv| kv.key == "huggingface"))
            .and_then(|kv| kv.value.as_deref())
            .and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok());
        let features = value.and_then(|v| {
            v.pointer("/info/features")
                .or_else(|| v.get("features"))
                .cloned()
        });
        HfFeatures(features)
    }

    fn type_of(&self, column: &str) -> Option<&str> {
        self.0.as_ref()?.get(column)?.get("_type")?.as_str()
    }

    /// The names of a `ClassLabel` column.
    fn class_names(&self, column: &str) -> Option<Vec<String>> {
        if self.type_of(column) != Some("ClassLabel") {
            return None;
        }
        let names = self.0.as_ref()?.get(column)?.get("names")?.as_array()?;
        names
            .iter()
            .map(|n| n.as_str().map(str::to_owned))
            .collect()
    }
}

/// A Parquet file read with positioned reads (`pread`), so that readers on several threads
/// share no file offset.
struct Pread {
    file: Arc<File>,
    len: u64,
}

impl Pread {
    fn open(path: &Path) -> io::Result<Arc<Pread>> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(Arc::new(Pread {
            file: Arc::new(file),
            len,
        }))
    }

    /// The file's footer, parsed (its page indexes are not read).
    fn metadata(&self, path: &Path) -> Result<ParquetMetaData, StorageError> {
        ParquetMetaDataReader::new()
            .parse_and_finish(self)
            .map_err(|e| bad(path)(format!("its footer cannot be read: {e}")))
    }
}

impl Length for Pread {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Pread {
    type T = BufReader<At>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(BufReader::new(At {
            file: self.file.clone(),
            pos: start,
        }))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        if start
            .checked_add(length as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(ParquetError::EOF(format!(
                "{length} bytes at {start} run past the end of the file ({} bytes; truncated?)",
                self.len
            )));
        }
        let mut buf = vec![0u8; length];
        self.file.read_exact_at(&mut buf, start)?;
        Ok(Bytes::from(buf))
    }
}

/// A reader at a position of a shared file.
struct At {
    file: Arc<File>,
    pos: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    //! Small files written by the `parquet` crate's writer in Hugging Face's shape (the
    //! integration tests use files written by `pyarrow`).

    use std::fs;
    use std::sync::Arc;

    use parquet::basic::{Compression, GzipLevel, ZstdLevel};
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

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
        let schema = parse_message_type(
            "message hf { optional group image { optional binary bytes; \
             optional binary path (STRING); } optional int64 label; }",
        )
        .unwrap();
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
        let file = fs::File::create(path).unwrap();
        let mut w =
            SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props.build())).unwrap();
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
            &[row(1, 0), no_label],
            10,
            Compression::SNAPPY,
            None,
        );
        let e = index_of(&spec(&[&nulls], None), tmp.path()).unwrap_err();
        assert_eq!(e.code(), "bad_label", "{e}");

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

        for (fields, says) in [
            (
                serde_json::json!({"image": {"kind": "image"}, "label": {"kind": "class"},
                                   "caption": {"kind": "text", "from": "text"}}),
                "field `caption`: fields of kind `text` are not supported yet",
            ),
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
}

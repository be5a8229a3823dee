//! `parquet`: Parquet files as the Hugging Face Hub stores image datasets: an image column
//! (Hugging Face's `{bytes: binary, path: string}` struct, or plain binary) beside an
//! integer class column, with the class names in the file's `huggingface` metadata
//! (`features.<column>` of `_type` `ClassLabel`, its `names`).
//!
//! Indexing reads each file's footer and the class column's pages only; an item is a row,
//! located by (file, row group, row in the group). Reading items goes through the dataset's
//! [`reader::Reader`], kept in its index: footers parsed once, each row group's image column
//! decoded once and its rows located, then each row read as about its own bytes (a piece
//! of a Snappy stream, `snappy.rs`), with bounded memory.
//!
//! We use the `parquet` crate's low-level column readers, not its `arrow` feature: an
//! element is one value of one column in one row group, which needs no columnar batch, and
//! the arrow crates would be most of the compile time.
//!
//! Small fields (`text`, `json`, `npy`, `bytes`) come from other columns of the row
//! (`small.rs`), read when the element is.
//!
//! A row whose image `bytes` is null and whose `path` is set is read from that path,
//! relative to the Parquet file's folder, if it lies under the allowed roots in force when
//! the dataset was indexed (kept in the index), else the element is an error record.

use std::io;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::Type as PhysicalType;
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{ByteArray, ByteArrayType, DataType, Int32Type, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, RowGroupMetaData};
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::SchemaDescriptor;

mod input;
mod pages;
mod reader;
mod small;
mod snappy;
mod spill;

use input::OpenFile;
use input::{FileRead, read_ahead, read_file};
pub(crate) use input::{Files, Input, Ranges};
use reader::Found;
pub(crate) use reader::Objects;
pub use reader::{DECODED_BUDGET, DIRECTORY_BUDGET, FIELDS_BUDGET, ParquetBudgets, ParquetReads};
pub use spill::{DEFAULT_SPILL_MAX, ParquetSpill, default_spill_bytes, reset_spill_dir};

use super::fields::{FieldKind, Fields};
use super::index::{IndexBuilder, NO_CLASS, RowsInfo, SampleFields};
use super::roots::Roots;
use super::{DatasetIndex, MAX_MEMBER_LEN, Progress, StorageError, numeric_classes, numeric_label};

/// The class column when no `class` field names one.
const DEFAULT_CLASS_COLUMN: &str = "label";

/// Labels read from the class column at once.
const LABEL_BATCH: usize = 4096;

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
    input::clear_store_error();
    std::panic::catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|panic| Err(reader_failed(path, &*panic)))
        .map_err(input::store_error_or)
}

/// The error of a panic of the `parquet` crate reading `path`.
fn reader_failed(path: &Path, panic: &(dyn std::any::Any + Send)) -> StorageError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    bad(path)(format!("the Parquet reader failed: {what}"))
}

/// The Parquet files a source names: with a `split`, that split's files of each dataset folder
/// in `paths` ([`crate::select::hub_split`]); else `paths` as files, folders and patterns.
pub(crate) fn files(
    paths: &[PathBuf],
    split: Option<&str>,
    roots: &Roots,
) -> Result<Vec<PathBuf>, StorageError> {
    let Some(split) = split else {
        return roots.files_with_extension(paths, "parquet");
    };
    let mut files = Vec::new();
    for folder in paths {
        files.extend(crate::select::hub_split(roots, folder, split)?);
    }
    Ok(files)
}

pub(super) fn index(
    files: &[PathBuf],
    fields: Option<&Fields>,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let open = |n: usize| Input::open(&files[n]).map_err(|e| StorageError::io(&files[n], e));
    let inputs = Files {
        recorded: files.to_vec(),
        named: files.to_vec(),
        open: &open,
        ahead: 1,
    };
    index_files(&inputs, fields, roots, progress)
}

/// Indexes `files` in their order: their footers, then their class column's chunks (for an
/// object, each file's chunks fetched at once). A panic of the crate is an error of the
/// first file; a failed read of an object is the store's error.
pub(crate) fn index_files(
    files: &Files<'_>,
    fields: Option<&Fields>,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let named = files.named.first().cloned().unwrap_or_default();
    guarded(&named, || index_all(files, fields, roots, progress))
}

fn index_all(
    files: &Files<'_>,
    fields: Option<&Fields>,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let image_from = fields.and_then(|f| f.from_of(FieldKind::Image).flatten());
    let imaged = fields.is_none_or(Fields::has_image);
    // The rows the footers declare, so that the columns are allocated once (growing them
    // would leave the server holding up to twice their size); and the column the first
    // file's Hugging Face metadata types as `ClassLabel`.
    let (declared, class_label) = declared_rows(files)?;
    // The class column: the declared one, else the `ClassLabel` column (`labels` in some
    // published sets), else `label`.
    let class_from = fields
        .and_then(|f| f.from_of(FieldKind::Class).flatten())
        .or(class_label.as_deref())
        .unwrap_or(DEFAULT_CLASS_COLUMN);
    // Declared fields without a class: every label is 0, no class column is read.
    let labelled = fields.is_none_or(|f| f.has(FieldKind::Class));
    let mut image_column: Option<String> = None;
    let mut names: Option<(PathBuf, Vec<String>)> = None;
    // The first file's number, and whether its class column holds text.
    let mut class_text: Option<(usize, bool)> = None;
    let count = files.named.len();
    // (A damaged footer may declare any count: beyond 64 M rows the columns grow as read.)
    let mut items = IndexBuilder::rows(declared.min(1 << 26));
    let small_fields = fields.filter(|f| f.small().next().is_some());
    items.sample = small_fields.map(|f| SampleFields::new(f, false).with_columns());
    let class_read = labelled.then_some(class_from);
    let read = |n: usize| read_file(files, n, class_read);
    let reads = (0..count)
        .step_by(files.ahead.max(1))
        .flat_map(|start| read_ahead(files, start, read));
    for (n, (path, file)) in files.named.iter().zip(reads).enumerate() {
        let bad = bad(path);
        let FileRead { meta, labels } = file?;
        let n = u32::try_from(n).map_err(|_| StorageError::TooManyItems)?;
        let schema = meta.file_metadata().schema_descr();
        let hf = HfFeatures::of(&meta);
        // The image column is chosen in the first file; the others must hold it too. A
        // declaration without an image field reads none (rows of small fields only).
        let column = match &image_column {
            Some(c) => c.clone(),
            None if !imaged => String::new(),
            None => image_from
                .map(str::to_owned)
                .or_else(|| default_image_column(schema, &hf))
                .ok_or_else(|| {
                    bad("no image column: none is a Hugging Face image struct \
                         {bytes, path} or binary; name it with a field of kind `image`"
                        .into())
                })?,
        };
        if imaged {
            ImageColumn::find(schema, &column).map_err(&bad)?;
        }
        image_column = Some(column);
        if let Some(f) = small_fields {
            small::columns(schema, f).map_err(&bad)?;
        }
        let class = if labelled {
            Some(class_leaf(schema, class_from).map_err(&bad)?)
        } else {
            None
        };
        if let Some(leaf) = class {
            let text = schema.column(leaf).physical_type() == PhysicalType::BYTE_ARRAY;
            same_class_kind(&mut class_text, (n as usize, text), files, class_from)
                .map_err(&bad)?;
        }
        if let Some(file_names) = hf.class_names(class_from).filter(|_| labelled) {
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
        // (Read with the footer when the class column was found, as the checks just did.)
        let labels = match (class, labels) {
            (Some(_), Some(read)) => Some(read.map_err(&bad)?),
            _ => None,
        };
        push_rows(&mut items, n, path, &meta, labels, progress)?;
    }
    let classes = class_names(names, &mut items, class_from)?;
    let rows = RowsInfo {
        column: image_column.unwrap_or_default(),
        roots: roots.canonical().to_vec(),
        state: Default::default(),
    };
    Ok(items.finish_rows(classes, files.recorded.clone(), rows))
}

/// Checks that file `n`'s class column holds what the first file's does (`text` or
/// integers): integers in one file and texts in another would number the classes two ways.
fn same_class_kind(
    first: &mut Option<(usize, bool)>,
    (n, text): (usize, bool),
    files: &Files<'_>,
    class_from: &str,
) -> Result<(), String> {
    let kind = |text: bool| if text { "text" } else { "integers" };
    match *first {
        Some((f, was)) if was != text => Err(format!(
            "its class column `{class_from}` holds {}, that of {} {}",
            kind(text),
            files.named[f].display(),
            kind(was),
        )),
        Some(_) => Ok(()),
        None => {
            *first = Some((n, text));
            Ok(())
        }
    }
}

/// The rows the files' footers declare, so that the columns are allocated once (growing
/// them would leave the server holding up to twice their size).
/// The rows the files' footers declare, and the `ClassLabel` column of the first file's
/// Hugging Face metadata.
fn declared_rows(files: &Files<'_>) -> Result<(usize, Option<String>), StorageError> {
    let mut declared = 0usize;
    let mut class_label = None;
    let footer = |n: usize| (files.open)(n)?.metadata(&files.named[n]);
    for start in (0..files.named.len()).step_by(files.ahead.max(1)) {
        for meta in read_ahead(files, start, footer) {
            let meta = meta?;
            if start == 0 && class_label.is_none() {
                class_label = HfFeatures::of(&meta).class_label_column();
            }
            let rows = usize::try_from(meta.file_metadata().num_rows()).unwrap_or(0);
            declared = declared.saturating_add(rows);
        }
    }
    Ok((declared, class_label))
}

/// Adds file `n`'s rows, group by group, with their labels (`None`: every label 0, no class
/// column read).
fn push_rows(
    items: &mut IndexBuilder,
    n: u32,
    path: &Path,
    meta: &ParquetMetaData,
    labels: Option<Vec<GroupLabels>>,
    progress: &mut Progress<'_>,
) -> Result<(), StorageError> {
    let mut labels = labels.map(Vec::into_iter);
    for g in 0..meta.num_row_groups() {
        let group = u32::try_from(g).map_err(|_| StorageError::TooManyItems)?;
        let rows = usize::try_from(meta.row_group(g).num_rows()).unwrap_or(0);
        let labels = match labels.as_mut().and_then(Iterator::next) {
            Some(GroupLabels::Numbers(numbers)) => {
                let mut labels = Vec::with_capacity(numbers.len());
                for (row, label) in numbers.into_iter().enumerate() {
                    let what = || format!("row {row} of row group {g} in {}", path.display());
                    // A null class cell is an unlabelled row, as a -1 is (test splits).
                    labels.push(numeric_label(label.unwrap_or(-1), &what)?);
                }
                labels
            }
            // Texts: provisional numbers, the classes the sorted texts (`class_names`).
            Some(GroupLabels::Texts(texts)) => texts
                .iter()
                .map(|t| t.as_deref().map_or(NO_CLASS, |t| items.texts.id(t)))
                .collect(),
            None if labels.is_some() => Vec::new(),
            None => vec![0; rows],
        };
        for (row, label) in labels.into_iter().enumerate() {
            let row = u32::try_from(row).map_err(|_| StorageError::TooManyItems)?;
            items.push_row(n, group, row, label);
            progress.tick()?;
        }
    }
    Ok(())
}

/// The class names: the Hugging Face metadata's (every label must have one), else the
/// numeric labels' own (see `numeric_classes`).
fn class_names(
    names: Option<(PathBuf, Vec<String>)>,
    items: &mut IndexBuilder,
    class_from: &str,
) -> Result<Vec<String>, StorageError> {
    Ok(match names {
        Some((path, _)) if !items.texts.is_empty() => {
            return Err(StorageError::BadLabel {
                what: format!("column `{class_from}`"),
                reason: format!(
                    "it holds text, yet the Hugging Face metadata of {} names its classes \
                     (a ClassLabel column holds integers)",
                    path.display()
                ),
            });
        }
        Some((_, names)) => {
            if let Some(&max) = items
                .labels_mut()
                .iter()
                .filter(|&&l| l != crate::index::NO_CLASS)
                .max()
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
        // A string class column: its texts, sorted.
        None if !items.texts.is_empty() => {
            items.text_classes(false, &|| format!("column `{class_from}`"))?
        }
        None => numeric_classes(items.labels_mut()),
    })
}

/// The bytes of leaf `leaf`'s column chunk in a row group.
fn chunk_range(group: &RowGroupMetaData, leaf: usize) -> std::ops::Range<u64> {
    let (start, len) = group.column(leaf).byte_range();
    start..start.saturating_add(len)
}

/// The dataset's read state (`reader.rs`), kept in its index's [`RowsInfo`] (made on first
/// use, never persisted).
pub(crate) fn reader_of(info: &RowsInfo) -> &reader::Reader {
    info.state.get_or_default::<reader::Reader>()
}

/// Reads the image of row `row` of row group `group` in file number `n`, at `path`.
pub(super) fn read(
    path: &Path,
    n: u32,
    info: &RowsInfo,
    group: u32,
    row: u32,
) -> Result<Vec<u8>, StorageError> {
    guarded(path, || read_row(path, n, info, group, row))
}

/// File number `n` at `path`, opened (its footer parsed) once and kept by the dataset's
/// reader, checked to hold row group `group`.
fn open_file(
    path: &Path,
    n: u32,
    info: &RowsInfo,
    group: u32,
) -> Result<Arc<OpenFile>, StorageError> {
    let bad = bad(path);
    let file = reader_of(info).file(n, || {
        let file = match reader_of(info).objects() {
            Some(objects) => objects.open(n, path)?,
            None => Input::open(path).map_err(|e| StorageError::read(path, e))?,
        };
        let meta = file.metadata(path)?;
        let image = if info.column.is_empty() {
            None
        } else {
            let schema = meta.file_metadata().schema_descr();
            Some(ImageColumn::find(schema, &info.column).map_err(&bad)?)
        };
        Ok(OpenFile { file, meta, image })
    })?;
    if group as usize >= file.meta.num_row_groups() {
        return Err(bad(format!(
            "no row group {group} (the file changed since indexing?)"
        )));
    }
    Ok(file)
}

/// The small fields' values (`None`: null) of row `row` of row group `group` in file number
/// `n`, at `path`, in the declaration's name order (`small.rs`).
pub(super) fn read_fields(
    path: &Path,
    n: u32,
    info: &RowsInfo,
    group: u32,
    row: u32,
    fields: &Fields,
) -> Result<crate::fields::FieldValues, StorageError> {
    guarded(path, || {
        let bad = bad(path);
        let file = open_file(path, n, info, group)?;
        let columns =
            small::columns(file.meta.file_metadata().schema_descr(), fields).map_err(&bad)?;
        small::read(reader_of(info), n, &file, &columns, fields, group, row)
            .map_err(|e| bad(format!("row {row} of row group {group}: {e}")))
    })
}

fn read_row(
    path: &Path,
    n: u32,
    info: &RowsInfo,
    group: u32,
    row: u32,
) -> Result<Vec<u8>, StorageError> {
    let bad = bad(path);
    let file = open_file(path, n, info, group)?;
    if file.image.is_none() {
        // Rows without an image: their small fields are the sample.
        return Ok(Vec::new());
    }
    let found = reader_of(info)
        .read_row(n, &file, group, row)
        .map_err(|e| bad(format!("row {row} of row group {group}: {e}")))?;
    match found {
        Found::Bytes(bytes) => Ok(bytes),
        Found::Null => read_path_row(path, info, &file, group, row),
    }
}

/// A row whose image `bytes` are null: its image is the file its `path` names.
fn read_path_row(
    path: &Path,
    info: &RowsInfo,
    file: &OpenFile,
    group: u32,
    row: u32,
) -> Result<Vec<u8>, StorageError> {
    let bad = bad(path);
    let stored = match file.image.as_ref().and_then(|i| i.path) {
        Some(leaf) => read_cell(
            &file.file,
            file.meta.row_group(group as usize),
            leaf,
            row as usize,
        )
        .map_err(|e| bad(format!("row {row} of row group {group}: {e}")))?,
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
    if file.file.is_object() {
        return Err(bad(format!(
            "row {row} of row group {group} holds no image bytes, only the path `{stored}`: \
             rows of an object store's Parquet files must hold their images"
        )));
    }
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

/// The class column's leaf: a top-level 32- or 64-bit integer or string (binary) column, not
/// repeated.
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
    let kind = matches!(
        c.physical_type(),
        PhysicalType::INT32 | PhysicalType::INT64 | PhysicalType::BYTE_ARRAY
    );
    if !kind || c.max_rep_level() != 0 {
        return Err(format!(
            "column `{name}` is neither an integer nor a string column"
        ));
    }
    Ok(i)
}

/// A row group's class cells (`None` where null): integers, or the texts of a string column.
pub(super) enum GroupLabels {
    Numbers(Vec<Option<i64>>),
    Texts(Vec<Option<String>>),
}

/// The class column's values in one row group.
fn read_labels(
    reader: &Arc<Input>,
    group: &RowGroupMetaData,
    leaf: usize,
) -> Result<GroupLabels, String> {
    match group.schema_descr().column(leaf).physical_type() {
        PhysicalType::INT32 => {
            read_column::<Int32Type, _>(reader, group, leaf, |v| Ok(i64::from(*v)))
                .map(GroupLabels::Numbers)
        }
        PhysicalType::BYTE_ARRAY => read_column::<ByteArrayType, _>(reader, group, leaf, |v| {
            std::str::from_utf8(v.data())
                .map(|s| s.trim().to_owned())
                .map_err(|_| ParquetError::General("a class cell is not UTF-8 text".into()))
        })
        .map(GroupLabels::Texts),
        _ => read_column::<Int64Type, _>(reader, group, leaf, |v| Ok(*v)).map(GroupLabels::Numbers),
    }
    .map_err(|e| e.to_string())
}

/// Every value of a non-repeated column in one row group, nulls as `None`.
fn read_column<T: DataType, V>(
    reader: &Arc<Input>,
    group: &RowGroupMetaData,
    leaf: usize,
    convert: impl Fn(&T::T) -> Result<V, ParquetError>,
) -> Result<Vec<Option<V>>, ParquetError> {
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
            for v in &values {
                out.push(Some(convert(v)?));
            }
        } else {
            let mut v = values.iter();
            for &d in &defs[..records] {
                // Only a defined cell has a value among `values`.
                let value = if d == max_def { v.next() } else { None };
                out.push(value.map(&convert).transpose()?);
            }
        }
    }
    Ok(out)
}

/// The value of one row of a non-repeated binary column (`None` where null), reading the
/// pages before it by their headers only.
fn read_cell(
    reader: &Arc<Input>,
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

/// Every row's value of binary leaf `leaf` in a row group (`None`: null), read in one pass
/// over its pages.
pub(super) fn read_cells(
    reader: &Arc<Input>,
    group: &RowGroupMetaData,
    leaf: usize,
) -> Result<Vec<Option<ByteArray>>, ParquetError> {
    let mut column = column_reader::<ByteArrayType>(reader, group, leaf)?;
    let rows = usize::try_from(group.num_rows()).unwrap_or(0);
    let max_def = group.schema_descr().column(leaf).max_def_level();
    let mut out = Vec::with_capacity(rows);
    while out.len() < rows {
        let (mut defs, mut values) = (Vec::new(), Vec::new());
        let (records, _, _) =
            column.read_records(rows - out.len(), Some(&mut defs), None, &mut values)?;
        if records == 0 {
            return Err(ParquetError::General(
                "the row group has fewer rows than its metadata says (the file changed since \
                 indexing?)"
                    .into(),
            ));
        }
        let mut values = values.into_iter();
        for k in 0..records {
            let present = max_def == 0 || defs.get(k) == Some(&max_def);
            out.push(if present { values.next() } else { None });
        }
    }
    Ok(out)
}

fn column_reader<T: DataType>(
    reader: &Arc<Input>,
    group: &RowGroupMetaData,
    leaf: usize,
) -> Result<ColumnReaderImpl<T>, ParquetError> {
    // An object's chunk with one GET (a local file's pages are read as they come).
    reader
        .prefetch(&[chunk_range(group, leaf)])
        .map_err(ParquetError::General)?;
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

    /// The first column (by name) typed `ClassLabel`.
    fn class_label_column(&self) -> Option<String> {
        let features = self.0.as_ref()?.as_object()?;
        features
            .iter()
            .find(|(_, f)| f.get("_type").and_then(|t| t.as_str()) == Some("ClassLabel"))
            .map(|(name, _)| name.clone())
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

#[cfg(test)]
mod tests;

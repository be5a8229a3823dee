//! `array`: NumPy `.npy` files aligned along their first dimension, as a dataset of samples
//! without an image: element `i` is row `i` of every array.
//!
//! Indexing reads each file's header only (and the whole of a `class` array, a 1-D integer
//! array whose values are the labels): the index keeps, per field array, where its data start,
//! the bytes of one row and the `.npy` header of one row (the array's dtype, the shape after
//! the first axis), so that it costs a few bytes per array and 4 per row (the label). Reading
//! an element is one positioned read per field array, through files opened once per dataset;
//! each value is the row as an `.npy` of its own (the header, then the row's bytes), checked
//! and delivered like any `npy` field.
//!
//! Refused at indexing (`bad_array`, naming the file): a file that is not an `.npy` of
//! format 1.0 to 3.0, a 0-dimensional array, a Fortran-ordered array of more than one
//! dimension (its rows are not contiguous), a file shorter than its header says, arrays with
//! different row counts, a declared `shape` that is not the rows' shape, and a `class` array
//! that is not 1-D integers.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::fields::{FieldKind, FieldSpec, Fields, NpyHeader, npy_start};
use crate::index::{IndexBuilder, SampleFields};
use crate::roots::Roots;
use crate::{DatasetIndex, Progress, StorageError};

/// The largest row read into memory (guards against a damaged persisted index).
const MAX_ROW: u64 = 1 << 32;

/// One field array of an indexed `array` dataset: where its rows are in its file (the
/// dataset's `shards()` entry of the same position).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ArrayColumn {
    /// Where the data start (after the header).
    pub(crate) data_start: u64,
    /// Bytes of one row.
    pub(crate) row_bytes: u64,
    /// The `.npy` header of one row (format 1.0): what each value starts with.
    #[serde(with = "serde_bytes")]
    pub(crate) row_header: Vec<u8>,
}

/// The files of an `array` dataset, opened on first read and kept (a read that fails to
/// open one tries again next time); or, for arrays in an object store, what reads their rows
/// there (installed by the source, `s3::array`).
#[derive(Default)]
pub(crate) struct OpenArrays {
    files: Mutex<Vec<Option<Arc<File>>>>,
    objects: std::sync::OnceLock<Arc<dyn ArrayObjects>>,
}

/// Reads rows of arrays that are objects: each `(key, byte range)` of `reads`, all at once.
pub(crate) trait ArrayObjects: Send + Sync {
    fn read(&self, reads: &[(&Path, std::ops::Range<u64>)]) -> Result<Vec<Vec<u8>>, StorageError>;
}

/// Where an array's header and labels are read from while it is indexed: a local file or an
/// object.
pub(crate) trait ArrayBytes {
    /// The file's or object's length.
    fn len(&self) -> u64;
    /// `len` bytes at `offset` (within [`ArrayBytes::len`]).
    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, StorageError>;
}

/// A local array file.
struct LocalArray {
    path: PathBuf,
    file: File,
    len: u64,
}

impl ArrayBytes for LocalArray {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, StorageError> {
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| StorageError::io(&self.path, e))?;
        Ok(buf)
    }
}

impl OpenArrays {
    /// Reads the rows through `objects` from now on (arrays in an object store).
    pub(crate) fn set_objects(&self, objects: Arc<dyn ArrayObjects>) {
        let _ = self.objects.set(objects);
    }

    fn file(&self, n: usize, path: &Path) -> Result<Arc<File>, StorageError> {
        let mut files = self
            .files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if files.len() <= n {
            files.resize(n + 1, None);
        }
        if let Some(f) = &files[n] {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(path).map_err(|e| StorageError::read(path, e))?);
        files[n] = Some(f.clone());
        Ok(f)
    }
}

/// A file's name without `.npy`: the field it is by default, and what a field's `from`
/// names.
fn stem(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    name.strip_suffix(".npy").filter(|s| !s.is_empty())
}

/// The files by stem, each a `.npy` named once.
fn by_stem(paths: &[PathBuf]) -> Result<BTreeMap<&str, &Path>, StorageError> {
    let bad = |reason: String| StorageError::BadFields { reason };
    if paths.is_empty() {
        return Err(bad(
            "an `array` source needs at least one `.npy` path".into()
        ));
    }
    let mut stems = BTreeMap::new();
    for p in paths {
        let Some(s) = stem(p) else {
            return Err(bad(format!(
                "{}: an `array` source's paths are `.npy` files (named `<field>.npy`)",
                p.display()
            )));
        };
        if stems.insert(s, p.as_path()).is_some() {
            return Err(bad(format!(
                "two paths are named `{s}.npy`: a field is named by its file, so each name \
                 must be unique (or declare `fields` from other names)"
            )));
        }
    }
    Ok(stems)
}

/// The default declaration of an `array` source: each file an `npy` field named by it.
pub(crate) fn default_fields(paths: &[PathBuf]) -> Result<Fields, StorageError> {
    let stems = by_stem(paths)?;
    let declared: BTreeMap<String, FieldSpec> = stems
        .keys()
        .map(|s| {
            (
                (*s).to_owned(),
                FieldSpec {
                    kind: FieldKind::Npy,
                    from: None,
                    shape: None,
                    boxes: None,
                    optional: false,
                },
            )
        })
        .collect();
    Fields::try_from(declared).map_err(|reason| StorageError::BadFields { reason })
}

/// Each declared field with its file, in the declaration's (name) order; the checks of
/// [`check_spec`].
fn fields_files<'a>(
    paths: &'a [PathBuf],
    fields: &'a Fields,
) -> Result<Vec<(&'a str, &'a FieldSpec, &'a Path)>, StorageError> {
    let bad = |reason: String| StorageError::BadFields { reason };
    let stems = by_stem(paths)?;
    let mut used = BTreeMap::new();
    let mut out = Vec::new();
    for (name, spec) in fields.iter() {
        check_field(name, spec).map_err(bad)?;
        let from = spec.from.as_deref().unwrap_or(name);
        let Some(path) = stems.get(from) else {
            return Err(bad(format!(
                "field `{name}`: no path is named `{from}.npy` (the paths: {})",
                stems
                    .keys()
                    .map(|s| format!("`{s}.npy`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        if let Some(other) = used.insert(from, name) {
            return Err(bad(format!(
                "fields `{other}` and `{name}` both come from `{from}.npy`"
            )));
        }
        out.push((name, spec, *path));
    }
    if let Some(unused) = stems.keys().find(|s| !used.contains_key(*s)) {
        return Err(bad(format!(
            "`{unused}.npy` is named by no field: declare a field from it, or leave it out of \
             `paths`"
        )));
    }
    Ok(out)
}

/// Checks an `array` declaration on its own (an `s3` array layout's, before its objects are
/// listed): `npy` fields and at most one `class`, none `optional` nor with `boxes`.
pub(crate) fn check_declaration(fields: &Fields) -> Result<(), StorageError> {
    let bad = |reason: String| StorageError::BadFields { reason };
    for (name, spec) in fields.iter() {
        check_field(name, spec).map_err(bad)?;
    }
    Ok(())
}

/// What every field of an `array` source must be.
fn check_field(name: &str, spec: &FieldSpec) -> Result<(), String> {
    if !matches!(spec.kind, FieldKind::Npy | FieldKind::Class) {
        return Err(format!(
            "field `{name}`: an `array` source's fields are `npy` arrays and at most one \
             `class`, not `{}` (its samples have no image)",
            spec.kind.name()
        ));
    }
    if spec.optional || spec.boxes.is_some() {
        return Err(format!(
            "field `{name}`: every row of an array has a value and no image to hold boxes: \
             declare it without `optional` and `boxes`"
        ));
    }
    Ok(())
}

/// Checks an `array` source before any indexing: `.npy` paths of distinct names, and a
/// declaration (when given) of `npy` fields and at most one `class`, each from one of them.
pub(crate) fn check_spec(paths: &[PathBuf], fields: Option<&Fields>) -> Result<(), StorageError> {
    match fields {
        Some(f) => fields_files(paths, f).map(drop),
        None => by_stem(paths).map(drop),
    }
}

/// An array's header, checked for rows: its first dimension, and the rest.
struct Rows {
    header: Vec<u8>,
    data_start: u64,
    rows: u64,
    row_bytes: u64,
}

/// Reads and checks the header of the array `path` names (canonical, or an object's name),
/// read from `bytes`.
fn read_header(path: &Path, bytes: &dyn ArrayBytes) -> Result<Rows, StorageError> {
    let bad = |reason: String| StorageError::BadArray {
        path: path.to_owned(),
        reason,
    };
    let file_len = bytes.len();
    // An object's header is read with one request when it fits in 4 KiB (NumPy pads it to
    // 64 bytes; a few hundred for most arrays).
    let start = bytes.read_at(0, file_len.min(4096) as usize)?;
    let header_len = NpyHeader::len_from_start(&start).map_err(bad)?;
    if header_len > file_len || header_len > 1 << 20 {
        return Err(bad(format!(
            "its header says it takes {header_len} bytes; the file has {file_len}"
        )));
    }
    let header = if header_len as usize <= start.len() {
        start[..header_len as usize].to_vec()
    } else {
        bytes.read_at(0, header_len as usize)?
    };
    let h = NpyHeader::parse(&header).map_err(bad)?;
    let Some((&rows, row_shape)) = h.shape.split_first() else {
        return Err(bad("a 0-dimensional array has no rows".into()));
    };
    if h.fortran_order && !row_shape.is_empty() {
        return Err(bad(
            "a Fortran-ordered array of more than one dimension: its rows are not \
             contiguous (save it with numpy.ascontiguousarray)"
                .into(),
        ));
    }
    let data = h.data_len();
    if data.is_none_or(|d| d > file_len - header_len) {
        return Err(bad(format!(
            "shape {:?} of {} needs {} bytes of data; the file has {} (truncated?)",
            h.shape,
            h.descr,
            data.map_or_else(|| "too many".into(), |d| d.to_string()),
            file_len - header_len
        )));
    }
    let row_bytes = row_shape
        .iter()
        .try_fold(h.item, |n, &d| n.checked_mul(d))
        .filter(|&b| b <= MAX_ROW)
        .ok_or_else(|| {
            bad(format!(
                "rows of shape {row_shape:?} of {}: at most 4 GiB a row",
                h.descr
            ))
        })?;
    let shape = match row_shape {
        [] => "()".to_owned(),
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let header = npy_start(&format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        h.descr
    ));
    Ok(Rows {
        header,
        data_start: h.data_start,
        rows,
        row_bytes,
    })
}

/// The row shape an `.npy` row header gives.
fn row_shape(header: &[u8]) -> Vec<u64> {
    NpyHeader::parse(header).map_or_else(|_| Vec::new(), |h| h.shape)
}

/// Reads a `class` array's labels: a 1-D array of integers.
fn read_labels(path: &Path, bytes: &dyn ArrayBytes, rows: &Rows) -> Result<Vec<i64>, StorageError> {
    let bad = |reason: String| StorageError::BadArray {
        path: path.to_owned(),
        reason,
    };
    let head = bytes.read_at(0, rows.data_start as usize)?;
    let h = NpyHeader::parse(&head).map_err(bad)?;
    if h.shape.len() != 1 || !matches!(h.kind, "i" | "u" | "b") || h.item > 8 {
        return Err(bad(format!(
            "a `class` array holds one integer per row: a 1-D array of integers, not {} of \
             shape {:?}",
            h.descr, h.shape
        )));
    }
    let item = h.item as usize;
    let data = bytes.read_at(rows.data_start, item * rows.rows as usize)?;
    let big = h.descr.starts_with('>');
    let signed = h.kind == "i";
    Ok(data
        .chunks_exact(item)
        .map(|c| {
            let mut b = [0u8; 8];
            if big {
                b[8 - item..].copy_from_slice(c);
                b.reverse();
            } else {
                b[..item].copy_from_slice(c);
            }
            let shift = 64 - 8 * item as u32;
            if signed {
                (i64::from_le_bytes(b) << shift) >> shift
            } else {
                i64::from_le_bytes(b)
            }
        })
        .collect())
}

/// Indexes an `array` source.
pub(crate) fn index(
    paths: &[PathBuf],
    fields: Option<&Fields>,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    index_with(paths, fields, progress, &mut |path| {
        let canonical = roots.check(path)?;
        let file = File::open(&canonical).map_err(|e| StorageError::io(&canonical, e))?;
        let len = file
            .metadata()
            .map_err(|e| StorageError::io(&canonical, e))?
            .len();
        let local = LocalArray {
            path: canonical.clone(),
            file,
            len,
        };
        Ok((canonical, Box::new(local) as Box<dyn ArrayBytes>))
    })
}

/// What opening one of an `array` source's paths gives: the name its index keeps (a
/// canonical path, an object's key) and its bytes.
pub(crate) type Opened = (PathBuf, Box<dyn ArrayBytes>);

/// Indexes an `array` source whose paths `open` opens (local files, or objects).
pub(crate) fn index_with(
    paths: &[PathBuf],
    fields: Option<&Fields>,
    progress: &mut Progress<'_>,
    open: &mut dyn FnMut(&Path) -> Result<Opened, StorageError>,
) -> Result<DatasetIndex, StorageError> {
    let fields = match fields {
        Some(f) => f.clone(),
        None => default_fields(paths)?,
    };
    let declared = fields_files(paths, &fields)?;
    let mut columns = Vec::new();
    let mut files = Vec::new();
    let mut labels = None;
    let mut count: Option<(u64, &Path)> = None;
    for (name, spec, path) in declared {
        let (canonical, bytes) = open(path)?;
        let rows = read_header(path, bytes.as_ref())?;
        match count {
            Some((n, first)) if n != rows.rows => {
                return Err(StorageError::BadArray {
                    path: path.to_owned(),
                    reason: format!(
                        "{} rows, but {} has {n}: the arrays are aligned along their first \
                         dimension",
                        rows.rows,
                        first.display()
                    ),
                });
            }
            _ => count = Some((rows.rows, path)),
        }
        if spec.kind == FieldKind::Class {
            labels = Some(read_labels(path, bytes.as_ref(), &rows)?);
            continue;
        }
        if let Some(want) = &spec.shape
            && *want != row_shape(&rows.header)
        {
            return Err(StorageError::BadArray {
                path: path.to_owned(),
                reason: format!(
                    "field `{name}` declares shape {want:?}, but its rows have shape {:?}",
                    row_shape(&rows.header)
                ),
            });
        }
        columns.push(ArrayColumn {
            data_start: rows.data_start,
            row_bytes: rows.row_bytes,
            row_header: rows.header,
        });
        files.push(canonical);
    }
    let rows = count.map_or(0, |(n, _)| n);
    let rows = u32::try_from(rows).map_err(|_| StorageError::TooManyItems)?;
    let mut builder = IndexBuilder::arrays(rows as usize, columns);
    builder.sample = Some(SampleFields::new(&fields, false));
    let what = |row: usize| move || format!("row {row} of the `class` array");
    let classes = match labels {
        Some(values) => {
            for (row, v) in values.into_iter().enumerate() {
                builder.push_array_row(crate::numeric_label(v, &what(row))?);
                progress.tick()?;
            }
            crate::numeric_classes(builder.labels_mut())
        }
        None => {
            for _ in 0..rows {
                builder.push_array_row(0);
                progress.tick()?;
            }
            vec!["0".to_owned()]
        }
    };
    Ok(builder.finish(classes, files))
}

/// Row `row` of each field array, as `.npy` values (the row's header, then its bytes), in the
/// declaration's order.
pub(crate) fn read_row(
    files: &[PathBuf],
    columns: &[ArrayColumn],
    open: &OpenArrays,
    row: u32,
) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
    if let Some(objects) = open.objects.get() {
        return read_row_objects(objects.as_ref(), files, columns, row);
    }
    let mut values = Vec::with_capacity(columns.len());
    for (n, (path, c)) in files.iter().zip(columns).enumerate() {
        let file = open.file(n, path)?;
        let len = usize::try_from(c.row_bytes)
            .ok()
            .filter(|&l| l as u64 <= MAX_ROW)
            .ok_or_else(|| StorageError::ReadFailed {
                path: path.clone(),
                source: io::Error::new(io::ErrorKind::InvalidData, "row too large"),
            })?;
        let mut value = Vec::with_capacity(c.row_header.len() + len);
        value.extend_from_slice(&c.row_header);
        value.resize(c.row_header.len() + len, 0);
        let at = c
            .data_start
            .checked_add(u64::from(row) * c.row_bytes)
            .ok_or_else(|| StorageError::ReadFailed {
                path: path.clone(),
                source: io::Error::new(io::ErrorKind::InvalidData, "row out of range"),
            })?;
        file.read_exact_at(&mut value[c.row_header.len()..], at)
            .map_err(|e| {
                let source = if e.kind() == io::ErrorKind::UnexpectedEof {
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the array is shorter than its index says (truncated?)",
                    )
                } else {
                    e
                };
                StorageError::ReadFailed {
                    path: path.clone(),
                    source,
                }
            })?;
        values.push(Some(value));
    }
    Ok(values)
}

/// [`read_row`] of arrays that are objects: one ranged GET per array, all at once.
fn read_row_objects(
    objects: &dyn ArrayObjects,
    keys: &[PathBuf],
    columns: &[ArrayColumn],
    row: u32,
) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
    let reads = keys
        .iter()
        .zip(columns)
        .map(|(key, c)| {
            let at = c
                .data_start
                .checked_add(u64::from(row) * c.row_bytes)
                .filter(|_| c.row_bytes <= MAX_ROW)
                .ok_or_else(|| StorageError::ReadFailed {
                    path: key.clone(),
                    source: io::Error::new(io::ErrorKind::InvalidData, "row out of range"),
                })?;
            Ok((key.as_path(), at..at + c.row_bytes))
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    let got = objects.read(&reads)?;
    if let Some((key, _)) = reads
        .iter()
        .zip(&got)
        .find(|((_, r), b)| b.len() as u64 != r.end - r.start)
    {
        return Err(StorageError::ReadFailed {
            path: key.0.to_owned(),
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the array is shorter than its index says (truncated?)",
            ),
        });
    }
    Ok(got
        .into_iter()
        .zip(columns)
        .map(|(bytes, c)| {
            let mut value = Vec::with_capacity(c.row_header.len() + bytes.len());
            value.extend_from_slice(&c.row_header);
            value.extend_from_slice(&bytes);
            Some(value)
        })
        .collect())
}

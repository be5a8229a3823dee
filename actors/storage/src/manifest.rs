//! `manifest`: a CSV or JSON-lines list of `path, label`.
//!
//! The manifest is read as a stream, one line (or JSON array element) at a time, straight
//! into the index's columns: a 1.28 M-line manifest never exists as 1.28 M strings.
//!
//! With declared fields, a `text` or `json` field's value is its cell, kept in the index. An
//! `npy` or `bytes` field's cell names a file, resolved and checked as the image's path is;
//! the index keeps where the file is (never its bytes: a million embeddings would be
//! gigabytes), and the file is read when the element is loaded ([`read_field_file`]). Where
//! is written as the path from the image's canonical folder to the file's canonical path
//! (`../emb/0001.npy` beside `imgs/0001.jpg`), which leaves out what the image's path, already
//! in the index, says: in ImageNet's layout (`…/train/n01440764/n01440764_0.JPEG` beside
//! `…/emb/n01440764/n01440764_0.npy`, 67-byte absolute paths) a field costs 46 bytes an item
//! (its path and end offset) where its absolute path would take 75.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::fields::{FieldKind, Fields};
use super::index::{IndexBuilder, SampleFields};
use super::roots::Roots;
use super::{DatasetIndex, Progress, StorageError, numeric_label};

/// Canonical folders remembered while resolving entries (cleared past this many).
const MAX_CACHED_DIRS: usize = 4096;

/// A label as written in the manifest.
enum RawLabel<'a> {
    Number(i64),
    Name(&'a str),
    /// A name read from a manifest with declared fields.
    Owned(String),
}

#[derive(Deserialize)]
struct JsonEntry {
    path: String,
    label: serde_json::Value,
}

/// Builds a `StorageError::BadManifest` for a line.
type Bad<'a> = &'a dyn Fn(u64, String) -> StorageError;

pub(super) fn index(
    path: &Path,
    format: Option<ManifestFormat>,
    fields: Option<&Fields>,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let manifest = roots.check(path)?;
    let format = Format::of(format, &manifest, path, "the file name")?;
    let base = manifest.parent().unwrap_or(Path::new("/")).to_owned();
    let size = size_hint(&manifest, &base).map_err(|e| StorageError::io(path, e))?;
    let file = File::open(&manifest).map_err(|e| StorageError::io(path, e))?;
    let reader = BufReader::with_capacity(1 << 16, file);
    let mut resolver = Resolver {
        roots,
        base,
        dirs: HashMap::new(),
        last: None,
    };
    parse(
        path,
        format,
        fields,
        reader,
        &mut |file| resolver.resolve(file),
        progress,
        size,
    )
}

/// The index's column sizes a local manifest needs at most: (entries, bytes of their paths).
/// Entries are at most its lines; a path is at most its line with the manifest's folder (as
/// it resolves) before it. One read of the file, which the parse reads again from the page
/// cache: about 1 % of the indexing time, against the copies of columns grown by doubling.
fn size_hint(manifest: &Path, base: &Path) -> std::io::Result<SizeHint> {
    let mut reader = BufReader::with_capacity(1 << 16, File::open(manifest)?);
    let (mut lines, mut bytes) = (1usize, 0usize);
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        lines += buf.iter().filter(|&&b| b == b'\n').count();
        bytes += buf.len();
        let n = buf.len();
        reader.consume(n);
    }
    let folder = std::fs::canonicalize(base)
        .map_or(0, |c| c.as_os_str().len())
        .max(base.as_os_str().len());
    Ok(SizeHint {
        items: lines,
        path_bytes: bytes.saturating_add(lines.saturating_mul(folder + 1)),
    })
}

/// What [`IndexBuilder::files_with_capacity`] is given.
#[derive(Clone, Copy, Debug, Default)]
struct SizeHint {
    items: usize,
    path_bytes: usize,
}

/// Indexes a manifest read from `reader` (named `path`, whose extension gives the format),
/// `resolve` turning each entry's path into what the index records (an object store's key).
pub(super) fn index_reader(
    path: &Path,
    fields: Option<&Fields>,
    reader: impl BufRead,
    resolve: &mut dyn FnMut(&str) -> Result<PathBuf, StorageError>,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let format = Format::of(None, path, path, "the object's name")?;
    // An entry's path here is an object's key, which no load reads as a file.
    if let Some((name, kind)) = fields.and_then(|f| f.unsupported(TEXT_KINDS)) {
        return Err(StorageError::BadFields {
            reason: format!(
                "field `{name}`: an `s3` manifest cannot hold `{}` fields (files)",
                kind.name()
            ),
        });
    }
    parse(
        path,
        format,
        fields,
        reader,
        resolve,
        progress,
        SizeHint::default(),
    )
}

/// The kinds whose values are a manifest's cells; the others' cells name files.
pub(super) const TEXT_KINDS: &[FieldKind] = &[FieldKind::Text, FieldKind::Json];

/// True if a field of `kind` in a manifest names a file that holds its value.
fn names_a_file(kind: FieldKind) -> bool {
    matches!(kind, FieldKind::Npy | FieldKind::Bytes)
}

/// A manifest's format: the source's `format`, else the extension of its name.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ManifestFormat {
    /// `.csv`: comma-separated values, RFC 4180 (quoted fields may hold commas, quotes and
    /// line breaks).
    Csv,
    /// `.tsv`: tab-separated values, quoted as CSV is.
    Tsv,
    /// `.jsonl` or `.json`: JSON lines, or one JSON array.
    Jsonl,
}

type Format = ManifestFormat;

impl ManifestFormat {
    /// `given`, else the format of a manifest named `name` (`.csv`, `.tsv`, `.jsonl` or
    /// `.json`, any case); else a `BadManifest` error for `shown` that says `noun` ("the file
    /// name") must end in one.
    fn of(
        given: Option<Self>,
        name: &Path,
        shown: &Path,
        noun: &str,
    ) -> Result<Self, StorageError> {
        if let Some(f) = given {
            return Ok(f);
        }
        let ext = name
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("csv") => Ok(Format::Csv),
            Some("tsv") => Ok(Format::Tsv),
            Some("jsonl" | "json") => Ok(Format::Jsonl),
            _ => Err(StorageError::BadManifest {
                path: shown.to_owned(),
                line: 0,
                reason: format!(
                    "unknown manifest format: {noun} must end in .csv, .tsv, .jsonl or .json \
                     (or give the source's `format`)"
                ),
            }),
        }
    }
}

fn parse(
    path: &Path,
    format: Format,
    fields: Option<&Fields>,
    mut reader: impl BufRead,
    resolve: &mut dyn FnMut(&str) -> Result<PathBuf, StorageError>,
    progress: &mut Progress<'_>,
    size: SizeHint,
) -> Result<DatasetIndex, StorageError> {
    let bad = |line: u64, reason: String| StorageError::BadManifest {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut items = IndexBuilder::files_with_capacity(size.items, size.path_bytes);
    items.sample = fields.map(|f| SampleFields::new(f, false));
    let mut entries = Entries {
        items,
        kinds: (false, false),
        columns: fields.map(Columns::of),
        resolve,
        progress,
    };
    match format {
        Format::Csv | Format::Tsv => {
            let delimiter = if format == Format::Tsv { b'\t' } else { b',' };
            let records = Records::new(&mut reader, delimiter);
            if entries.columns.is_some() {
                parse_csv_columns(records, &bad, &mut entries)?;
            } else {
                parse_csv(records, &bad, &mut entries)?;
            }
        }
        Format::Jsonl => {
            let starts_array = loop {
                let buf = reader.fill_buf().map_err(|e| StorageError::io(path, e))?;
                match buf.iter().position(|b| !b.is_ascii_whitespace()) {
                    Some(i) => break buf[i] == b'[',
                    None if buf.is_empty() => break false,
                    None => {
                        let n = buf.len();
                        reader.consume(n);
                    }
                }
            };
            match (starts_array, entries.columns.is_some()) {
                (true, false) => parse_json_array::<JsonEntry>(reader, &bad, &mut entries)?,
                (true, true) => parse_json_array::<JsonObject>(reader, &bad, &mut entries)?,
                (false, _) => parse_json_lines(&mut reader, &bad, &mut entries)?,
            }
        }
    }
    entries.finish(&|| format!("manifest {}", path.display()))
}

/// What the parsers feed: the index being built and the labels met so far.
struct Entries<'a, 'p> {
    items: IndexBuilder,
    /// (numbers, names) met in a JSON manifest.
    kinds: (bool, bool),
    /// The columns or keys of a declaration of fields.
    columns: Option<Columns>,
    /// An entry's path to what the index records.
    resolve: &'a mut dyn FnMut(&str) -> Result<PathBuf, StorageError>,
    progress: &'a mut Progress<'p>,
}

/// Where a declaration of fields takes a manifest entry's values from: columns (CSV) or keys
/// (JSON).
struct Columns {
    image: String,
    class: Option<String>,
    /// The small fields in name order: (name, kind, column, optional).
    small: Vec<(String, FieldKind, String, bool)>,
}

impl Columns {
    fn of(fields: &Fields) -> Self {
        let from = |name: &str, from: Option<&str>| from.unwrap_or(name).trim().to_owned();
        Columns {
            image: from("path", fields.from_of(FieldKind::Image).flatten()),
            class: fields.from_of(FieldKind::Class).map(|f| from("label", f)),
            small: fields
                .small()
                .map(|(name, f)| {
                    let column = from(name, f.from.as_deref());
                    (name.to_owned(), f.kind, column, f.optional)
                })
                .collect(),
        }
    }
}

/// A JSON entry read whole (with declared fields).
type JsonObject = serde_json::Map<String, serde_json::Value>;

impl Entries<'_, '_> {
    fn add(&mut self, file: &str, label: RawLabel<'_>) -> Result<(), StorageError> {
        let canonical = (self.resolve)(file)?;
        self.push(&canonical, file, label)
    }

    /// Adds the entry of `canonical` (what `resolve` gave for `file`).
    fn push(
        &mut self,
        canonical: &Path,
        file: &str,
        label: RawLabel<'_>,
    ) -> Result<(), StorageError> {
        let label = match label {
            RawLabel::Number(n) => numeric_label(n, &|| format!("manifest entry {file}"))?,
            RawLabel::Owned(ref name) => self.name_id(name),
            RawLabel::Name(name) => self.name_id(name),
        };
        self.items.push_file(canonical, label);
        self.progress.tick()
    }

    /// The provisional number of a label text.
    fn name_id(&mut self, name: &str) -> u32 {
        self.items.texts.id(name)
    }

    /// Turns the provisional labels into the final ones. CSV labels are numbers if every
    /// label is an integer, class names otherwise; JSON labels are what they were written as.
    fn finish(mut self, what: &dyn Fn() -> String) -> Result<DatasetIndex, StorageError> {
        let classes = self.items.text_classes(!self.kinds.1, what)?;
        Ok(self.items.finish(classes, Vec::new()))
    }
}

/// Canonicalizes entries against the roots, remembering canonical folders: the entry of a
/// file that is no symlink is its folder's canonical path joined with its name, one `lstat`
/// instead of resolving every component of every entry. Entries of one folder usually come
/// together (ImageNet's manifests list a class's files in a row): for those the folder is
/// recognized by comparing bytes with the last one (no hash of its path), whether it lies
/// under the roots was decided once, and the `lstat` is made relative to an open descriptor
/// of the folder (the kernel walks one component, not the whole path: the walks were a
/// quarter of the indexing time of a 1.28 M-entry manifest).
struct Resolver<'a> {
    roots: &'a Roots,
    base: PathBuf,
    /// Folders met, by their path as written: their canonical path, and whether it lies
    /// under the roots.
    dirs: HashMap<PathBuf, (PathBuf, bool)>,
    /// The folder of the last entry, and a descriptor of it once a second entry of it came.
    last: Option<(PathBuf, PathBuf, bool, Option<std::fs::File>)>,
}

impl Resolver<'_> {
    fn resolve(&mut self, file: &str) -> Result<PathBuf, StorageError> {
        let file = Path::new(file);
        let full = if file.is_absolute() {
            file.to_owned()
        } else {
            self.base.join(file)
        };
        if let Some(found) = self.through_folder(&full) {
            return Ok(found);
        }
        self.roots.check(&full)
    }

    /// The canonical path of `full` through its folder's, when its last component is a
    /// plain name of something that is not a symlink, and it lies under the roots; `None`
    /// leaves the case (and its error) to the full check.
    fn through_folder(&mut self, full: &Path) -> Option<PathBuf> {
        let name = full.file_name()?;
        let dir = full.parent()?;
        // "x/." or "x/" would name "x" too, but mean "x as a folder".
        let raw = full.as_os_str().as_bytes();
        if !raw.ends_with(name.as_bytes()) || dir.as_os_str().is_empty() {
            return None;
        }
        let same = self
            .last
            .as_ref()
            .is_some_and(|(d, ..)| d.as_os_str().as_bytes() == dir.as_os_str().as_bytes());
        if !same {
            let (canonical, inside) = self.folder(dir)?;
            self.last = Some((dir.to_owned(), canonical, inside, None));
        }
        let (_, canonical, inside, fd) = self.last.as_mut()?;
        // A plain name in a folder under the roots lies under the roots.
        if !*inside {
            return None;
        }
        let is_link = if same {
            if fd.is_none() {
                *fd = Some(std::fs::File::open(&*canonical).ok()?);
            }
            let st = rustix::fs::statat(fd.as_ref()?, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .ok()?;
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
        } else {
            std::fs::symlink_metadata(canonical.join(name))
                .ok()?
                .file_type()
                .is_symlink()
        };
        (!is_link).then(|| canonical.join(name))
    }

    /// The canonical path of the folder `dir` and whether it lies under the roots (kept for
    /// the next entries of it).
    fn folder(&mut self, dir: &Path) -> Option<(PathBuf, bool)> {
        if let Some(known) = self.dirs.get(dir) {
            return Some(known.clone());
        }
        let canonical = std::fs::canonicalize(dir).ok()?;
        let inside = self.roots.contains(&canonical);
        if self.dirs.len() >= MAX_CACHED_DIRS {
            self.dirs.clear();
        }
        self.dirs
            .insert(dir.to_owned(), (canonical.clone(), inside));
        Some((canonical, inside))
    }
}

/// The records of a CSV or TSV manifest (the `csv` crate: RFC 4180 quotes, a quoted field may
/// hold the delimiter, `""` and line breaks), each with the line it starts on; records whose
/// fields are all blank are skipped.
struct Records<'r, R: BufRead> {
    reader: csv::Reader<&'r mut R>,
    record: csv::StringRecord,
}

impl<'r, R: BufRead> Records<'r, R> {
    fn new(reader: &'r mut R, delimiter: u8) -> Self {
        Records {
            reader: csv::ReaderBuilder::new()
                .has_headers(false)
                .flexible(true)
                .delimiter(delimiter)
                .from_reader(reader),
            record: csv::StringRecord::new(),
        }
    }

    /// Calls `f` with each record's line and fields.
    fn for_each(
        mut self,
        bad: Bad<'_>,
        mut f: impl FnMut(u64, &csv::StringRecord) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        loop {
            match self.reader.read_record(&mut self.record) {
                Ok(false) => return Ok(()),
                Ok(true) => {}
                Err(e) => {
                    let line = e.position().map_or(0, csv::Position::line);
                    let reason = match e.kind() {
                        csv::ErrorKind::Utf8 { .. } => "the line is not utf-8".to_owned(),
                        _ => format!("cannot read: {e}").to_lowercase(),
                    };
                    return Err(bad(line, reason));
                }
            }
            if self.record.iter().all(|c| c.trim().is_empty()) {
                continue;
            }
            let line = self.record.position().map_or(0, csv::Position::line);
            f(line, &self.record)?;
        }
    }
}

/// CSV: `path,label` per record, an optional `path,label` header, blank lines ignored.
fn parse_csv<R: BufRead>(
    records: Records<'_, R>,
    bad: Bad<'_>,
    out: &mut Entries<'_, '_>,
) -> Result<(), StorageError> {
    let mut first = true;
    records.for_each(bad, |n, record| {
        let [path, label] = [0, 1].map(|i| record.get(i).unwrap_or_default().trim());
        if record.len() != 2 {
            return Err(bad(
                n,
                format!("expected 2 fields (path,label), found {}", record.len()),
            ));
        }
        if std::mem::take(&mut first)
            && path.eq_ignore_ascii_case("path")
            && label.eq_ignore_ascii_case("label")
        {
            return Ok(());
        }
        if path.is_empty() || label.is_empty() {
            return Err(bad(n, "empty path or label".into()));
        }
        out.add(path, RawLabel::Name(label))
    })
}

/// Calls `f` with each line (numbered from 1, without its line break) of `reader`.
fn for_each_line(
    reader: &mut impl BufRead,
    bad: Bad<'_>,
    mut f: impl FnMut(u64, &str) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    let mut buf = Vec::new();
    let mut n = 0u64;
    loop {
        buf.clear();
        n += 1;
        let read = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| bad(n, format!("cannot read: {e}").to_lowercase()))?;
        if read == 0 {
            return Ok(());
        }
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = std::str::from_utf8(line).map_err(|_| bad(n, "the line is not utf-8".into()))?;
        f(n, line)?;
    }
}

/// JSON lines: `{"path": "...", "label": 3}` per line, blank lines ignored.
fn parse_json_lines(
    reader: &mut impl BufRead,
    bad: Bad<'_>,
    out: &mut Entries<'_, '_>,
) -> Result<(), StorageError> {
    for_each_line(reader, bad, |n, line| {
        if line.trim().is_empty() {
            return Ok(());
        }
        if out.columns.is_some() {
            let e = serde_json::from_str(line).map_err(|e| bad(n, json_reason(&e)))?;
            return json_object(n, e, bad, out);
        }
        let e = serde_json::from_str(line).map_err(|e| bad(n, json_reason(&e)))?;
        json_entry(n, e, bad, out)
    })
}

/// An entry of a manifest with declared fields: its path, label and values by column.
fn columns_entry(
    n: u64,
    out: &mut Entries<'_, '_>,
    get: &dyn Fn(&str) -> Option<Result<String, String>>,
    label_of: &dyn Fn(&str) -> Option<RawLabel<'static>>,
    json: bool,
    bad: Bad<'_>,
) -> Result<(), StorageError> {
    let columns = out.columns.as_ref().expect("a manifest with fields");
    let missing = |field: &str| StorageError::MissingField {
        key: format!("line {n}"),
        field: field.to_owned(),
    };
    let path = match get(&columns.image) {
        Some(Ok(p)) if !p.trim().is_empty() => p,
        Some(Err(reason)) => return Err(bad(n, reason)),
        _ => return Err(missing(&columns.image)),
    };
    let mut values: Vec<Option<String>> = Vec::with_capacity(columns.small.len());
    for (name, kind, column, optional) in &columns.small {
        match get(column) {
            // An optional field's empty or missing value is absent from the sample.
            Some(Ok(v)) if *optional && v.trim().is_empty() => values.push(None),
            None if *optional => values.push(None),
            Some(Ok(v)) if names_a_file(*kind) && v.trim().is_empty() => {
                return Err(missing(name));
            }
            Some(Ok(v)) => values.push(Some(v)),
            Some(Err(reason)) => return Err(bad(n, format!("field `{name}`: {reason}"))),
            None => return Err(missing(name)),
        }
    }
    let label = match &columns.class {
        None if json => RawLabel::Number(0),
        None => RawLabel::Owned("0".into()),
        Some(c) => label_of(c).ok_or_else(|| missing(c))?,
    };
    // JSON labels are numbers or names, as written; CSV labels are texts that may all be
    // numbers (see `Entries::finish`).
    match (&label, json) {
        (RawLabel::Number(_), true) => out.kinds.0 = true,
        (_, true) => out.kinds.1 = true,
        (_, false) => {}
    }
    if out.kinds.0 && out.kinds.1 {
        return Err(bad(n, "the manifest mixes numeric and text labels".into()));
    }
    let path = path.trim();
    let image = (out.resolve)(path)?;
    let folder = image.parent().unwrap_or(Path::new("/"));
    let mut stored = Vec::with_capacity(values.len());
    for (v, (name, kind, _, _)) in values.iter().zip(&columns.small) {
        let Some(v) = v else {
            stored.push(None);
            continue;
        };
        if !names_a_file(*kind) {
            stored.push(Some(v.as_bytes().to_vec()));
            continue;
        }
        // Resolved and checked as the image's path is; a missing file names its entry.
        let file = (out.resolve)(v.trim()).map_err(|e| match e {
            StorageError::NotFound { .. } | StorageError::Io { .. } => {
                bad(n, format!("field `{name}`: {e}"))
            }
            e => e,
        })?;
        stored.push(Some(
            relative_path(folder, &file).into_os_string().into_vec(),
        ));
    }
    if let Some(sample) = out.items.sample.as_mut() {
        for v in &stored {
            sample.push_value(v.as_deref());
        }
    }
    out.push(&image, path, label)
}

/// The path from the canonical folder `from` to the canonical path `to`: `..` for each of
/// `from`'s components past what they share, then the rest of `to`. Both being canonical
/// (no symlink, no `.` or `..`), [`field_path`] finds `to` again without the file system.
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let (mut a, mut b) = (from.components().peekable(), to.components().peekable());
    while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
        if x != y {
            break;
        }
        a.next();
        b.next();
    }
    let mut out: PathBuf = a.map(|_| Component::ParentDir).collect();
    out.extend(b);
    out
}

/// Where an `npy` or `bytes` field's file is, from its image's canonical path and the
/// relative path the index holds (see [`relative_path`]).
fn field_path(image: &Path, relative: &[u8]) -> PathBuf {
    let mut out = image.parent().unwrap_or(Path::new("/")).to_owned();
    for c in Path::new(std::ffi::OsStr::from_bytes(relative)).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Reads the file of an `npy` or `bytes` field of the entry whose image is `image` (its
/// canonical path), `relative` as the index holds it: a file gone or unreadable since the
/// indexing is the element's error.
pub(super) fn read_field_file(image: &Path, relative: &[u8]) -> Result<Vec<u8>, StorageError> {
    let path = field_path(image, relative);
    std::fs::read(&path).map_err(|e| StorageError::read(&path, e))
}

/// One JSON object of a manifest with declared fields: `text` fields are strings, `json`
/// fields any value (stored as its JSON text).
fn json_object(
    n: u64,
    e: JsonObject,
    bad: Bad<'_>,
    out: &mut Entries<'_, '_>,
) -> Result<(), StorageError> {
    let kinds: HashMap<String, FieldKind> = out
        .columns
        .as_ref()
        .map(|c| {
            c.small
                .iter()
                .map(|(_, k, col, _)| (col.clone(), *k))
                .collect()
        })
        .unwrap_or_default();
    let image = out.columns.as_ref().map(|c| c.image.clone());
    let get = |key: &str| -> Option<Result<String, String>> {
        // A null value is a missing one.
        let v = e.get(key).filter(|v| !v.is_null())?;
        let is_path = image.as_deref() == Some(key);
        Some(match (kinds.get(key), v) {
            (Some(FieldKind::Json), v) if !is_path => Ok(v.to_string()),
            (_, serde_json::Value::String(s)) => Ok(s.clone()),
            (_, other) => Err(format!("`{key}` is {other}, not a string")),
        })
    };
    let label_of = |key: &str| -> Option<RawLabel<'static>> {
        match e.get(key)? {
            serde_json::Value::Number(v) => v.as_i64().map(RawLabel::Number),
            serde_json::Value::String(s) if !s.trim().is_empty() => {
                Some(RawLabel::Owned(s.trim().to_owned()))
            }
            _ => None,
        }
    };
    columns_entry(n, out, &get, &label_of, true, bad)
}

/// CSV with declared fields: a header record naming the columns, then one entry per record.
fn parse_csv_columns<R: BufRead>(
    records: Records<'_, R>,
    bad: Bad<'_>,
    out: &mut Entries<'_, '_>,
) -> Result<(), StorageError> {
    let mut header: Option<HashMap<String, usize>> = None;
    records.for_each(bad, |n, cells| {
        let Some(columns) = &header else {
            header = Some(
                cells
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.trim().to_owned(), i))
                    .collect(),
            );
            return Ok(());
        };
        if cells.len() != columns.len() {
            return Err(bad(
                n,
                format!(
                    "expected {} fields (as the header), found {}",
                    columns.len(),
                    cells.len()
                ),
            ));
        }
        let get = |c: &str| columns.get(c).map(|&i| Ok(cells[i].to_owned()));
        let label_of = |c: &str| {
            let v = cells[*columns.get(c)?].trim();
            (!v.is_empty()).then(|| RawLabel::Owned(v.to_owned()))
        };
        columns_entry(n, out, &get, &label_of, false, bad)
    })
}

/// A JSON manifest entry, as its parser adds it.
trait JsonItem: serde::de::DeserializeOwned {
    fn add(n: u64, e: Self, bad: Bad<'_>, out: &mut Entries<'_, '_>) -> Result<(), StorageError>;
}

impl JsonItem for JsonEntry {
    fn add(n: u64, e: Self, bad: Bad<'_>, out: &mut Entries<'_, '_>) -> Result<(), StorageError> {
        json_entry(n, e, bad, out)
    }
}

impl JsonItem for JsonObject {
    fn add(n: u64, e: Self, bad: Bad<'_>, out: &mut Entries<'_, '_>) -> Result<(), StorageError> {
        json_object(n, e, bad, out)
    }
}

/// One JSON array of `{"path", "label"}` objects, read element by element (an element's
/// number stands for its line).
fn parse_json_array<T: JsonItem>(
    reader: impl Read,
    bad: Bad<'_>,
    out: &mut Entries<'_, '_>,
) -> Result<(), StorageError> {
    let mut failed = None;
    let mut de = serde_json::Deserializer::from_reader(reader);
    let seed = EachEntry::<T> {
        on: &mut |n, e| T::add(n, e, bad, out),
        failed: &mut failed,
    };
    let parsed = seed.deserialize(&mut de).and_then(|()| de.end());
    match (failed, parsed) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(bad(e.line() as u64, json_reason(&e))),
        (None, Ok(())) => Ok(()),
    }
}

/// Visits the elements of a JSON array one at a time.
struct EachEntry<'a, T> {
    on: &'a mut dyn FnMut(u64, T) -> Result<(), StorageError>,
    failed: &'a mut Option<StorageError>,
}

impl<'de, T: JsonItem> DeserializeSeed<'de> for EachEntry<'_, T> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: JsonItem> Visitor<'de> for EachEntry<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of {\"path\", \"label\"} objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut n = 0;
        while let Some(e) = seq.next_element::<T>()? {
            n += 1;
            if let Err(err) = (self.on)(n, e) {
                *self.failed = Some(err);
                return Err(serde::de::Error::custom("entry refused"));
            }
        }
        Ok(())
    }
}

/// One JSON entry: labels are integers or strings (class names), not both in one manifest.
fn json_entry(
    n: u64,
    e: JsonEntry,
    bad: Bad<'_>,
    out: &mut Entries<'_, '_>,
) -> Result<(), StorageError> {
    if e.path.is_empty() {
        return Err(bad(n, "empty path".into()));
    }
    let label = match &e.label {
        serde_json::Value::Number(v) => {
            out.kinds.0 = true;
            RawLabel::Number(
                v.as_i64()
                    .ok_or_else(|| bad(n, format!("label {v} is not an integer")))?,
            )
        }
        serde_json::Value::String(s) if !s.trim().is_empty() => {
            out.kinds.1 = true;
            RawLabel::Name(s.trim())
        }
        other => {
            return Err(bad(
                n,
                format!("label {other} is neither an integer nor a name"),
            ));
        }
    };
    if out.kinds.0 && out.kinds.1 {
        return Err(bad(n, "the manifest mixes numeric and text labels".into()));
    }
    out.add(&e.path, label)
}

fn json_reason(e: &serde_json::Error) -> String {
    // serde_json appends " at line L column C"; the line is reported separately.
    let s = e.to_string();
    let s = s.split(" at line ").next().unwrap_or(&s);
    format!("invalid json: {s}").to_lowercase()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use super::{Format, field_path, relative_path};
    use crate::fields::npy_f32;
    use crate::{DatasetIndex, SourceSpec, StorageError};

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    /// A manifest source of `path` with an image, a class, an `npy` field `emb` of shape
    /// `[2]` and a `bytes` field `raw`.
    fn spec(path: &Path) -> SourceSpec {
        serde_json::from_value(serde_json::json!({
            "kind": "manifest", "path": path, "fields": {
                "image": {"kind": "image", "from": "path"},
                "label": {"kind": "class"},
                "emb": {"kind": "npy", "shape": [2]},
                "raw": {"kind": "bytes", "from": "blob"},
            }
        }))
        .unwrap()
    }

    fn index(spec: &SourceSpec, roots: &[PathBuf]) -> Result<DatasetIndex, StorageError> {
        crate::index(spec, roots, &mut |_| {})
    }

    /// A dataset folder: `m/imgs/{a,b}.jpg`, `m/emb/{a,b}.npy`, `m/raw/{a,b}.bin`, and a file
    /// outside it, `other/x.npy`.
    fn dataset(tmp: &Path) -> PathBuf {
        let m = tmp.join("m");
        for (k, name) in ["a", "b"].iter().enumerate() {
            write(
                &m.join(format!("imgs/{name}.jpg")),
                format!("jpeg {name}").as_bytes(),
            );
            write(
                &m.join(format!("emb/{name}.npy")),
                &npy_f32(&[k as f32, 0.5]),
            );
            write(&m.join(format!("raw/{name}.bin")), &[k as u8, 0xff, 0]);
        }
        write(&tmp.join("other/x.npy"), &npy_f32(&[7.0, 8.0]));
        m
    }

    /// Items 0 and 1 of `ix` hold a's and b's files.
    fn check_items(ix: &DatasetIndex) {
        assert_eq!(ix.len(), 2);
        for (id, name) in [(0u32, "a"), (1, "b")] {
            let s = ix.split(id, ix.read(id).unwrap()).unwrap();
            assert_eq!(s.image, format!("jpeg {name}").into_bytes());
            let got: Vec<(&str, &[u8])> = s
                .fields
                .iter()
                .map(|f| (f.name.as_str(), f.value.as_slice()))
                .collect();
            let (emb, raw) = (npy_f32(&[id as f32, 0.5]), [id as u8, 0xff, 0]);
            assert_eq!(got, [("emb", emb.as_slice()), ("raw", raw.as_slice())]);
            assert!(s.fields[0].fixed_shape);
        }
    }

    #[test]
    fn npy_and_bytes_cells_name_files_read_at_load() {
        let tmp = tempfile::tempdir().unwrap();
        let m = dataset(tmp.path());
        let roots = [tmp.path().to_owned()];
        let abs = |p: &str| m.join(p).display().to_string();
        // Relative to the manifest's folder or absolute, in CSV and JSON lines.
        let csv = format!(
            "path,label,emb,blob\nimgs/a.jpg,1,emb/a.npy,{}\n{},0,\"{}\",./raw/../raw/b.bin\n",
            abs("raw/a.bin"),
            abs("imgs/b.jpg"),
            abs("emb/b.npy"),
        );
        write(&m.join("m.csv"), csv.as_bytes());
        let jsonl = format!(
            "{{\"path\":\"imgs/a.jpg\",\"label\":1,\"emb\":\"emb/a.npy\",\"blob\":\"{}\"}}\n\
             {{\"path\":\"imgs/b.jpg\",\"label\":0,\"emb\":\"{}\",\"blob\":\"raw/b.bin\"}}\n",
            abs("raw/a.bin"),
            abs("emb/b.npy"),
        );
        write(&m.join("m.jsonl"), jsonl.as_bytes());
        for name in ["m.csv", "m.jsonl"] {
            let ix = index(&spec(&m.join(name)), &roots).unwrap();
            check_items(&ix);
            // The index holds where the files are, not their bytes: the path from the
            // image's folder.
            let sample = ix.sample_fields().unwrap();
            assert_eq!(sample.value(0, 0, 2), Some(&b"../emb/a.npy"[..]), "{name}");
            assert_eq!(sample.value(1, 1, 2), Some(&b"../raw/b.bin"[..]), "{name}");
            check_items(&DatasetIndex::from_bytes(&ix.to_bytes()).unwrap());
        }
        // A file outside the allowed roots, named absolutely or through `..`, is refused.
        let outside = tmp.path().join("other/x.npy").display().to_string();
        for cell in [outside.as_str(), "../other/x.npy"] {
            let csv = format!("path,label,emb,blob\nimgs/a.jpg,1,{cell},raw/a.bin\n");
            write(&m.join("o.csv"), csv.as_bytes());
            let e = index(&spec(&m.join("o.csv")), std::slice::from_ref(&m)).unwrap_err();
            assert_eq!(e.code(), "outside_roots", "{cell}: {e}");
        }
        // Under the roots, the same file is fine.
        let ix = index(&spec(&m.join("o.csv")), &roots).unwrap();
        let s = ix.split(0, ix.read(0).unwrap()).unwrap();
        assert_eq!(s.fields[0].value, npy_f32(&[7.0, 8.0]));
    }

    #[test]
    fn missing_files_and_cells_fail_the_indexing_naming_them() {
        let tmp = tempfile::tempdir().unwrap();
        let m = dataset(tmp.path());
        let roots = [tmp.path().to_owned()];
        let cases = [
            // A file that does not exist: the line and the field.
            (
                "path,label,emb,blob\nimgs/a.jpg,1,emb/a.npy,raw/a.bin\nimgs/b.jpg,0,emb/zz.npy,raw/b.bin\n",
                "m.csv",
                "bad_manifest",
                ["line 3", "`emb`", "emb/zz.npy"],
            ),
            (
                "{\"path\":\"imgs/a.jpg\",\"label\":1,\"emb\":\"emb/a.npy\",\"blob\":\"raw/nope.bin\"}\n",
                "m.jsonl",
                "bad_manifest",
                ["line 1", "`raw`", "raw/nope.bin"],
            ),
            // An empty cell is a missing field.
            (
                "path,label,emb,blob\nimgs/a.jpg,1, ,raw/a.bin\n",
                "e.csv",
                "missing_field",
                ["line 2", "`emb`", ""],
            ),
            (
                "{\"path\":\"imgs/a.jpg\",\"label\":1,\"emb\":\"emb/a.npy\",\"blob\":\"\"}\n",
                "e.jsonl",
                "missing_field",
                ["line 1", "`raw`", ""],
            ),
            // So is a missing column; a JSON value that is no path is refused.
            (
                "path,label,emb\nimgs/a.jpg,1,emb/a.npy\n",
                "c.csv",
                "missing_field",
                ["line 2", "`raw`", ""],
            ),
            (
                "{\"path\":\"imgs/a.jpg\",\"label\":1,\"emb\":[1,2],\"blob\":\"raw/a.bin\"}\n",
                "n.jsonl",
                "bad_manifest",
                ["line 1", "`emb`", "not a string"],
            ),
        ];
        for (text, name, code, words) in cases {
            write(&m.join(name), text.as_bytes());
            let e = index(&spec(&m.join(name)), &roots).unwrap_err();
            assert_eq!(e.code(), code, "{name}: {e}");
            for w in words {
                assert!(e.to_string().contains(w), "{name}: {e} lacks {w}");
            }
        }
    }

    #[test]
    fn a_file_gone_or_malformed_at_load_is_the_elements_error() {
        let tmp = tempfile::tempdir().unwrap();
        let m = dataset(tmp.path());
        let roots = [tmp.path().to_owned()];
        write(
            &m.join("m.csv"),
            b"path,label,emb,blob\nimgs/a.jpg,1,emb/a.npy,raw/a.bin\nimgs/b.jpg,0,emb/b.npy,raw/b.bin\n",
        );
        let ix = index(&spec(&m.join("m.csv")), &roots).unwrap();
        // Removed after indexing: `not_found`, naming the file; the other element reads.
        fs::remove_file(m.join("raw/a.bin")).unwrap();
        let e = ix.split(0, ix.read(0).unwrap()).unwrap_err();
        assert_eq!(e.code(), "not_found", "{e}");
        assert!(e.to_string().contains("raw/a.bin"), "{e}");
        assert!(ix.split(1, ix.read(1).unwrap()).is_ok());
        // Replaced by a folder: unreadable.
        fs::create_dir(m.join("raw/a.bin")).unwrap();
        let e = ix.split(0, ix.read(0).unwrap()).unwrap_err();
        assert_eq!(e.code(), "read_failed", "{e}");
        // Rewritten with another shape than declared: checked as every `npy` value.
        fs::write(m.join("emb/b.npy"), npy_f32(&[1.0, 2.0, 3.0])).unwrap();
        let e = ix.split(1, ix.read(1).unwrap()).unwrap_err();
        assert_eq!(e.code(), "bad_field", "{e}");
        assert!(e.to_string().contains("`emb`"), "{e}");
    }

    #[test]
    fn an_s3_manifest_holds_no_files() {
        let fields: crate::fields::Fields = serde_json::from_value(serde_json::json!({
            "image": {"kind": "image"}, "emb": {"kind": "npy"}
        }))
        .unwrap();
        let e = super::index_reader(
            Path::new("s3://bkt/m.csv"),
            Some(&fields),
            &b"path,emb\na.jpg,a.npy\n"[..],
            &mut |k| Ok(PathBuf::from(k)),
            &mut crate::Progress {
                count: 0,
                report: &mut |_| {},
            },
        )
        .unwrap_err();
        assert_eq!(e.code(), "bad_fields");
        assert!(e.to_string().contains("`emb`"), "{e}");
    }

    #[test]
    fn field_paths_are_relative_to_the_image_folder() {
        for (image, file, rel) in [
            ("/d/imgs/a.jpg", "/d/emb/a.npy", "../emb/a.npy"),
            ("/d/imgs/a.jpg", "/d/imgs/a.npy", "a.npy"),
            ("/d/a.jpg", "/d/x/y/a.npy", "x/y/a.npy"),
            ("/d/x/y/a.jpg", "/e/a.npy", "../../../e/a.npy"),
            ("/a.jpg", "/a.npy", "a.npy"),
        ] {
            let (image, file) = (Path::new(image), Path::new(file));
            let r = relative_path(image.parent().unwrap(), file);
            assert_eq!(r, Path::new(rel));
            assert_eq!(field_path(image, r.as_os_str().as_encoded_bytes()), file);
        }
    }

    #[test]
    fn the_extension_gives_the_format() {
        let of =
            |name: &str| Format::of(None, Path::new(name), Path::new("shown"), "the file name");
        assert!(matches!(of("/d/m.CSV"), Ok(Format::Csv)));
        assert!(matches!(of("/d/m.tsv"), Ok(Format::Tsv)));
        assert!(matches!(of("m.jsonl"), Ok(Format::Jsonl)));
        assert!(matches!(of("m.Json"), Ok(Format::Jsonl)));
        for name in ["m.txt", "m", "csv"] {
            assert_eq!(
                of(name).unwrap_err().to_string(),
                "bad manifest shown line 0: unknown manifest format: the file name must end in \
                 .csv, .tsv, .jsonl or .json (or give the source's `format`)"
            );
        }
        // The source's `format` wins over the name.
        let given = Format::of(Some(Format::Tsv), Path::new("m.txt"), Path::new("s"), "n");
        assert!(matches!(given, Ok(Format::Tsv)));
    }

    /// The entries (path, label) of manifest text `text` named `name`.
    fn entries(name: &str, text: &str) -> Result<Vec<(String, Option<i64>)>, StorageError> {
        let ix = super::index_reader(
            Path::new(name),
            None,
            text.as_bytes(),
            &mut |k| Ok(PathBuf::from(k)),
            &mut crate::Progress {
                count: 0,
                report: &mut |_| {},
            },
        )?;
        Ok((0..ix.len() as u32)
            .map(|id| match ix.location(id) {
                Some(crate::Location::File(p)) => (p.display().to_string(), ix.label(id)),
                _ => panic!("not a file item"),
            })
            .collect())
    }

    #[test]
    fn csv_and_tsv_quote_as_rfc_4180() {
        let csv = "path,label\n\"a, \"\"b\"\".jpg\",3\n\"multi\nline.jpg\",4\n\n  \nc.jpg , 5\r\n";
        let got = entries("m.csv", csv).unwrap();
        let want = [("a, \"b\".jpg", 3), ("multi\nline.jpg", 4), ("c.jpg", 5)];
        let want: Vec<_> = want
            .iter()
            .map(|(p, l)| ((*p).to_owned(), Some(*l)))
            .collect();
        assert_eq!(got, want);
        let tsv = "path\tlabel\na b.jpg\t1\n\"q\tx.jpg\"\t2\n";
        let got = entries("m.tsv", tsv).unwrap();
        assert_eq!(
            got,
            [
                ("a b.jpg".to_owned(), Some(1)),
                ("q\tx.jpg".to_owned(), Some(2))
            ]
        );
        // A byte-order mark before the header (as spreadsheets write CSV) is no part of it.
        let got = entries("m.csv", "\u{feff}path,label\na.jpg,1\n").unwrap();
        assert_eq!(got, [("a.jpg".to_owned(), Some(1))]);
        // An entry's line, after a field that spans two lines.
        let e = entries("m.csv", "\"x\ny.jpg\",1\nz.jpg\n").unwrap_err();
        assert_eq!(e.code(), "bad_manifest");
        assert!(
            e.to_string()
                .contains("line 3: expected 2 fields (path,label), found 1"),
            "{e}"
        );
    }
}

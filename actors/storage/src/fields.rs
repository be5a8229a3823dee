//! The fields of a sample, as a source declares them, the same for every source kind:
//! `"fields": {"image": {"kind": "image", "from": "jpg;jpeg;png;webp"}, "caption": {"kind":
//! "text", "from": "txt"}, "label": {"kind": "class", "from": "cls"}}`, where `from` names
//! member extensions (`tar_shards`, `;`-separated), a column (`manifest` CSV, `parquet`) or a
//! key (`manifest` JSON lines).
//!
//! A sample is at most one `image` field, at most one `class` field (its integer label;
//! without one every label is 0), and any number of small fields (`text`, `json`, `npy`,
//! `bytes`) that travel with the decoded image in its slot (`dataplane/DESIGN.md`,
//! "Fields"). A declaration without an `image` field makes samples of small fields only
//! (text-only shards, Parquet without an image column, the rows of an `array` source): their
//! slots hold no image, only the fields, and no pipeline runs on them. Their values
//! are checked when the element is loaded ([`check_value`]): a value that is not what its
//! kind says is the element's error, never a panic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Each small field's value of one sample, in name order (`None`: absent or null): what every
/// source kind's read of a sample's fields gives.
pub(crate) type FieldValues = Vec<Option<Vec<u8>>>;

/// What a field holds.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FieldKind {
    /// An encoded image, decoded by the shared pipeline.
    Image,
    /// An integer class.
    Class,
    /// UTF-8 text.
    Text,
    /// A JSON document.
    Json,
    /// A NumPy array stored as `.npy` (format 1.0, 2.0 or 3.0).
    Npy,
    /// Bytes passed through.
    Bytes,
}

impl FieldKind {
    pub fn name(self) -> &'static str {
        match self {
            FieldKind::Image => "image",
            FieldKind::Class => "class",
            FieldKind::Text => "text",
            FieldKind::Json => "json",
            FieldKind::Npy => "npy",
            FieldKind::Bytes => "bytes",
        }
    }

    /// True for the kinds stored beside the image (not `image`, not `class`).
    pub fn is_small(self) -> bool {
        !matches!(self, FieldKind::Image | FieldKind::Class)
    }
}

/// One declared field.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    pub kind: FieldKind,
    /// Where the field comes from: member extensions separated by `;` (`tar_shards`), a
    /// column or key (`manifest`, `parquet`). Default: `jpg;jpeg;png;webp` (tar) or `path`
    /// (manifest) for the image, `cls` (tar) or `label` for the class, else the field's
    /// name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// `npy` only: the shape every value has. Values of another shape are element errors,
    /// and clients stack the field's values of a batch into one array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    /// `npy` or `json` only: the field holds detection boxes, which clients carry through
    /// the pipeline's resize and the job's crop and flip as the pixels are ([`Boxes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boxes: Option<Boxes>,
    /// A small field that a sample may lack: a missing member, an empty or missing manifest
    /// value, or a null Parquet cell is then absent from the sample (`None` in a Python
    /// batch), where otherwise it fails the indexing (`missing_field`) or the element
    /// (`bad_field`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// How boxes are written: `xyxy` (left, top, right, bottom) or `xywh` (left, top, width,
/// height: COCO's `bbox`), in pixels of the stored image.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BoxFormat {
    Xyxy,
    Xywh,
}

/// A boxes field's declaration: `"boxes": "xyxy"` (its format alone) or `"boxes": {"format":
/// "xywh", "path": "annotations.bbox", "with": ["labels"]}`.
///
/// - An `npy` field holds an `(N, 4)` array of boxes.
/// - A `json` field holds a document in which `path` (keys separated by `.`; none: the
///   document itself) leads to the boxes, each a list of 4 numbers. A list met on the way is
///   gone through item by item: `annotations.bbox` reads `{"annotations": [{"bbox": [...],
///   "category_id": 3}, ...]}`, and a box dropped by the crop drops its whole item (its
///   category with it). Lists beside the boxes in the same object with as many items (a
///   Hugging Face `objects` struct: `{"bbox": [[...]], "category": [...]}`) lose the same
///   items.
/// - `with`: other small fields whose values list one entry per box (an `npy` array's first
///   axis, a JSON list): a dropped box drops its entry there too.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Boxes {
    pub format: BoxFormat,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
}

impl<'de> Deserialize<'de> for Boxes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            format: BoxFormat,
            #[serde(default)]
            path: Option<String>,
            #[serde(default)]
            with: Vec<String>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Format(BoxFormat),
            Full(Full),
        }
        match Wire::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "`boxes` is a format (\"xyxy\" or \"xywh\") or {\"format\", \"path\", \"with\"}",
            )
        })? {
            Wire::Format(format) => Ok(Boxes {
                format,
                path: None,
                with: Vec::new(),
            }),
            Wire::Full(f) => Ok(Boxes {
                format: f.format,
                path: f.path,
                with: f.with,
            }),
        }
    }
}

/// A sample's declared fields, by name: one `image` field and at most one `class` field
/// (checked when the declaration is read).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(
    try_from = "BTreeMap<String, FieldSpec>",
    into = "BTreeMap<String, FieldSpec>"
)]
pub struct Fields(BTreeMap<String, FieldSpec>);

/// Longest field name (the slot's field directory stores it in one byte).
pub const MAX_NAME_LEN: usize = 255;
/// Most fields a sample declares (the slot's field directory counts them in 16 bits).
pub const MAX_FIELDS: usize = 1024;

impl Fields {
    /// The `from` of the field of `kind`, if one is declared: `Some(None)` when the field is
    /// declared without `from`.
    pub fn from_of(&self, kind: FieldKind) -> Option<Option<&str>> {
        self.0
            .values()
            .find(|f| f.kind == kind)
            .map(|f| f.from.as_deref())
    }

    /// True if the samples have an image (a field of kind `image`): a declaration without
    /// one makes samples of small fields only (text-only shards, array rows).
    pub fn has_image(&self) -> bool {
        self.has(FieldKind::Image)
    }

    /// True if a field of `kind` is declared.
    pub fn has(&self, kind: FieldKind) -> bool {
        self.0.values().any(|f| f.kind == kind)
    }

    /// Every declared field, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &FieldSpec)> {
        self.0.iter().map(|(n, f)| (n.as_str(), f))
    }

    /// The small fields (stored beside the image), in name order: the order of their
    /// values in [`crate::Sample::fields`].
    pub fn small(&self) -> impl Iterator<Item = (&str, &FieldSpec)> {
        self.iter().filter(|(_, f)| f.kind.is_small())
    }

    /// The first small field of a kind outside `supported`, for a source kind that cannot
    /// hold it.
    pub fn unsupported(&self, supported: &[FieldKind]) -> Option<(&str, FieldKind)> {
        self.small()
            .find(|(_, f)| !supported.contains(&f.kind))
            .map(|(n, f)| (n, f.kind))
    }
}

impl TryFrom<BTreeMap<String, FieldSpec>> for Fields {
    type Error = String;

    fn try_from(fields: BTreeMap<String, FieldSpec>) -> Result<Self, String> {
        if fields.len() > MAX_FIELDS {
            return Err(format!(
                "{} fields: declare at most {MAX_FIELDS}",
                fields.len()
            ));
        }
        for (name, f) in &fields {
            if name.is_empty() || name.len() > MAX_NAME_LEN {
                return Err(format!(
                    "field name `{name}`: a name is 1 to {MAX_NAME_LEN} bytes"
                ));
            }
            if f.from.as_deref().is_some_and(|s| s.trim().is_empty()) {
                return Err(format!("field `{name}`: `from` is empty"));
            }
            if f.shape.is_some() && f.kind != FieldKind::Npy {
                return Err(format!(
                    "field `{name}`: `shape` is for fields of kind `npy`, not `{}`",
                    f.kind.name()
                ));
            }
            if let Some(b) = &f.boxes {
                check_boxes(name, f, b, &fields)?;
            }
            if f.optional && !f.kind.is_small() {
                return Err(format!(
                    "field `{name}`: only small fields (text, json, npy, bytes) can be optional, \
                     not `{}`",
                    f.kind.name()
                ));
            }
        }
        for kind in [FieldKind::Image, FieldKind::Class] {
            let n = fields.values().filter(|f| f.kind == kind).count();
            if n > 1 {
                return Err(format!(
                    "{n} fields of kind `{}`: declare one at most",
                    kind.name()
                ));
            }
        }
        if !fields
            .values()
            .any(|f| f.kind == FieldKind::Image || f.kind.is_small())
        {
            return Err(
                "no field of kind `image` and no small field: a sample needs an image or at \
                 least one `text`, `json`, `npy` or `bytes` field"
                    .into(),
            );
        }
        Ok(Fields(fields))
    }
}

/// Checks a boxes declaration against the other fields.
fn check_boxes(
    name: &str,
    f: &FieldSpec,
    b: &Boxes,
    fields: &BTreeMap<String, FieldSpec>,
) -> Result<(), String> {
    if !matches!(f.kind, FieldKind::Npy | FieldKind::Json) {
        return Err(format!(
            "field `{name}`: `boxes` is for fields of kind `npy` or `json`, not `{}`",
            f.kind.name()
        ));
    }
    if b.path.is_some() && f.kind != FieldKind::Json {
        return Err(format!(
            "field `{name}`: a boxes `path` is for `json` fields (an `npy` field is the (N, 4) array)"
        ));
    }
    if b.path
        .as_deref()
        .is_some_and(|p| p.split('.').any(str::is_empty))
    {
        return Err(format!(
            "field `{name}`: the boxes `path` is keys separated by `.`, none empty"
        ));
    }
    let no_shape = |n: &str, spec: &FieldSpec| match spec.shape {
        Some(_) => Err(format!(
            "field `{n}`: boxes dropped by a crop change how many values it has: declare no `shape`"
        )),
        None => Ok(()),
    };
    no_shape(name, f)?;
    for w in &b.with {
        let Some(spec) = fields.get(w) else {
            return Err(format!(
                "field `{name}`: `with` names `{w}`, which is not declared"
            ));
        };
        if w == name
            || spec.boxes.is_some()
            || !matches!(spec.kind, FieldKind::Npy | FieldKind::Json)
        {
            return Err(format!(
                "field `{name}`: `with` names `{w}`: it must be another `npy` or `json` field, not one of boxes"
            ));
        }
        no_shape(w, spec)?;
    }
    Ok(())
}

/// The boxes a JSON document holds at `path` (see [`Boxes`]): a list of boxes at its end, or
/// one box per item when a list was gone through on the way; a box is a list of 4 numbers.
fn check_json_boxes(doc: &serde_json::Value, path: &[&str], one: bool) -> Result<(), String> {
    use serde_json::Value;
    let is_box = |b: &Value| match b {
        Value::Array(c) if c.len() == 4 && c.iter().all(Value::is_number) => Ok(()),
        other => Err(format!("a box is 4 numbers, not {other}")),
    };
    match (doc, path.split_first()) {
        (Value::Array(items), Some(_)) => items
            .iter()
            .try_for_each(|v| check_json_boxes(v, path, true)),
        (Value::Object(o), Some((key, rest))) => match o.get(*key) {
            Some(v) => check_json_boxes(v, rest, one),
            None => Err(format!("no key `{key}` on the boxes' path")),
        },
        (other, Some((key, _))) => Err(format!("key `{key}` of the boxes' path in {other}")),
        (b, None) if one => is_box(b),
        (Value::Array(boxes), None) => boxes.iter().try_for_each(is_box),
        (other, None) => Err(format!("boxes are a list of boxes, not {other}")),
    }
}

impl From<Fields> for BTreeMap<String, FieldSpec> {
    fn from(f: Fields) -> Self {
        f.0
    }
}

/// Checks that `value` is what a field of `spec` holds: UTF-8 (`text`), a JSON document
/// (`json`), an `.npy` with a valid header (`npy`, of the declared shape if any). The error
/// says what is wrong, for the element's error record.
pub fn check_value(spec: &FieldSpec, value: &[u8]) -> Result<(), String> {
    match spec.kind {
        FieldKind::Text => std::str::from_utf8(value)
            .map(drop)
            .map_err(|e| format!("not UTF-8 text ({e})")),
        FieldKind::Json => match &spec.boxes {
            None => serde_json::from_slice::<serde::de::IgnoredAny>(value)
                .map(drop)
                .map_err(|e| format!("not a JSON document ({e})")),
            Some(b) => {
                let doc: serde_json::Value = serde_json::from_slice(value)
                    .map_err(|e| format!("not a JSON document ({e})"))?;
                let path: Vec<&str> = b
                    .path
                    .as_deref()
                    .map_or(Vec::new(), |p| p.split('.').collect());
                check_json_boxes(&doc, &path, false)
            }
        },
        FieldKind::Npy => {
            let (dtype, shape) = npy_header(value)?;
            match &spec.shape {
                Some(want) if *want != shape => Err(format!(
                    "an array of shape {shape:?}, but the field declares {want:?}"
                )),
                _ if spec.boxes.is_some() && (shape.len() != 2 || shape[1] != 4) => Err(format!(
                    "boxes are an (N, 4) array, not one of shape {shape:?}"
                )),
                _ if spec.boxes.is_some() && !["i", "u", "f"].contains(&dtype) => Err(format!(
                    "boxes are integers or floats, not an array of kind `{dtype}`"
                )),
                _ => Ok(()),
            }
        }
        FieldKind::Bytes | FieldKind::Image | FieldKind::Class => Ok(()),
    }
}

/// The shape of an `.npy` (format 1.0 to 3.0), once its header is checked: the magic, a
/// header dict with `descr`, `fortran_order` and `shape`, and data of the size they give.
pub fn npy_shape(b: &[u8]) -> Result<Vec<u64>, String> {
    npy_header(b).map(|(_, shape)| shape)
}

/// The dtype's kind (`b`, `i`, `u`, `f`, `c`, `?`) and the shape of an `.npy`, once checked
/// as [`npy_shape`] checks it.
fn npy_header(b: &[u8]) -> Result<(&str, Vec<u64>), String> {
    let h = NpyHeader::parse(b)?;
    let data = h.data_len().and_then(|n| n.checked_add(h.data_start));
    if data != Some(b.len() as u64) {
        return Err(format!(
            "a bad .npy header: shape {:?} of {} needs {} bytes of data, the file has {}",
            h.shape,
            h.descr,
            h.data_len()
                .map_or_else(|| "too many".into(), |d| d.to_string()),
            (b.len() as u64).saturating_sub(h.data_start)
        ));
    }
    Ok((h.kind, h.shape))
}

/// An `.npy` header (format 1.0 to 3.0), parsed from the file's first bytes (the data
/// after it are not looked at).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NpyHeader<'a> {
    /// The dtype as written (`<f4`, `|u1`).
    pub(crate) descr: &'a str,
    /// The dtype's kind: `b`, `i`, `u`, `f`, `c` or `?`.
    pub(crate) kind: &'a str,
    /// Bytes per value.
    pub(crate) item: u64,
    pub(crate) fortran_order: bool,
    pub(crate) shape: Vec<u64>,
    /// Where the data start (the header's length).
    pub(crate) data_start: u64,
}

impl<'a> NpyHeader<'a> {
    /// How many bytes a whole header takes, from the first 12 bytes of the file (fewer only
    /// when the file is shorter).
    pub(crate) fn len_from_start(b: &[u8]) -> Result<u64, String> {
        let bad = |why: &str| Err(format!("a bad .npy header: {why}"));
        if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
            return bad("no \\x93NUMPY magic");
        }
        match b[6] {
            1 => Ok(10 + u64::from(u16::from_le_bytes([b[8], b[9]]))),
            2 | 3 if b.len() >= 12 => {
                Ok(12 + u64::from(u32::from_le_bytes([b[8], b[9], b[10], b[11]])))
            }
            v => bad(&format!("unknown format version {v}")),
        }
    }

    /// Parses the header at the start of `b` (which must hold it whole).
    pub(crate) fn parse(b: &'a [u8]) -> Result<Self, String> {
        let bad = |why: &str| Err(format!("a bad .npy header: {why}"));
        let end = Self::len_from_start(b)?;
        let start = if b[6] == 1 { 10 } else { 12 };
        let Some(header) = usize::try_from(end).ok().and_then(|end| b.get(start..end)) else {
            return bad("the header runs past the end");
        };
        let Ok(header) = std::str::from_utf8(header) else {
            return bad("the header is not text");
        };
        let value = |key: &str| -> Option<&'a str> {
            let at = header.find(&format!("'{key}'"))? + key.len() + 2;
            let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
            Some(rest)
        };
        let Some(descr) = value("descr").and_then(|r| {
            let r = r.strip_prefix('\'')?;
            Some(&r[..r.find('\'')?])
        }) else {
            return bad("no 'descr'");
        };
        let (kind, item) = match descr.get(1..).and_then(|s| {
            let (kind, size) = s.split_at(s.find(|c: char| c.is_ascii_digit())?);
            Some((kind, size.parse::<u64>().ok()?))
        }) {
            Some((k, size)) if ["b", "i", "u", "f", "c", "?"].contains(&k) && size > 0 => (k, size),
            _ => return bad(&format!("unsupported dtype {descr:?}")),
        };
        let Some(fortran) = value("fortran_order") else {
            return bad("no 'fortran_order'");
        };
        let Some(shape) = value("shape").and_then(|r| {
            let r = r.strip_prefix('(')?;
            Some(&r[..r.find(')')?])
        }) else {
            return bad("no 'shape'");
        };
        let dims: Result<Vec<u64>, _> = shape
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse::<u64>)
            .collect();
        let Ok(dims) = dims else {
            return bad(&format!("shape ({shape}) is not a tuple of integers"));
        };
        Ok(NpyHeader {
            descr,
            kind,
            item,
            fortran_order: fortran.starts_with("True"),
            shape: dims,
            data_start: end,
        })
    }

    /// Bytes of data the shape and dtype need (`None` past `u64`).
    pub(crate) fn data_len(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(self.item, |n, &d| n.checked_mul(d))
    }
}

/// The start of an `.npy` file (format 1.0): the magic and the header dict `header`, padded
/// to 64 bytes as NumPy pads it; the array's data follow.
pub(crate) fn npy_start(header: &str) -> Vec<u8> {
    let mut h = header.to_owned();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    b
}

/// An `.npy` file of header dict `header` and `data` (tests).
#[cfg(test)]
pub(crate) fn npy_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = npy_start(header);
    b.extend_from_slice(data);
    b
}

/// A `(n,)` float32 `.npy` file of `values` (tests).
#[cfg(test)]
pub(crate) fn npy_f32(values: &[f32]) -> Vec<u8> {
    let header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        values.len()
    );
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy_file(&header, &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, data: usize) -> Vec<u8> {
        npy_file(header, &vec![0u8; data])
    }

    #[test]
    fn npy_headers() {
        let ok = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            24,
        );
        assert_eq!(npy_shape(&ok).unwrap(), [2, 3]);
        let scalar = npy("{'descr': '|u1', 'fortran_order': False, 'shape': (), }", 1);
        assert_eq!(npy_shape(&scalar).unwrap(), Vec::<u64>::new());
        let one = npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }",
            32,
        );
        assert_eq!(npy_shape(&one).unwrap(), [4]);
        for (bad, says) in [
            (b"not an npy at all".to_vec(), "magic"),
            (
                npy(
                    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                    20,
                ),
                "needs 24 bytes of data, the file has 20",
            ),
            (
                npy(
                    "{'descr': 'O', 'fortran_order': False, 'shape': (2,), }",
                    16,
                ),
                "unsupported dtype",
            ),
            (npy("{'descr': '<f4', 'shape': (2,), }", 8), "fortran_order"),
            (ok[..12].to_vec(), "past the end"),
        ] {
            let e = npy_shape(&bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let spec = |shape: Option<Vec<u64>>| FieldSpec {
            kind: FieldKind::Npy,
            from: None,
            shape,
            boxes: None,
            optional: false,
        };
        assert!(check_value(&spec(Some(vec![2, 3])), &ok).is_ok());
        assert!(
            check_value(&spec(Some(vec![3, 2])), &ok)
                .unwrap_err()
                .contains("declares [3, 2]")
        );
    }

    #[test]
    fn text_and_json_values() {
        let text = FieldSpec {
            kind: FieldKind::Text,
            from: None,
            shape: None,
            boxes: None,
            optional: false,
        };
        assert!(check_value(&text, "un chat".as_bytes()).is_ok());
        assert!(
            check_value(&text, b"\xff\xfe")
                .unwrap_err()
                .contains("UTF-8")
        );
        let json = FieldSpec {
            kind: FieldKind::Json,
            ..text
        };
        assert!(check_value(&json, br#"{"a": [1, 2]}"#).is_ok());
        assert!(check_value(&json, b"{nope").unwrap_err().contains("JSON"));
    }

    #[test]
    fn declarations() {
        let parse = |v: serde_json::Value| serde_json::from_value::<Fields>(v).map(drop);
        assert!(parse(serde_json::json!({"img": {"kind": "image"}})).is_ok());
        // Samples of small fields only (text-only shards, array rows).
        assert!(parse(serde_json::json!({"c": {"kind": "text"}})).is_ok());
        let e = parse(serde_json::json!({"c": {"kind": "class"}})).unwrap_err();
        assert!(e.to_string().contains("no field of kind `image`"), "{e}");
        let e =
            parse(serde_json::json!({"i": {"kind": "image"}, "t": {"kind": "text", "shape": [2]}}))
                .unwrap_err();
        assert!(
            e.to_string()
                .contains("`shape` is for fields of kind `npy`"),
            "{e}"
        );
        let e =
            parse(serde_json::json!({"i": {"kind": "image"}, "t": {"kind": "text", "from": " "}}))
                .unwrap_err();
        assert!(e.to_string().contains("`from` is empty"), "{e}");
    }

    #[test]
    fn boxes_declarations() {
        let parse = |v: serde_json::Value| serde_json::from_value::<Fields>(v);
        let img = serde_json::json!({"kind": "image"});
        // The short form is the format; the long one round-trips.
        let f =
            parse(serde_json::json!({"i": img, "b": {"kind": "npy", "boxes": "xyxy"}})).unwrap();
        let b = f
            .iter()
            .find(|(n, _)| *n == "b")
            .unwrap()
            .1
            .boxes
            .clone()
            .unwrap();
        assert_eq!((b.format, b.path, b.with.len()), (BoxFormat::Xyxy, None, 0));
        let long = serde_json::json!({"i": img, "ann": {"kind": "json",
            "boxes": {"format": "xywh", "path": "annotations.bbox", "with": ["cats"]}},
            "cats": {"kind": "npy"}});
        let f = parse(long.clone()).unwrap();
        assert_eq!(parse(serde_json::to_value(&f).unwrap()).unwrap(), f);
        for (bad, says) in [
            (
                serde_json::json!({"i": img, "b": {"kind": "text", "boxes": "xyxy"}}),
                "`npy` or `json`",
            ),
            (
                serde_json::json!({"i": img, "b": {"kind": "npy", "boxes": "yxyx"}}),
                "`boxes` is a format",
            ),
            (
                serde_json::json!({"i": img, "b": {"kind": "npy", "boxes": {"format": "xyxy", "path": "a"}}}),
                "`path` is for `json`",
            ),
            (
                serde_json::json!({"i": img, "b": {"kind": "json", "boxes": {"format": "xyxy", "path": "a..b"}}}),
                "none empty",
            ),
            (
                serde_json::json!({"i": img, "b": {"kind": "npy", "shape": [3, 4], "boxes": "xyxy"}}),
                "declare no `shape`",
            ),
            (
                serde_json::json!({"i": img, "b": {"kind": "npy", "boxes": {"format": "xyxy", "with": ["c"]}}}),
                "not declared",
            ),
            (
                serde_json::json!({"i": img, "b": {"kind": "npy", "boxes": {"format": "xyxy", "with": ["c"]}},
                "c": {"kind": "text"}}),
                "another `npy` or `json`",
            ),
            (
                serde_json::json!({"i": img, "b": {"kind": "npy", "boxes": {"format": "xyxy", "with": ["c"]}},
                "c": {"kind": "npy", "shape": [2]}}),
                "field `c`: boxes dropped",
            ),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{e} (wanted {says})");
        }
    }

    #[test]
    fn boxes_values_are_checked_when_loaded() {
        let spec = |kind, boxes: serde_json::Value| FieldSpec {
            kind,
            from: None,
            shape: None,
            boxes: Some(serde_json::from_value(boxes).unwrap()),
            optional: false,
        };
        let npy_boxes = spec(FieldKind::Npy, serde_json::json!("xyxy"));
        let ok = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }",
            32,
        );
        assert!(check_value(&npy_boxes, &ok).is_ok());
        let none = npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 4), }",
            0,
        );
        assert!(check_value(&npy_boxes, &none).is_ok());
        let three = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            24,
        );
        assert!(
            check_value(&npy_boxes, &three)
                .unwrap_err()
                .contains("(N, 4)")
        );
        let flags = npy(
            "{'descr': '|b1', 'fortran_order': False, 'shape': (1, 4), }",
            4,
        );
        assert!(
            check_value(&npy_boxes, &flags)
                .unwrap_err()
                .contains("kind `b`")
        );

        let coco = spec(
            FieldKind::Json,
            serde_json::json!({"format": "xywh", "path": "annotations.bbox"}),
        );
        let doc = br#"{"annotations": [{"bbox": [1, 2, 3, 4], "category_id": 7}, {"bbox": [0.5, 0, 1, 1]}]}"#;
        assert!(check_value(&coco, doc).is_ok());
        assert!(check_value(&coco, br#"{"annotations": []}"#).is_ok());
        for (bad, says) in [
            (&br#"{"images": []}"#[..], "no key `annotations`"),
            (br#"{"annotations": [{"bbox": [1, 2, 3]}]}"#, "4 numbers"),
            (
                br#"{"annotations": [{"bbox": [1, 2, 3, "4"]}]}"#,
                "4 numbers",
            ),
            (br#"{"annotations": 3}"#, "key `bbox`"),
            (b"{nope", "not a JSON document"),
        ] {
            let e = check_value(&coco, bad).unwrap_err();
            assert!(e.contains(says), "{e} (wanted {says})");
        }
        let hf = spec(
            FieldKind::Json,
            serde_json::json!({"format": "xywh", "path": "bbox"}),
        );
        assert!(check_value(&hf, br#"{"bbox": [[1, 2, 3, 4]], "category": [0]}"#).is_ok());
        let bare = spec(FieldKind::Json, serde_json::json!("xyxy"));
        assert!(check_value(&bare, b"[[0, 0, 1, 1]]").is_ok());
        assert!(
            check_value(&bare, br#"{"a": 1}"#)
                .unwrap_err()
                .contains("a list of boxes")
        );
    }
}

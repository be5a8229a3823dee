//! The fields of a sample, as a source declares them: `"fields": {"image": {"kind":
//! "image", "from": "img"}, "label": {"kind": "class", "from": "label"}}`, where `from` names
//! a column (`parquet`). The shape is the one every source kind will share; what a sample
//! delivers today is one image and one class, so a declaration naming another kind (`text`,
//! `json`, `npy`, `bytes`) is refused when the request is read (a 400 naming the field),
//! never ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a field holds.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FieldKind {
    /// An encoded image, decoded by the shared pipeline.
    Image,
    /// An integer class.
    Class,
    /// UTF-8 text (not supported yet).
    Text,
    /// A JSON document (not supported yet).
    Json,
    /// A NumPy array stored as `.npy` (not supported yet).
    Npy,
    /// Bytes passed through (not supported yet).
    Bytes,
}

impl FieldKind {
    fn name(self) -> &'static str {
        match self {
            FieldKind::Image => "image",
            FieldKind::Class => "class",
            FieldKind::Text => "text",
            FieldKind::Json => "json",
            FieldKind::Npy => "npy",
            FieldKind::Bytes => "bytes",
        }
    }
}

/// One declared field.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    pub kind: FieldKind,
    /// Where the field comes from: a column name (`parquet`). Default: chosen by the source
    /// (see the source kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// A sample's declared fields, by name: one `image` field and at most one `class` field
/// (checked when the declaration is read).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(
    try_from = "BTreeMap<String, FieldSpec>",
    into = "BTreeMap<String, FieldSpec>"
)]
pub struct Fields(BTreeMap<String, FieldSpec>);

impl Fields {
    /// The `from` of the field of `kind`, if one is declared: `Some(None)` when the field is
    /// declared without `from`.
    pub fn from_of(&self, kind: FieldKind) -> Option<Option<&str>> {
        self.0
            .values()
            .find(|f| f.kind == kind)
            .map(|f| f.from.as_deref())
    }

    /// True if a field of `kind` is declared.
    pub fn has(&self, kind: FieldKind) -> bool {
        self.0.values().any(|f| f.kind == kind)
    }
}

impl TryFrom<BTreeMap<String, FieldSpec>> for Fields {
    type Error = String;

    fn try_from(fields: BTreeMap<String, FieldSpec>) -> Result<Self, String> {
        for (name, f) in &fields {
            if !matches!(f.kind, FieldKind::Image | FieldKind::Class) {
                return Err(format!(
                    "field `{name}`: fields of kind `{}` are not supported yet; a sample is \
                     one `image` field and one `class` field for now",
                    f.kind.name()
                ));
            }
            if f.from.as_deref().is_some_and(str::is_empty) {
                return Err(format!("field `{name}`: `from` is empty"));
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
        if !fields.values().any(|f| f.kind == FieldKind::Image) {
            return Err("no field of kind `image`: a sample needs one".into());
        }
        if !fields.values().any(|f| f.kind == FieldKind::Class) {
            return Err(
                "no field of kind `class`: a sample is one image and one class for now".into(),
            );
        }
        Ok(Fields(fields))
    }
}

impl From<Fields> for BTreeMap<String, FieldSpec> {
    fn from(f: Fields) -> Self {
        f.0
    }
}

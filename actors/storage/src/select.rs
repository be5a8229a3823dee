//! Files as users name them: a source's `paths` may be glob patterns (`data/train-*.parquet`,
//! with the `glob` crate: `*`, `?`, `[...]`, `**`) and WebDataset's brace ranges and lists
//! (`shards-{000000..000146}.tar`, `{train,val}.tar`, with `bracoxide`); a Hugging Face
//! dataset folder gives one split's files ([`hub_split`]).

use std::path::{Path, PathBuf};

use crate::StorageError;
use crate::roots::Roots;

/// The glob metacharacters.
const GLOB: [char; 3] = ['*', '?', '['];

/// Whether `s` holds a glob metacharacter.
fn is_glob(s: &str) -> bool {
    s.contains(GLOB)
}

/// `path` with its brace ranges and lists expanded, in their order (itself when it has none).
fn braces(path: &Path) -> Result<Vec<PathBuf>, StorageError> {
    let s = path.to_string_lossy();
    if !s.contains('{') {
        return Ok(vec![path.to_owned()]);
    }
    let expanded = bracoxide::explode(&s).map_err(|e| StorageError::BadPattern {
        pattern: s.to_string(),
        reason: e.to_string(),
    })?;
    if expanded.is_empty() {
        // bracoxide expands a descending range (`{9..1}`) to nothing.
        return Err(StorageError::BadPattern {
            pattern: s.to_string(),
            reason: "its braces expand to no path (a range goes upwards: {000000..000146})".into(),
        });
    }
    Ok(expanded.into_iter().map(PathBuf::from).collect())
}

/// An object key with its brace ranges and lists expanded, in their order.
pub(crate) fn brace_keys(key: &str) -> Result<Vec<String>, StorageError> {
    Ok(braces(Path::new(key))?
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect())
}

/// An object key that is a glob pattern: `*` and `?` stay within a `/`-separated component,
/// `**` crosses them.
pub(crate) struct KeyPattern {
    /// The key's part before its first metacharacter: what to list.
    pub(crate) prefix: String,
    pattern: glob::Pattern,
}

impl KeyPattern {
    /// `None` for a key without metacharacters.
    pub(crate) fn of(key: &str) -> Result<Option<KeyPattern>, StorageError> {
        let Some(first) = key.find(GLOB) else {
            return Ok(None);
        };
        let pattern = glob::Pattern::new(key).map_err(|e| StorageError::BadPattern {
            pattern: key.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Some(KeyPattern {
            prefix: key[..first].to_owned(),
            pattern,
        }))
    }

    pub(crate) fn matches(&self, key: &str) -> bool {
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        self.pattern.matches_with(key, options)
    }
}

/// The folder a glob pattern is matched under: its components before the first one that
/// holds a metacharacter.
fn literal_prefix(pattern: &Path) -> PathBuf {
    pattern
        .components()
        .take_while(|c| !is_glob(&c.as_os_str().to_string_lossy()))
        .collect()
}

/// The matches of the glob `pattern` that are folders or files with extension `ext` (any
/// case), sorted, each under the roots. The folder it is matched under is checked against the
/// roots first, so that nothing outside them is listed. Nothing kept is `NoMatch`.
fn matches(roots: &Roots, pattern: &Path, ext: &str) -> Result<Vec<PathBuf>, StorageError> {
    let text = pattern.to_string_lossy();
    let bad = |reason: String| StorageError::BadPattern {
        pattern: text.to_string(),
        reason,
    };
    let prefix = literal_prefix(pattern);
    match roots.check(&prefix) {
        Ok(_) | Err(StorageError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    };
    let mut found = Vec::new();
    for entry in glob::glob_with(&text, options).map_err(|e| bad(e.to_string()))? {
        let path = entry.map_err(|e| {
            let path = e.path().to_owned();
            StorageError::io(&path, e.into())
        })?;
        let keep = path.is_dir()
            || path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case(ext));
        if keep {
            roots.check(&path)?;
            found.push(path);
        }
    }
    if found.is_empty() {
        return Err(StorageError::NoMatch {
            pattern: text.to_string(),
            ext: ext.to_owned(),
        });
    }
    found.sort();
    Ok(found)
}

/// The paths that `paths` name: brace ranges and lists expanded in their order, glob patterns
/// replaced by their matches (folders, and files with extension `ext`), sorted; literal paths
/// as they are (checked, and folders expanded, by [`Roots::files_with_extension`]). A path
/// that exists as it is written (a folder named `shards[1]`) is taken as it is.
pub(crate) fn expand(
    roots: &Roots,
    paths: &[PathBuf],
    ext: &str,
) -> Result<Vec<PathBuf>, StorageError> {
    let mut out = Vec::new();
    for path in paths {
        if path.exists() {
            out.push(path.clone());
            continue;
        }
        for p in braces(path)? {
            if is_glob(&p.to_string_lossy()) {
                out.extend(matches(roots, &p, ext)?);
            } else {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// The names the Hub gives a split in its files' paths (`datasets`' split keywords): the
/// split itself, and for the three usual splits their other names.
pub(crate) fn split_names(split: &str) -> Vec<&str> {
    const ALIASES: [&[&str]; 3] = [
        &["train", "training"],
        &["validation", "valid", "dev", "val"],
        &["test", "testing", "eval", "evaluation"],
    ];
    ALIASES
        .iter()
        .find(|names| names.contains(&split))
        .map_or_else(|| vec![split], |names| names.to_vec())
}

/// The Hub's layouts of a split's Parquet files under a dataset folder, most specific first
/// (`{}` is a name of the split): the files `datasets` uploads (`data/train-00000-of-00004.parquet`),
/// a folder per split (`train/0000.parquet`, and `default/train/0000.parquet` as the Hub's
/// Parquet conversion writes it), and a split in the file's name (`train.parquet`,
/// `mnist-train-0.parquet`).
pub(crate) const HUB_LAYOUTS: [&str; 6] = [
    "data/{}-*.parquet",
    "data/{}/**/*.parquet",
    "{}/**/*.parquet",
    "*/{}/**/*.parquet",
    "{}[-._]*.parquet",
    "*[-._]{}[-._]*.parquet",
];

/// The Parquet files of split `split` of the Hugging Face dataset folder `folder`: those its
/// dataset card (`README.md`) gives the split in its `configs` (the config marked `default`,
/// else the one named `default`, else the first), else those of the first of the Hub's
/// layouts ([`HUB_LAYOUTS`]) that holds any, under any name of the split. Sorted; `NoMatch`
/// naming the split and what was tried when there are none.
pub(crate) fn hub_split(
    roots: &Roots,
    folder: &Path,
    split: &str,
) -> Result<Vec<PathBuf>, StorageError> {
    let canonical = roots.check(folder)?;
    if !canonical.is_dir() {
        return Err(StorageError::NotADirectory {
            path: folder.to_owned(),
        });
    }
    let card = canonical.join("README.md");
    // The folder's own name is no pattern.
    let base = PathBuf::from(glob::Pattern::escape(&canonical.to_string_lossy()));
    if let Some(patterns) = card_split(&card, split)? {
        let mut files = Vec::new();
        for p in &patterns {
            files.extend(matches(roots, &base.join(p), "parquet")?);
        }
        files.retain(|f| f.is_file());
        files.sort();
        files.dedup();
        return Ok(files);
    }
    for layout in HUB_LAYOUTS {
        let mut files = Vec::new();
        for name in split_names(split) {
            let pattern = base.join(layout.replace("{}", name));
            match matches(roots, &pattern, "parquet") {
                Ok(found) => files.extend(found.into_iter().filter(|f| f.is_file())),
                Err(StorageError::NoMatch { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if !files.is_empty() {
            files.sort();
            files.dedup();
            return Ok(files);
        }
    }
    Err(StorageError::NoMatch {
        pattern: format!(
            "split `{split}` of {} (tried {}, the names {})",
            folder.display(),
            HUB_LAYOUTS.join(", "),
            split_names(split).join(", ")
        ),
        ext: "parquet".into(),
    })
}

/// The `data_files` patterns that the dataset card `card` gives split `split` in its YAML
/// front matter's `configs`; `None` when there is no card, no front matter or no `configs`.
/// A card whose configs do not name the split is `NoMatch`.
fn card_split(card: &Path, split: &str) -> Result<Option<Vec<String>>, StorageError> {
    let Ok(text) = std::fs::read_to_string(card) else {
        return Ok(None);
    };
    card_split_text(&text, &card.display().to_string(), split)
}

/// [`card_split`] of a card's text (`card` names it in errors).
pub(crate) fn card_split_text(
    text: &str,
    card: &str,
    split: &str,
) -> Result<Option<Vec<String>>, StorageError> {
    let Some(front) = text
        .strip_prefix("---\n")
        .and_then(|rest| rest.split_once("\n---").map(|(yaml, _)| yaml))
    else {
        return Ok(None);
    };
    let bad = |reason: String| StorageError::BadPattern {
        pattern: card.to_owned(),
        reason,
    };
    let docs = yaml_rust2::YamlLoader::load_from_str(front)
        .map_err(|e| bad(format!("the dataset card's YAML: {e}")))?;
    let Some(configs) = docs.first().and_then(|d| d["configs"].as_vec()) else {
        return Ok(None);
    };
    let config = configs
        .iter()
        .find(|c| c["default"].as_bool() == Some(true))
        .or_else(|| {
            configs
                .iter()
                .find(|c| c["config_name"].as_str() == Some("default"))
        })
        .or(configs.first());
    let Some(config) = config else {
        return Ok(None);
    };
    let strings = |y: &yaml_rust2::Yaml| -> Vec<String> {
        match (y.as_str(), y.as_vec()) {
            (Some(s), _) => vec![s.to_owned()],
            (None, Some(v)) => v
                .iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    };
    let data_files = &config["data_files"];
    let patterns = match data_files.as_vec() {
        // `data_files: [{split: train, path: data/train-*}, ...]`
        Some(list) if list.iter().any(|f| !f["split"].is_badvalue()) => list
            .iter()
            .filter(|f| f["split"].as_str() == Some(split))
            .flat_map(|f| strings(&f["path"]))
            .collect(),
        // `data_files: "data/*.parquet"` or a list of patterns: the train split.
        _ if split == "train" => strings(data_files),
        _ => Vec::new(),
    };
    if patterns.is_empty() {
        return Err(StorageError::NoMatch {
            pattern: format!(
                "split `{split}` (the dataset card {} names other splits in its configs)",
                card
            ),
            ext: "parquet".into(),
        });
    }
    Ok(Some(patterns))
}

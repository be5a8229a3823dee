//! `manifest`: a CSV or JSON-lines list of `path, label`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::roots::Roots;
use super::{DatasetIndex, Item, Location, Progress, StorageError, named_classes, numeric_classes};

/// A label as written in the manifest.
enum RawLabel {
    Number(i64),
    Name(String),
}

/// One manifest entry before path resolution: (line number, path, label).
type Entry = (u64, String, RawLabel);

#[derive(Deserialize)]
struct JsonEntry {
    path: String,
    label: serde_json::Value,
}

pub(super) fn index(
    path: &Path,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let manifest = roots.check(path)?;
    let bad = |line: u64, reason: String| StorageError::BadManifest {
        path: path.to_owned(),
        line,
        reason,
    };
    let ext = manifest
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let bytes = std::fs::read(&manifest).map_err(|e| StorageError::io(path, e))?;
    let text = String::from_utf8(bytes).map_err(|_| bad(0, "the file is not utf-8".into()))?;
    let entries = match ext.as_deref() {
        Some("csv") => parse_csv(&text).map_err(|(line, r)| bad(line, r))?,
        Some("jsonl" | "json") => parse_json(&text).map_err(|(line, r)| bad(line, r))?,
        _ => {
            return Err(bad(
                0,
                "unknown manifest format: the file name must end in .csv, .jsonl or .json".into(),
            ));
        }
    };

    let base = manifest.parent().unwrap_or(Path::new("/")).to_owned();
    let all_numeric = entries
        .iter()
        .all(|(_, _, l)| matches!(l, RawLabel::Number(_)));
    let classes = if all_numeric {
        let labels = entries.iter().filter_map(|(_, _, l)| match l {
            RawLabel::Number(n) => Some(*n),
            RawLabel::Name(_) => None,
        });
        numeric_classes(labels, &|| format!("manifest {}", path.display()))?
    } else {
        named_classes(entries.iter().map(|(_, _, l)| match l {
            RawLabel::Name(s) => s.as_str(),
            RawLabel::Number(_) => "",
        }))
    };

    let mut items = Vec::with_capacity(entries.len());
    for (_, file, label) in entries {
        let file = PathBuf::from(file);
        let full = if file.is_absolute() {
            file
        } else {
            base.join(file)
        };
        let canonical = roots.check(&full)?;
        let label = match label {
            RawLabel::Number(n) => n,
            // `classes` holds every name, sorted.
            RawLabel::Name(name) => classes.binary_search(&name).unwrap_or_default() as i64,
        };
        items.push(Item {
            location: Location::File(canonical),
            label,
        });
        progress.tick()?;
    }
    Ok(DatasetIndex {
        items,
        classes,
        shards: Vec::new(),
    })
}

/// CSV: `path,label` per line, an optional `path,label` header, RFC 4180 quotes (no line
/// breaks inside fields), blank lines ignored. Labels are numbers if every label is an
/// integer, class names otherwise.
fn parse_csv(text: &str) -> Result<Vec<Entry>, (u64, String)> {
    let mut rows = Vec::new();
    let mut first = true;
    for (i, line) in text.lines().enumerate() {
        let n = i as u64 + 1;
        if line.trim().is_empty() {
            continue;
        }
        let fields = split_csv_line(line).map_err(|r| (n, r))?;
        let [path, label] = <[String; 2]>::try_from(fields).map_err(|f| {
            (
                n,
                format!("expected 2 fields (path,label), found {}", f.len()),
            )
        })?;
        let (path, label) = (path.trim().to_owned(), label.trim().to_owned());
        if std::mem::take(&mut first)
            && path.eq_ignore_ascii_case("path")
            && label.eq_ignore_ascii_case("label")
        {
            continue;
        }
        if path.is_empty() || label.is_empty() {
            return Err((n, "empty path or label".into()));
        }
        rows.push((n, path, label));
    }
    let numeric = rows.iter().all(|(_, _, l)| l.parse::<i64>().is_ok());
    Ok(rows
        .into_iter()
        .map(|(n, path, label)| {
            let label = match label.parse::<i64>() {
                Ok(v) if numeric => RawLabel::Number(v),
                _ => RawLabel::Name(label),
            };
            (n, path, label)
        })
        .collect())
}

/// Splits one CSV line into fields, honouring `"quoted, ""fields"""`.
fn split_csv_line(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.trim().is_empty() && !was_quoted => {
                field.clear();
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                fields.push(std::mem::take(&mut field));
                was_quoted = false;
            }
            (false, c) if was_quoted && !c.is_whitespace() => {
                return Err("text after a closing quote".into());
            }
            (false, _) if was_quoted => {}
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    fields.push(field);
    Ok(fields)
}

/// JSON lines (`{"path": "...", "label": 3}` per line, blank lines ignored), or one JSON
/// array of such objects. Labels are numbers (integers) or strings (class names), not both.
fn parse_json(text: &str) -> Result<Vec<Entry>, (u64, String)> {
    let mut raw: Vec<(u64, JsonEntry)> = Vec::new();
    if text.trim_start().starts_with('[') {
        let list: Vec<JsonEntry> =
            serde_json::from_str(text).map_err(|e| (e.line() as u64, json_reason(&e)))?;
        raw.extend(list.into_iter().enumerate().map(|(i, e)| (i as u64 + 1, e)));
    } else {
        for (i, line) in text.lines().enumerate() {
            let n = i as u64 + 1;
            if line.trim().is_empty() {
                continue;
            }
            let e = serde_json::from_str(line).map_err(|e| (n, json_reason(&e)))?;
            raw.push((n, e));
        }
    }
    let mut entries = Vec::with_capacity(raw.len());
    let (mut numbers, mut names) = (false, false);
    for (n, e) in raw {
        if e.path.is_empty() {
            return Err((n, "empty path".into()));
        }
        let label = match e.label {
            serde_json::Value::Number(v) => {
                numbers = true;
                RawLabel::Number(
                    v.as_i64()
                        .ok_or_else(|| (n, format!("label {v} is not an integer")))?,
                )
            }
            serde_json::Value::String(s) if !s.trim().is_empty() => {
                names = true;
                RawLabel::Name(s.trim().to_owned())
            }
            other => return Err((n, format!("label {other} is neither an integer nor a name"))),
        };
        if numbers && names {
            return Err((n, "the manifest mixes numeric and text labels".into()));
        }
        entries.push((n, e.path, label));
    }
    Ok(entries)
}

fn json_reason(e: &serde_json::Error) -> String {
    // serde_json appends " at line L column C"; the line is reported separately.
    let s = e.to_string();
    let s = s.split(" at line ").next().unwrap_or(&s);
    format!("invalid json: {s}").to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::split_csv_line;

    #[test]
    fn csv_fields() {
        assert_eq!(split_csv_line("a.jpg,3").unwrap(), ["a.jpg", "3"]);
        assert_eq!(
            split_csv_line(r#""a, ""b"".jpg",cat"#).unwrap(),
            ["a, \"b\".jpg", "cat"]
        );
        assert_eq!(split_csv_line(r#" "x" ,1"#).unwrap(), ["x", "1"]);
        assert_eq!(split_csv_line("a,b,c").unwrap().len(), 3);
        assert!(split_csv_line(r#""open,1"#).is_err());
        assert!(split_csv_line(r#""a"b,1"#).is_err());
    }
}

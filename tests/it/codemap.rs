//! ARCHITECTURE.md's code map against the tree: every source file (Rust, Python, shell, the
//! dashboard's files) must be named in it, so that a file added without a line in the map
//! fails the test command.
//!
//! The map is a list of bullets. A bullet that opens with a folder in backticks
//! (`` `actors/service/src/` — ``) is that folder's entry; a file under it is named there,
//! or in the bullets nested under it, by its name in backticks (`` `pace.rs` ``) with each
//! folder between the entry's folder and the file named with a slash (`` `sampler/` ``), or
//! by its path from the entry's folder (`` `tree/draw.rs` ``) or from the repository's root. The deepest entry whose folder holds the file is the one that must name
//! it.

use std::path::{Path, PathBuf};

/// Extensions of the files the map must name.
const SOURCE: &[&str] = &["rs", "py", "pyi", "sh", "js", "html", "css"];

/// Folders of the repository the map covers, and folders never walked.
const ROOTS: &[&str] = &["actors", "dataplane", "server", "tests", "web-ui", "docker"];
const SKIP: &[&str] = &["target", "node_modules", "__pycache__"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

fn sources(dir: &Path, rel: &str, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir)
        .expect("read a source folder")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || SKIP.contains(&name.as_str()) {
            continue;
        }
        let path = format!("{rel}/{name}");
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            sources(&entry.path(), &path, out);
        } else if Path::new(&name)
            .extension()
            .is_some_and(|e| SOURCE.contains(&e.to_string_lossy().as_ref()))
        {
            out.push(path);
        }
    }
}

/// The code map's top-level bullets, each with its nested bullets, as (folder, text).
fn entries(map: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in map.lines() {
        if let Some(rest) = line.strip_prefix("- ") {
            let folder = rest
                .strip_prefix('`')
                .and_then(|r| r.split_once('`'))
                .map(|(f, _)| f)
                .filter(|f| f.ends_with('/'))
                .unwrap_or("")
                .to_string();
            out.push((folder, rest.to_string()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push('\n');
            text.push_str(line);
        }
    }
    out
}

/// Whether `text` names `rest` (a path relative to the entry's folder).
fn names(text: &str, folder: &str, rest: &str) -> bool {
    if text.contains(&format!("`{folder}{rest}`")) || text.contains(&format!("`{rest}`")) {
        return true;
    }
    let parts: Vec<&str> = rest.split('/').collect();
    let (file, dirs) = parts.split_last().expect("a file name");
    text.contains(&format!("`{file}`"))
        && dirs.iter().all(|d| {
            text.contains(&format!("`{d}/`"))
                || text.contains(&format!("`{d}/{file}`"))
                || text.contains(&format!("/{d}/`"))
        })
}

fn missing_from(map: &str, files: &[String]) -> Vec<String> {
    let entries = entries(map);
    files
        .iter()
        .filter(|f| {
            let entry = entries
                .iter()
                .filter(|(folder, _)| !folder.is_empty() && f.starts_with(folder.as_str()))
                .max_by_key(|(folder, _)| folder.len());
            !match entry {
                Some((folder, text)) => names(text, folder, &f[folder.len()..]),
                None => map.contains(&format!("`{f}`")),
            }
        })
        .cloned()
        .collect()
}

fn code_map() -> String {
    let doc = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let start = doc.find("## Codemap").expect("a ## Codemap section");
    let body = &doc[start + "## Codemap".len()..];
    body[..body.find("\n## ").unwrap_or(body.len())].to_string()
}

#[test]
fn every_source_file_is_in_the_code_map() {
    let root = repo();
    let mut files = Vec::new();
    for top in ROOTS {
        sources(&root.join(top), top, &mut files);
    }
    files.sort();
    assert!(files.len() > 100, "found only {} source files", files.len());
    let missing = missing_from(&code_map(), &files);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name these files (add each to the entry of its \
         folder): {missing:#?}"
    );
}

#[test]
fn a_file_the_map_does_not_name_is_reported() {
    let map =
        "- `a/src/` — `lib.rs`, `sub/` (`x.rs`), `t/u.rs`\n  - `y.rs`: why\n- `b/` — `b/c/d.rs`\n";
    let files: Vec<String> = [
        "a/src/lib.rs",
        "a/src/sub/x.rs",
        "a/src/t/u.rs",
        "a/src/y.rs",
        "b/c/d.rs",
    ]
    .map(String::from)
    .to_vec();
    assert!(missing_from(map, &files).is_empty());
    let more = [
        files.clone(),
        vec!["a/src/z.rs".into(), "a/src/other/x.rs".into()],
    ]
    .concat();
    assert_eq!(missing_from(map, &more), ["a/src/z.rs", "a/src/other/x.rs"]);
}

/// The folders below `dir` (relative to the repository) that hold a `Cargo.toml`.
fn crate_folders(dir: &Path, rel: &str, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read a folder").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || SKIP.contains(&name.as_str()) {
            continue;
        }
        if entry.file_type().expect("file type").is_dir() {
            let path = format!("{rel}{name}/");
            if entry.path().join("Cargo.toml").is_file() {
                out.push(path.clone());
            }
            crate_folders(&entry.path(), &path, out);
        }
    }
}

/// Pairs (outer, inner) where the folder of one crate holds another crate.
fn nested_crates(crates: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for outer in crates {
        for inner in crates {
            if inner != outer && inner.starts_with(outer.as_str()) {
                out.push((outer.clone(), inner.clone()));
            }
        }
    }
    out
}

#[test]
fn a_folder_that_holds_a_crate_holds_no_other_crate() {
    let mut crates = Vec::new();
    crate_folders(&repo(), "", &mut crates);
    crates.sort();
    assert!(crates.len() >= 8, "found only the crates {crates:?}");
    let nested = nested_crates(&crates);
    assert!(
        nested.is_empty(),
        "a crate's folder holds another crate (make the outer folder a group of sibling \
         crates, and ARCHITECTURE.md's picture with it): {nested:?}"
    );
    let map = code_map();
    for krate in &crates {
        assert!(
            map.contains(&format!("`{krate}")),
            "ARCHITECTURE.md's code map does not name the crate folder {krate}"
        );
    }
}

#[test]
fn a_crate_inside_another_crates_folder_is_reported() {
    let crates = ["a/", "a/b/", "c/d/", "c/e/"].map(String::from);
    assert_eq!(nested_crates(&crates), [("a/".into(), "a/b/".into())]);
}

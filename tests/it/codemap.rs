//! ARCHITECTURE.md's code map against the tree: the map names each crate (and the other
//! top-level folders) by its folder in backticks (`` `actors/storage/` ``); every source file
//! (Rust, Python, shell, the dashboard's files) must lie under a folder the map names, so that
//! a new crate or folder outside the named ones fails the test command. A folder that holds a
//! crate must hold no other crate. What each file holds is said in its own module docs.

use std::path::{Path, PathBuf};

/// Extensions of the files the map must cover.
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

/// The folders the map names: each backticked path that ends with `/`.
fn named_folders(map: &str) -> Vec<String> {
    map.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with('/') && !s.contains(' '))
        .map(str::to_owned)
        .collect()
}

/// The files that lie under no folder the map names.
fn uncovered(map: &str, files: &[String]) -> Vec<String> {
    let folders = named_folders(map);
    files
        .iter()
        .filter(|f| !folders.iter().any(|d| f.starts_with(d.as_str())))
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
fn every_source_file_lies_under_a_folder_the_code_map_names() {
    let root = repo();
    let mut files = Vec::new();
    for top in ROOTS {
        sources(&root.join(top), top, &mut files);
    }
    files.sort();
    assert!(files.len() > 100, "found only {} source files", files.len());
    let missing = uncovered(&code_map(), &files);
    assert!(
        missing.is_empty(),
        "these files lie under no folder ARCHITECTURE.md's code map names (name their crate \
         or folder, with its key types and invariant): {missing:#?}"
    );
}

#[test]
fn a_file_outside_the_named_folders_is_reported() {
    let map = "- `a/` — crate `a`: `Thing`.\n- `b/c/` — crate `c`; a sentence with `x y/`.\n";
    let files: Vec<String> = [
        "a/src/lib.rs",
        "a/src/m/x.rs",
        "b/c/src/lib.rs",
        "b/d/lib.rs",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(uncovered(map, &files), ["b/d/lib.rs"]);
    assert_eq!(named_folders(map), ["a/", "b/c/"]);
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

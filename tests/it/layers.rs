//! The daemon's modules import one way (ARCHITECTURE.md, "Layer boundaries"): among the
//! top-level modules of `server/daemon/src`, no two import each other, directly or through others.
//! A module's imports are the `crate::` paths its files name, outside comments.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The first segments of the paths in a `use` group's text (`a::b, c::{d, e}` gives a, c).
fn heads(group: &str) -> Vec<String> {
    let (mut out, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for ch in group.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out.push(cur);
    out.iter()
        .map(|s| {
            s.trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// The modules a file's code names through `crate::` (line comments left out).
fn imports(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(group.len(), |(j, _)| j);
            out.extend(heads(&group[..end]));
        } else {
            out.extend(heads(
                rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or(""),
            ));
        }
    }
    out
}

fn graph(src: &Path) -> Graph {
    fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir)
            .expect("read server/daemon/src")
            .flatten()
        {
            let p = e.path();
            if p.is_dir() {
                walk(&p, files);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let top = |p: &Path| {
        let rel = p.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a component");
        let s = first.as_os_str().to_string_lossy().into_owned();
        s.strip_suffix(".rs").map(str::to_owned).unwrap_or(s)
    };
    let modules: BTreeSet<String> = files.iter().map(|p| top(p)).collect();
    let mut g: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for f in &files {
        let from = top(f);
        if from == "lib" {
            continue; // the crate root declares and wires every module
        }
        let text = std::fs::read_to_string(f).expect("read a source file");
        for to in imports(&text) {
            if to != from && modules.contains(&to) && to != "lib" {
                g.get_mut(&from).expect("a module").insert(to);
            }
        }
    }
    g
}

/// The import edges that lie on a loop, each as the pair of its modules in name order.
fn loops(g: &Graph) -> Vec<(String, String)> {
    let reach = |a: &String| {
        let (mut seen, mut stack) = (BTreeSet::new(), vec![a.clone()]);
        while let Some(x) = stack.pop() {
            for y in g.get(&x).into_iter().flatten() {
                if seen.insert(y.clone()) {
                    stack.push(y.clone());
                }
            }
        }
        seen
    };
    let mut out = BTreeSet::new();
    for (a, tos) in g {
        for b in tos {
            if reach(b).contains(a) {
                out.insert((a.min(b).clone(), a.max(b).clone()));
            }
        }
    }
    out.into_iter().collect()
}

#[test]
fn the_servers_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/daemon/src");
    let g = graph(&src);
    assert!(
        g.contains_key("registry") && g.contains_key("cluster"),
        "{g:?}"
    );
    assert!(
        !g["registry"].contains("cluster"),
        "the registry imports the cluster (it names the cluster through its ClusterNode trait): {g:#?}"
    );
    assert_eq!(
        loops(&g),
        Vec::<(String, String)>::new(),
        "import loops in {g:#?}"
    );
}

#[test]
fn an_import_loop_is_found() {
    assert_eq!(
        imports("use crate::{a::X, b::{c, d}};\n// crate::e\nlet x = crate::f::g(); my_crate::h"),
        ["a", "b", "f"]
    );
    let mut g = Graph::new();
    for (a, b) in [
        ("http", "registry"),
        ("cluster", "registry"),
        ("registry", "config"),
    ] {
        g.entry(a.into()).or_default().insert(b.into());
    }
    assert!(loops(&g).is_empty());
    g.entry("config".into())
        .or_default()
        .insert("cluster".into());
    assert_eq!(
        loops(&g),
        [
            ("cluster".into(), "config".into()),
            ("cluster".into(), "registry".into()),
            ("config".into(), "registry".into())
        ]
    );
}

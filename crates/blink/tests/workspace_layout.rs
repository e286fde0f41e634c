//! The workspace keeps its shape: no source file over 800 lines, no two modules of a
//! crate importing each other in a loop, crate dependencies pointing one way, and every
//! crate's `lib.rs` saying what it owns.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates, each allowed to depend only on crates before it.
const ORDER: &[&str] = &["blink-gguf", "blink-kernels", "blink-runtime", "blink-text", "blink-model", "blink-engine", "blink-cluster", "blink-train", "blink-server", "blink"];

const MAX_LINES: usize = 800;

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_source_file_is_over_800_lines() {
    let mut files = Vec::new();
    rust_files(&crates_dir(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter(|p| !p.components().any(|c| c.as_os_str() == "target"))
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by responsibility: {long:?}");
}

/// A crate's modules by path (`a::b`, the crate root is ``), with their code (comments
/// left out).
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                parts.pop();
            }
            // Comments (doc links among them) are not imports.
            let code: String = std::fs::read_to_string(&p).unwrap().lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
            (parts.join("::"), code)
        })
        .collect()
}

/// The first identifier paths after `crate::` or `super::` in `text`, resolved to absolute
/// paths from module `from` (braced groups give one path per item).
fn referenced_paths(from: &str, text: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let (base, rest) = if bytes[i..].starts_with(b"crate::") && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')) {
            (Vec::new(), i + 7)
        } else if bytes[i..].starts_with(b"super::") && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':')) {
            let mut base: Vec<String> = if from.is_empty() { Vec::new() } else { from.split("::").map(String::from).collect() };
            let mut j = i;
            while bytes[j..].starts_with(b"super::") {
                base.pop();
                j += 7;
            }
            (base, j)
        } else {
            i += 1;
            continue;
        };
        let mut path = base.clone();
        let mut j = rest;
        loop {
            if bytes[j..].starts_with(b"{") {
                // One path per item of the group (first segment is enough).
                let end = text[j..].find('}').map_or(text.len(), |e| j + e);
                for item in text[j + 1..end].split(',') {
                    let name = ident(item.trim());
                    if !name.is_empty() {
                        let mut p = path.clone();
                        p.push(name);
                        out.push(p);
                    }
                }
                break;
            }
            let name = ident(&text[j..]);
            if name.is_empty() {
                out.push(path);
                break;
            }
            j += name.len();
            path.push(name);
            if !bytes[j..].starts_with(b"::") {
                out.push(path);
                break;
            }
            j += 2;
        }
        i = j.max(i + 1);
    }
    out
}

/// Import loops between sibling modules of the crate at `src`, each as its modules.
fn import_loops(src: &Path) -> Vec<Vec<String>> {
    let mods = modules(src);
    let known: BTreeSet<&str> = mods.keys().map(String::as_str).collect();
    // Edges between siblings: `a → b` when something under `a` uses something under `b`.
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, text) in &mods {
        for path in referenced_paths(from, text) {
            // The longest prefix that is a module.
            let to = (0..=path.len()).rev().map(|n| path[..n].join("::")).find(|p| known.contains(p.as_str())).unwrap_or_default();
            let (f, t): (Vec<&str>, Vec<&str>) = (from.split("::").filter(|s| !s.is_empty()).collect(), to.split("::").filter(|s| !s.is_empty()).collect());
            let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
            if common == f.len() || common == t.len() {
                continue; // an ancestor or a descendant: a parent and its children
            }
            let parent = f[..common].join("::");
            let key = |m: &str| if parent.is_empty() { m.to_string() } else { format!("{parent}::{m}") };
            edges.entry(key(f[common])).or_default().insert(key(t[common]));
        }
    }
    // Each strongly connected group of more than one module is a loop.
    let nodes: Vec<String> = edges.keys().cloned().collect();
    let reach = |a: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![a.to_string()];
        while let Some(n) = stack.pop() {
            for m in edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (n, reach(n))).collect();
    let mut loops: Vec<Vec<String>> = Vec::new();
    for n in &nodes {
        let group: Vec<String> = nodes.iter().filter(|m| *m == n || (reaches[n].contains(*m) && reaches[*m].contains(n))).cloned().collect();
        if group.len() > 1 && !loops.contains(&group) {
            loops.push(group);
        }
    }
    loops
}

#[test]
fn no_two_modules_import_each_other_in_a_loop() {
    let mut found = Vec::new();
    for name in ORDER {
        let src = crates_dir().join(name).join("src");
        if src.is_dir() {
            found.extend(import_loops(&src).into_iter().map(|l| format!("{name}: {}", l.join(" <-> "))));
        }
    }
    assert!(found.is_empty(), "import loops: {found:#?}");
}

#[test]
fn the_loop_finder_finds_a_loop() {
    let dir = std::env::temp_dir().join(format!("blink-layout-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "mod inner;\nuse crate::b::Thing;\n").unwrap();
    std::fs::write(dir.join("a/inner.rs"), "use super::super::b;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::{a::inner::X, c};\n").unwrap();
    let loops = import_loops(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(loops, vec![vec!["a".to_string(), "b".to_string()]]);
}

#[test]
fn crate_dependencies_point_one_way_and_each_crate_says_what_it_owns() {
    for (i, name) in ORDER.iter().enumerate() {
        let dir = crates_dir().join(name);
        if !dir.is_dir() {
            continue;
        }
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        // Only [dependencies] and [dev-dependencies] name other crates of ours.
        for line in manifest.lines() {
            let dep = line.split(['=', ' ', '.']).next().unwrap_or("").trim();
            if let Some(j) = ORDER.iter().position(|c| *c == dep) {
                assert!(j < i, "{name} depends on {dep}, which comes after it");
            }
        }
        let root = ["src/lib.rs", "src/main.rs"].iter().map(|f| dir.join(f)).find(|p| p.exists()).unwrap();
        let text = std::fs::read_to_string(&root).unwrap();
        let doc: String = text.lines().take_while(|l| l.starts_with("//!")).collect::<Vec<_>>().join(" ");
        assert!(doc.len() > 80, "{} should start with a few lines saying what the crate owns", root.display());
    }
}

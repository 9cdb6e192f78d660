//! No two source files depend on each other, directly or around a circle: a file of
//! `src/` names another through `super::…` or `crate::…` (test modules left out), and
//! following those names from any file never leads back to it. A module's references
//! to its ancestors (re-exports through `mod.rs`) and to its own children are the tree
//! itself and do not count.
//!
//! `cargo test --test module_graph -- --nocapture` prints every edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// `src/a/b.rs` and `src/a/b/mod.rs` → `["a", "b"]`; `src/lib.rs` → `[]`. The binaries
/// (`src/bin`) are crates of their own.
fn module_of(path: &Path) -> Option<Vec<String>> {
    let rel = path.strip_prefix(SRC).ok()?;
    if rel.starts_with("bin") {
        return None;
    }
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop()?;
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        other => parts.push(other.strip_suffix(".rs")?.to_string()),
    }
    Some(parts)
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The file's code without its test modules (everything from the first `#[cfg(test)]`
/// that opens a module, which by this crate's layout ends the file).
fn code(text: &str) -> &str {
    let mut at = 0;
    while let Some(i) = text[at..].find("#[cfg(test)]") {
        let after = text[at + i..].lines().nth(1).unwrap_or("");
        if after.contains("mod ") {
            return &text[..at + i];
        }
        at += i + 1;
    }
    text
}

/// The module paths the code names: `crate::a::b…` and `super::…::a…`, each as far as
/// identifiers go (grouped imports give each first name of the group).
fn named_paths(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for (start, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        if start > 0 && (ident(code[..start].chars().last().unwrap()) || code[..start].ends_with("::")) {
            continue; // the middle of a longer path (`super::super::`), or `$crate::`
        }
        let mut base: Vec<String> = Vec::new();
        let mut rest = &code[start..];
        if let Some(r) = rest.strip_prefix("crate::") {
            rest = r;
        } else {
            base = me.to_vec();
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
        }
        let mut heads = Vec::new();
        if let Some(group) = rest.strip_prefix('{') {
            let body = &group[..group.find('}').unwrap_or(group.len())];
            heads.extend(body.split(',').map(str::trim).filter(|s| !s.is_empty()));
        } else {
            heads.push(rest);
        }
        for head in heads {
            let mut path = base.clone();
            for seg in head.split("::") {
                let name: String = seg.chars().take_while(|&c| ident(c)).collect();
                if name.is_empty()
                    || name.len() != seg.len()
                        && !seg[name.len()..].starts_with(['{', ';', ',', ')', ' ', '(', '<', '.', '\n', '!', ']', '}'])
                {
                    if !name.is_empty() {
                        path.push(name);
                    }
                    break;
                }
                path.push(name);
            }
            out.push(path);
        }
    }
    out
}

fn edges() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut paths = Vec::new();
    files(Path::new(SRC), &mut paths);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        paths.iter().filter_map(|p| module_of(p).map(|m| (m, p.clone()))).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (me, path) in &modules {
        let text = fs::read_to_string(path).unwrap();
        // (comments name modules too: only code counts)
        let text: String =
            code(&text).lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
        let deps = graph.entry(me.clone()).or_default();
        for named in named_paths(&text, me) {
            // the longest prefix that is a file of its own
            let Some(target) = (0..=named.len()).rev().map(|n| named[..n].to_vec()).find(|m| modules.contains_key(m))
            else {
                continue;
            };
            let related = target.starts_with(me) || me.starts_with(&target);
            if !related {
                deps.insert(target);
            }
        }
    }
    graph
}

/// A circle through `from`, if there is one.
fn circle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>, from: &Vec<String>) -> Option<Vec<Vec<String>>> {
    fn walk(
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        at: &Vec<String>,
        goal: &Vec<String>,
        trail: &mut Vec<Vec<String>>,
        seen: &mut BTreeSet<Vec<String>>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == goal {
                return true;
            }
            if seen.insert(next.clone()) {
                trail.push(next.clone());
                if walk(graph, next, goal, trail, seen) {
                    return true;
                }
                trail.pop();
            }
        }
        false
    }
    let mut trail = vec![from.clone()];
    walk(graph, from, from, &mut trail, &mut BTreeSet::new()).then_some(trail)
}

#[test]
fn paths_are_read_as_written() {
    let me: Vec<String> = ["transport", "connection"].map(String::from).to_vec();
    let got = named_paths("use super::{live, shared_cqs::drain};\nlet x = crate::verbs::Endpoint::new();", &me);
    let want: Vec<Vec<String>> = vec![
        vec!["verbs".into(), "Endpoint".into(), "new".into()],
        vec!["transport".into(), "live".into()],
        vec!["transport".into(), "shared_cqs".into(), "drain".into()],
    ];
    assert_eq!(got, want);
}

#[test]
fn no_source_files_depend_on_each_other_in_a_circle() {
    let graph = edges();
    assert!(graph.len() > 40, "only {} modules found", graph.len());
    assert!(
        graph[&vec!["transport".to_string(), "listener".to_string()]]
            .contains(&vec!["transport".to_string(), "connection".to_string()]),
        "the scan misses listener.rs's use of connection.rs"
    );
    for (m, deps) in &graph {
        println!("{} -> {}", m.join("::"), deps.iter().map(|d| d.join("::")).collect::<Vec<_>>().join(", "));
    }
    let circles: Vec<String> = graph
        .keys()
        .filter_map(|m| circle(&graph, m))
        .map(|c| c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(" -> "))
        .collect();
    assert!(circles.is_empty(), "files that depend on each other:\n{}", circles.join("\n"));
}

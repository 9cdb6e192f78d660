//! Every "docs/FILE.md §N" that the code, the scripts or the documentation cite names a
//! heading that exists ("## §N ..." or "### §N ..." in that file), so that a citation
//! next to the code that implements a rule always leads to the rule.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The files that may cite: sources, tests, scripts, packaging and the documents.
fn citing_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for top in ["src", "tests", "testbed", "packaging", "docs", "README.md", "runtest-rdma", "build.rs", "Cargo.toml"] {
        walk(&Path::new(ROOT).join(top), &mut out);
    }
    out
}

fn walk(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        // (measurements are dated records: they cite the documents as they were)
        if p.ends_with("measurements") {
            return;
        }
        for e in fs::read_dir(p).unwrap() {
            walk(&e.unwrap().path(), out);
        }
    } else if p.is_file() {
        out.push(p.to_path_buf());
    }
}

/// The section numbers a document has: "§4.3" of "### §4.3 Re-registration".
fn sections(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.trim_start_matches('#').trim().strip_prefix('§'))
        .map(|rest| rest.split_whitespace().next().unwrap_or("").trim_end_matches('.').to_string())
        .collect()
}

/// (document, section) for each citation in `text`: "docs/protocol.md §1, §4.3" and
/// "docs/protocol.md §1 and §6" cite two sections.
fn citations(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("docs/") {
        rest = &rest[at..];
        let doc_end = rest.find(".md").map(|i| i + 3);
        let Some(doc_end) =
            doc_end.filter(|&e| rest[..e].chars().all(|c| c.is_ascii_alphanumeric() || "/_-.".contains(c)))
        else {
            rest = &rest[5..];
            continue;
        };
        let doc = rest[..doc_end].to_string();
        let mut tail = &rest[doc_end..];
        let mut first = true;
        loop {
            let sep = if first { " §" } else { ", §" };
            let tail2 = tail.strip_prefix(sep).or_else(|| (!first).then(|| tail.strip_prefix(" and §")).flatten());
            let Some(t) = tail2 else { break };
            let n: String = t.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            let n = n.trim_end_matches('.').to_string();
            if n.is_empty() {
                break;
            }
            tail = &t[n.len()..];
            out.push((doc.clone(), n));
            first = false;
        }
        rest = &rest[doc_end..];
    }
    out
}

#[test]
fn citations_are_parsed_as_written() {
    assert_eq!(
        citations("see docs/protocol.md §1, §4.3 and docs/server-abi.md §4.1 and §6. docs/x.md"),
        vec![
            ("docs/protocol.md".to_string(), "1".to_string()),
            ("docs/protocol.md".to_string(), "4.3".to_string()),
            ("docs/server-abi.md".to_string(), "4.1".to_string()),
            ("docs/server-abi.md".to_string(), "6".to_string()),
        ]
    );
    assert_eq!(sections("# T\n## §4 Data\n### §4.3 Re-registration\ntext §9\n"), ["4", "4.3"].map(String::from).into());
}

#[test]
fn every_cited_section_exists() {
    let mut checked = 0;
    let mut missing = Vec::new();
    for file in citing_files() {
        let Ok(text) = fs::read_to_string(&file) else { continue };
        for (doc, section) in citations(&text) {
            let path = Path::new(ROOT).join(&doc);
            let found = fs::read_to_string(&path).map(|d| sections(&d).contains(&section)).unwrap_or(false);
            if !found {
                missing.push(format!("{}: {doc} §{section}", file.strip_prefix(ROOT).unwrap().display()));
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} citations found: is the scan looking in the right places?");
    assert!(missing.is_empty(), "citations of sections that do not exist:\n{}", missing.join("\n"));
}

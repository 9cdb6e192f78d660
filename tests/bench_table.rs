//! The README's benchmark table is the output of `tests/e2e/bench_table.py` over the raw
//! files of the run it cites, line for line: a table edited by hand, or raw files that no
//! longer give it, fail here.

use std::path::Path;
use std::process::Command;

/// Marks the table in README.md: `<!-- bench-table: docs/measurements/FOLDER -->`,
/// followed by the table.
const MARKER: &str = "<!-- bench-table: ";

#[test]
fn readme_table_is_the_output_of_bench_table_over_its_raw_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let at = readme.find(MARKER).expect("README.md has no `<!-- bench-table: FOLDER -->` marker");
    let rest = &readme[at + MARKER.len()..];
    let (folder, after) = rest.split_once(" -->").expect("the marker is not closed");
    assert!(root.join(folder).join("summary.md").exists(), "{folder}: no summary.md (bench.sh writes it)");

    let out = Command::new("python3")
        .arg(root.join("tests/e2e/bench_table.py"))
        .arg(root.join(folder))
        .output()
        .expect("python3 runs tests/e2e/bench_table.py");
    assert!(out.status.success(), "bench_table.py: {}", String::from_utf8_lossy(&out.stderr));
    let generated = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = generated.lines().collect();
    assert!(rows.len() >= 10, "a full run gives at least ten rows, got:\n{generated}");

    let in_readme: Vec<&str> = after.trim_start_matches('\n').lines().take(rows.len()).collect();
    assert_eq!(in_readme, rows, "README.md's table differs from bench_table.py over {folder}");
    // the committed summary.md opens with the same table: what bench.sh wrote in that run
    // (then, after a blank line, the instruction counts where the run made them)
    let committed = std::fs::read_to_string(root.join(folder).join("summary.md")).unwrap();
    let table = committed.split("\n\n").next().unwrap_or_default();
    assert_eq!(table.trim_end(), generated.trim_end(), "{folder}/summary.md differs");
}

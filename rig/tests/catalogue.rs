//! The scenario catalogue and its snapshots stay one-to-one: an empty fixture folder is an
//! error (the scenario test would silently run nothing), and every snapshot belongs to a scenario file.

use std::path::{Path, PathBuf};

fn files_under(folder: &Path, extension: &str, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(folder).expect("readable folder") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            files_under(&path, extension, found);
        } else if path.extension().is_some_and(|e| e == extension) {
            found.push(path);
        }
    }
}

fn stems(root: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    files_under(root, extension, &mut files);
    let mut stems: Vec<PathBuf> = files.iter().map(|f| f.strip_prefix(root).unwrap().with_extension("")).collect();
    stems.sort();
    stems
}

#[test]
fn every_scenario_has_its_snapshot_and_every_snapshot_its_scenario() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let scenarios = stems(&workspace.join("scenarios"), "toml");
    assert!(!scenarios.is_empty(), "no scenario files under scenarios/: the scenario test would run nothing");
    let snapshots = stems(&workspace.join("snapshots"), "snap");
    assert_eq!(scenarios, snapshots, "scenarios/ and snapshots/ must pair up by path and stem");
}

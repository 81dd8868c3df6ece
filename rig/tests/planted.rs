//! The planted bugs (issue 39, item 4) and their list stay each other's: every switch
//! `planted!("<id>")` in the code of this repository is listed once in `.cargo/planted.toml`, every
//! listed bug has its switch, each says which binary judges it (a switch in the small harness is
//! judged by the small harness's binary). `.ci/planted` (`just planted`) reads the list to measure them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

struct Listed {
    harness: String,
    class: String,
    what: String,
}

fn listed() -> BTreeMap<String, Listed> {
    let path = repository().join(".cargo/planted.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table: toml::Table = text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut bugs = BTreeMap::new();
    for bug in table["bug"].as_array().expect("[[bug]] entries") {
        let field = |name: &str| bug.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        let id = field("id");
        let entry = Listed { harness: field("harness"), class: field("class"), what: field("what") };
        assert!(bugs.insert(id.clone(), entry).is_none(), "{id} is listed twice in .cargo/planted.toml");
    }
    bugs
}

/// Each switch in the code: its id and the files it is in (doc comments left out: their
/// examples are not switches).
fn switches() -> BTreeMap<String, BTreeSet<String>> {
    let root = repository();
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for folder in ["rig/src", "rig/small-harness/src", "rig/second-harness/src", "rig/example-harness/src"] {
        for entry in walkdir::WalkDir::new(root.join(folder)).sort_by_file_name() {
            let entry = entry.expect("a readable source tree");
            if entry.path().extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).expect("a source file");
            let file = entry.path().strip_prefix(&root).expect("under the root").display().to_string();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                let mut rest = line;
                while let Some(at) = rest.find("planted!(\"") {
                    rest = &rest[at + "planted!(\"".len()..];
                    let id = &rest[..rest.find('"').expect("a closing quote")];
                    found.entry(id.to_string()).or_default().insert(file.clone());
                }
            }
        }
    }
    found
}

#[test]
fn every_switch_is_listed_and_every_listed_bug_has_its_switch() {
    let listed = listed();
    let switches = switches();
    let unlisted: Vec<_> = switches.keys().filter(|id| !listed.contains_key(*id)).collect();
    let missing: Vec<_> = listed.keys().filter(|id| !switches.contains_key(*id)).collect();
    assert!(unlisted.is_empty(), "switches not in .cargo/planted.toml: {unlisted:?}");
    assert!(missing.is_empty(), "listed bugs without a switch in the code: {missing:?}");
    assert!(listed.len() >= 50, "the set the issue asks for: at least 40 in the rig and 10 in another harness");
}

#[test]
fn each_bug_is_judged_by_the_binary_of_the_code_it_is_in() {
    for (id, files) in switches() {
        let bug = &listed()[&id];
        let expected = if files.iter().all(|f| f.starts_with("rig/small-harness/")) {
            "small-harness"
        } else if files.iter().all(|f| f.starts_with("rig/second-harness/")) {
            "second-harness"
        } else if files.iter().all(|f| f.starts_with("rig/src/")) {
            "rig"
        } else {
            panic!("{id} is switched in several crates: {files:?}")
        };
        assert_eq!(bug.harness, expected, "{id} (in {files:?})");
        assert!(!bug.class.is_empty() && !bug.what.is_empty(), "{id} says its class and what it is");
    }
    let small = listed().values().filter(|b| b.harness != "rig").count();
    assert!(small >= 10, "at least 10 bugs in a harness that is not the reference: {small}");
}

//! The rig's modules import one another without a loop: each module is understood from the ones
//! below it. Read from the source (`crate::module` paths outside test code), so a new import that
//! closes a loop fails here, naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level module of every source file, and the modules it imports.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    for file in &files {
        let relative = file.strip_prefix(src).unwrap();
        let top =
            relative.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" || relative.ends_with("tests.rs") {
            continue;
        }
        let source = std::fs::read_to_string(file).unwrap();
        let code = source.split("#[cfg(test)]").next().unwrap_or("");
        let used = modules.entry(top.clone()).or_default();
        for piece in code.split("crate::").skip(1) {
            let name: String = piece.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !name.is_empty() && name != top {
                used.insert(name);
            }
        }
    }
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    modules.values_mut().for_each(|used| used.retain(|m| known.contains(m)));
    modules
}

fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(module) = stack.pop() {
        for next in &graph[&module] {
            if next == to {
                return true;
            }
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    false
}

#[test]
fn modules_import_each_other_without_a_loop() {
    let graph = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 10, "the source tree was read: {graph:?}");
    let loops: Vec<String> = graph
        .iter()
        .flat_map(|(module, used)| used.iter().map(move |u| (module, u)))
        .filter(|(module, used)| reaches(&graph, used, module))
        .map(|(module, used)| format!("{module} -> {used} -> ... -> {module}"))
        .collect();
    assert!(loops.is_empty(), "module import loops: {loops:#?}");
}

//! The manual stays navigable: every relative link in the README and in `rig/docs/` names a file
//! that exists, and every `#anchor` a heading of that file (as GitHub renders anchors).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The manual's pages: the README, every page under `rig/docs/`, and the proxy's README.
fn pages() -> Vec<PathBuf> {
    let root = workspace();
    let mut pages = vec![root.join("README.md"), root.join("proxy/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("rig/docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation other than `-`/`_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut anchors = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with('#') {
            anchors.insert(anchor(line.trim_start_matches('#')));
        }
    }
    anchors
}

/// Every `](target)` outside code blocks that is not a URL.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut links = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                links.push(target.to_string());
            }
            rest = &after[end..];
        }
    }
    links
}

#[test]
fn every_link_in_the_manual_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            if !target.exists() {
                broken.push(format!("{}: `{link}`: no such file", page.display()));
                continue;
            }
            if !fragment.is_empty() {
                let target_text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!("{}: `{link}`: no heading with that anchor", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links in the manual:\n{}", broken.join("\n"));
}

#[test]
fn every_page_of_the_manual_is_linked_from_the_readme() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let linked: BTreeSet<String> =
        links(&readme).into_iter().map(|l| l.split('#').next().unwrap().to_string()).collect();
    let unlinked: Vec<String> = pages()
        .iter()
        .filter_map(|p| p.strip_prefix(workspace()).ok().map(|p| p.display().to_string()))
        .filter(|p| p != "README.md" && !linked.contains(p))
        .collect();
    assert!(unlinked.is_empty(), "pages the README does not link: {unlinked:?}");
}

#[test]
fn the_capability_table_lists_every_capability_with_its_functions() {
    let page = std::fs::read_to_string(workspace().join("rig/docs/your-harness.md")).unwrap();
    let mut missing = Vec::new();
    for capability in rig::Capability::ALL {
        let functions: Vec<String> = capability.functions().iter().map(|f| format!("`{f}`")).collect();
        let served = if functions.is_empty() { String::new() } else { format!(" {}", functions.join(", ")) };
        let row = format!("| `{}` |{served} |", capability.name());
        if !page.lines().any(|line| line.starts_with(&row)) {
            missing.push(row);
        }
    }
    assert!(missing.is_empty(), "rig/docs/your-harness.md lacks the rows {missing:#?}");
}

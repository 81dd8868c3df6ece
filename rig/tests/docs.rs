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

/// Every function of a world with every optional part (tickets with lookup, a queue, a second
/// harness worker, a declared service `name`, which the manual calls `NAME`), as the rig lists them when a step names none of
/// them.
fn world_functions() -> BTreeSet<String> {
    let source = r#"
[world]
replacement = true
[world.tickets]
lookup = true
[world.queue.q]
[world.service.name]
effect = "effect"
[world.config]
production = "v1"
[world.config.versions.v1]
system_prompt = ""
tools = []
[[step]]
invoke = { function = "no::such" }
[policy.reference]
"#;
    let error = rig::Scenario::parse(Path::new("full-world.toml"), source).expect_err("`no::such` is unknown");
    let listed = error.message.split("expected one of ").nth(1).unwrap_or_else(|| panic!("{error}"));
    listed.split(", ").map(|f| f.trim_end_matches(|c: char| !c.is_alphanumeric()).to_string()).collect()
}

/// What may name a function: inline code outside code blocks, and quoted strings inside them
/// (`function = "ticket::create"`).
fn named_functions(text: &str) -> Vec<&str> {
    let mut in_code = false;
    let mut named = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let quote = if in_code { '"' } else { '`' };
        named.extend(line.split(quote).skip(1).step_by(2).filter(|q| q.contains("::")));
    }
    named
}

/// The manual names functions as the world spells them: `ticket::create`, not `tickets::...`.
/// Each backticked `NS::...` names a namespace of the world's functions, a harness host (or
/// `{host}`), or a Rust path; a function of the rig's doubles named in full must exist.
#[test]
fn every_function_the_manual_names_is_one_the_world_has() {
    let functions = world_functions();
    assert!(functions.contains("ticket::create") && functions.contains("state::get"), "{functions:?}");
    let namespaces: BTreeSet<&str> = functions.iter().filter_map(|f| f.split_once("::").map(|(ns, _)| ns)).collect();
    // Harness hosts serve what their harness implements; `rig::` is both the rig's own live
    // functions and the crate; the rest are Rust paths of the examples.
    let not_checked = ["{host}", "harness", "replacement", "rig", "proxy", "tokio", "naive_harness"];
    let mut wrong = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for quoted in named_functions(&text) {
            let Some((namespace, rest)) = quoted.split_once("::") else { continue };
            let namespace = if namespace == "NAME" { "name" } else { namespace };
            let is_type = namespace.starts_with(|c: char| c.is_ascii_uppercase());
            if is_type || not_checked.contains(&namespace) || quoted.contains(' ') && !rest.contains('{') {
                continue;
            }
            if !namespaces.contains(namespace) {
                wrong.push(format!(
                    "{}: `{quoted}`: no function of the world is named `{namespace}::...`",
                    page.display()
                ));
                continue;
            }
            let named = rest.split_whitespace().next().unwrap_or_default();
            for name in named.split(['/', '|']).filter(|n| !n.is_empty() && *n != "...") {
                if !functions.contains(&format!("{namespace}::{name}")) {
                    wrong.push(format!(
                        "{}: `{quoted}`: the world has no function `{namespace}::{name}`",
                        page.display()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "functions the manual names wrongly:\n{}", wrong.join("\n"));
}

//! The workspace's profile, for a crate built outside it on the rig by path (`fresh_crate.rs`,
//! `bisect.rs`), which shares the workspace's target directory so that the dependencies are the
//! workspace's own builds. A setting that differs (an opt-level, the debug info) builds every
//! dependency again beside them: minutes of compiling and a gigabyte of disk. So the settings are
//! read from the workspace's `Cargo.toml`, never kept by hand.

use std::path::Path;
use std::process::Command;

/// The workspace's settings of `profile` (`"dev"` or `"release"`) as dotted `profile.…=value`
/// keys, for `cargo --config` or a manifest's `[profile]` table. Outside the workspace the rig's
/// crates are no longer members, so what a `"*"` override sets is given back to them by name, at
/// the profile's own value, as the workspace builds its members.
pub fn settings(workspace: &Path, profile: &str) -> Vec<String> {
    let manifest: toml::Table = std::fs::read_to_string(workspace.join("Cargo.toml")).unwrap().parse().unwrap();
    // Every member, those a path dependency makes one (the vendored turmoil) included.
    let metadata = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--offline", "--format-version", "1"])
        .current_dir(workspace)
        .output()
        .unwrap();
    assert!(metadata.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&metadata.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout).unwrap();
    let members: Vec<&str> =
        metadata["packages"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();

    let empty = toml::Table::new();
    let table = manifest.get("profile").and_then(|p| p.get(profile)).and_then(|t| t.as_table()).unwrap_or(&empty);
    let mut settings = Vec::new();
    let mut everything_else = &empty;
    for (key, value) in table {
        if key == "package" {
            for (package, overrides) in value.as_table().unwrap() {
                if package == "*" {
                    everything_else = overrides.as_table().unwrap();
                }
                for (key, value) in overrides.as_table().unwrap() {
                    settings.push(format!("profile.{profile}.package.\"{package}\".{key}={value}"));
                }
            }
        } else {
            settings.push(format!("profile.{profile}.{key}={value}"));
        }
    }
    for key in everything_else.keys() {
        let value = match (table.get(key), key.as_str(), profile) {
            (Some(value), _, _) => value.to_string(),
            (None, "opt-level", "dev") => "0".into(),
            (None, "opt-level", _) => "3".into(),
            (None, "debug", "dev") => "true".into(),
            (None, "debug", _) => "false".into(),
            (None, key, _) => panic!("cargo's default of profile.{profile}.{key} is not known here"),
        };
        for member in &members {
            settings.push(format!("profile.{profile}.package.{member}.{key}={value}"));
        }
    }
    settings
}

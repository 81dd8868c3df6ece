//! The third-party packages the process-level tests run against (Python's `websockets` and
//! `iii-sdk`, node's `ws`), installed by the tests themselves under the target directory and
//! never into the user's Python, node or home: a virtual environment or an npm prefix in
//! `CARGO_TARGET_TMPDIR`, with the installers' caches and Python's bytecode beside them. The
//! user's own registry settings (`pip.conf`, `.npmrc`) still apply, so a mirror keeps working.
//!
//! Shared by the proxy's tests and `rig/tests/live.rs` (which includes this file by path).
//! Each environment is made aside and moved into place whole, so test processes running side
//! by side (nextest runs one per test) never see a half-made one. A failure to install is an
//! error naming what was run and what it said, never a skip.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where everything the tests install lives.
fn installs_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("installs")
}

/// A Python virtual environment under the target directory.
pub struct Venv {
    root: PathBuf,
}

impl Venv {
    pub fn python(&self) -> PathBuf {
        self.root.join("bin").join("python")
    }

    /// A command running the environment's Python, its bytecode cache and temporary files
    /// kept in the target dir.
    pub fn command(&self) -> Command {
        let mut command = Command::new(self.python());
        command.env("PYTHONPYCACHEPREFIX", installs_dir().join("pycache")).env("TMPDIR", temp_dir());
        command
    }

    /// The installed versions of `packages` (`NAME==VERSION`), or why they are not all there.
    fn check(&self, packages: &[&str]) -> Result<(), String> {
        let names: Vec<&str> = packages.iter().map(|p| p.split("==").next().unwrap_or(p)).collect();
        let output = self
            .command()
            .args(["-c", "import importlib.metadata as m, sys; print(*(m.version(n) for n in sys.argv[1:]))"])
            .args(&names)
            .output()
            .map_err(|e| format!("cannot run {} ({e})", self.python().display()))?;
        let found = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let wanted: Vec<&str> = packages.iter().map(|p| p.split("==").nth(1).unwrap_or("")).collect();
        if output.status.success() && found == wanted.join(" ") {
            Ok(())
        } else {
            Err(format!("found `{found}`, want {packages:?}; {}", String::from_utf8_lossy(&output.stderr)))
        }
    }
}

/// The virtual environment `name` under the target directory with `packages` (pinned,
/// `NAME==VERSION`) installed from PyPI, made when it is missing or holds other versions.
pub fn python_venv(name: &str, packages: &[&str]) -> Result<Venv, String> {
    let venv = Venv { root: installs_dir().join(name) };
    if venv.check(packages).is_ok() {
        return Ok(venv);
    }
    let aside = Venv { root: aside_of(&venv.root)? };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&aside.root).env("TMPDIR", temp_dir()),
        "python3 -m venv (python3 3.10 or later, with venv)",
    )?;
    run(
        aside
            .command()
            .args(["-m", "pip", "install", "--quiet", "--no-cache-dir", "--disable-pip-version-check"])
            .args(packages),
        &format!("pip install {}", packages.join(" ")),
    )?;
    aside.check(packages)?;
    move_into_place(&aside.root, &venv.root, || venv.check(packages).is_ok())?;
    Ok(venv)
}

/// An npm prefix `name` under the target directory with `package@version` installed from the
/// npm registry; the `node_modules` folder to put on `NODE_PATH`.
pub fn npm_prefix(name: &str, package: &str, version: &str) -> Result<PathBuf, String> {
    let prefix = installs_dir().join(name);
    let installed = |prefix: &Path| npm_version(prefix, package).as_deref() == Some(version);
    if !installed(&prefix) {
        let aside = aside_of(&prefix)?;
        run(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--no-save", "--silent", "--prefix"])
                .arg(&aside)
                .arg(format!("{package}@{version}"))
                .env("npm_config_cache", installs_dir().join("npm-cache"))
                .env("npm_config_update_notifier", "false")
                .env("TMPDIR", temp_dir()),
            &format!("npm install {package}@{version} (node and npm)"),
        )?;
        if !installed(&aside) {
            return Err(format!("npm install finished but {package} {version} is not in {}", aside.display()));
        }
        move_into_place(&aside, &prefix, || installed(&prefix))?;
    }
    Ok(prefix.join("node_modules"))
}

fn npm_version(prefix: &Path, package: &str) -> Option<String> {
    let manifest = prefix.join("node_modules").join(package).join("package.json");
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(manifest).ok()?).ok()?;
    manifest["version"].as_str().map(str::to_string)
}

/// The temporary folder for the installers and the peers (pip unpacks wheels there).
pub fn temp_dir() -> PathBuf {
    let dir = installs_dir().join("tmp");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// A fresh folder beside `target` for this process to build it in.
fn aside_of(target: &Path) -> Result<PathBuf, String> {
    let parent = target.parent().expect("under the installs folder");
    std::fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
    let aside =
        parent.join(format!(".{}.{}", target.file_name().expect("a name").to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_dir_all(&aside);
    Ok(aside)
}

/// Moves a finished `aside` to `target`, replacing a stale one; if another process got there
/// first with a good one (`good` says), keeps that one.
fn move_into_place(aside: &Path, target: &Path, good: impl Fn() -> bool) -> Result<(), String> {
    if good() {
        let _ = std::fs::remove_dir_all(aside);
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(target);
    match std::fs::rename(aside, target) {
        Ok(()) => Ok(()),
        Err(_) if good() => {
            let _ = std::fs::remove_dir_all(aside);
            Ok(())
        }
        Err(e) => Err(format!("move {} to {}: {e}", aside.display(), target.display())),
    }
}

/// Runs an installer step; its output when it fails.
fn run(command: &mut Command, what: &str) -> Result<Output, String> {
    let output = command.output().map_err(|e| format!("cannot run `{what}`: {e}"))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(format!(
            "`{what}` failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

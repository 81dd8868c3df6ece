//! Live runs that own the harness process: `rig live --spawn CMD`.
//!
//! The rig starts one process per external harness host of a run: the command, through
//! `sh -c`, in a session (and so a process group) of its own, told where the engine is (`III_URL`, which the iii
//! SDKs read) and which host it is (`RIG_HOST`). Then it does to that process what the
//! simulation does to a host: a crash is a SIGKILL of the whole group, a restart runs the
//! command again, as a supervisor would, and a pause is SIGSTOP, then SIGCONT when it ends.
//! Each start's standard output and error go to a file of its own, named in the trace.
//!
//! No process outlives its run. Each is killed (its whole group) when the run ends however it
//! ends: the supervisor's `Drop` on every return and unwinding panic (a command stopped by
//! Ctrl-C, SIGTERM or SIGHUP ends its run that way, see [`crate::interrupt`]), a panic hook for
//! the groups of the panicking thread (should the panic abort), and [`end_every_process`] for a
//! signal that ends the rig at once. Only a SIGKILL of the rig itself leaves nothing to run: the
//! trace names each process's group.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, Once};
use std::thread::ThreadId;

/// The variable naming the engine's URL, as the iii SDKs read it.
pub const URL_VARIABLE: &str = "III_URL";
/// The variable naming the harness host a process serves (`harness`, `replacement`).
pub const HOST_VARIABLE: &str = "RIG_HOST";

/// How to start the harness processes of live runs.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// A shell command line, run with `sh -c`.
    pub command: String,
    /// The folder each process start's output file goes to.
    pub logs: PathBuf,
}

/// One process the supervisor started and has not seen end.
struct Process {
    child: Child,
    log: PathBuf,
    stopped: bool,
}

/// A process that ended by itself, which a supervised harness must never do.
#[derive(Debug, Clone)]
pub struct Exit {
    pub host: String,
    pub status: String,
    pub log: PathBuf,
}

/// The harness processes of one run.
pub struct Supervisor {
    options: SpawnOptions,
    /// Names each output file after the run (`{label}.{host}.{start}.log`).
    label: String,
    /// Where each host's process connects.
    urls: BTreeMap<String, String>,
    running: BTreeMap<String, Process>,
    starts: BTreeMap<String, u32>,
}

impl Supervisor {
    pub fn new(options: SpawnOptions, label: String, urls: BTreeMap<String, String>) -> Self {
        Self { options, label, urls, running: BTreeMap::new(), starts: BTreeMap::new() }
    }

    pub fn hosts(&self) -> impl Iterator<Item = &String> {
        self.urls.keys()
    }

    /// Starts the command for `host` (a fresh process, as after a crash); its pid and log.
    pub fn start(&mut self, host: &str) -> Result<(u32, PathBuf), String> {
        self.kill(host);
        let url = self.urls.get(host).ok_or_else(|| format!("no harness host `{host}` in this run"))?.clone();
        let start = self.starts.entry(host.to_string()).or_default();
        *start += 1;
        let log = self.options.logs.join(format!("{}.{host}.{start}.log", self.label));
        let (stdout, stderr) = output_files(&log)?;
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&self.options.command)
            .env(URL_VARIABLE, &url)
            .env(HOST_VARIABLE, host)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        in_a_session_of_its_own(&mut command);
        let child = spawn_guarded(&mut command)
            .map_err(|e| format!("cannot start `{}` for `{host}`: {e}", self.options.command))?;
        let pid = child.id();
        self.running.insert(host.to_string(), Process { child, log: log.clone(), stopped: false });
        Ok((pid, log))
    }

    /// Kills `host`'s process and everything it started (SIGKILL of its group), and reaps it.
    /// Whether there was one.
    pub fn kill(&mut self, host: &str) -> bool {
        let Some(mut process) = self.running.remove(host) else { return false };
        end(&mut process.child);
        true
    }

    pub fn is_running(&self, host: &str) -> bool {
        self.running.contains_key(host)
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) `host`'s process group; whether it changed.
    pub fn set_stopped(&mut self, host: &str, stopped: bool) -> bool {
        let Some(process) = self.running.get_mut(host) else { return false };
        if process.stopped == stopped {
            return false;
        }
        process.stopped = stopped;
        signal_group(process.child.id(), if stopped { libc::SIGSTOP } else { libc::SIGCONT });
        true
    }

    /// The hosts whose process is stopped now.
    pub fn stopped(&self) -> BTreeSet<String> {
        self.running.iter().filter(|(_, p)| p.stopped).map(|(host, _)| host.clone()).collect()
    }

    /// The processes that ended by themselves since last asked; whatever they left running in
    /// their group is killed too.
    pub fn reap(&mut self) -> Vec<Exit> {
        let mut exits = Vec::new();
        for (host, process) in &mut self.running {
            if let Ok(Some(status)) = process.child.try_wait() {
                signal_group(process.child.id(), libc::SIGKILL);
                exits.push(Exit { host: host.clone(), status: describe(status), log: process.log.clone() });
            }
        }
        for exit in &exits {
            if let Some(process) = self.running.remove(&exit.host) {
                forget_group(process.child.id());
            }
        }
        exits
    }

    /// The output file of `host`'s current (or last) process start.
    pub fn log(&self, host: &str) -> Option<PathBuf> {
        let start = self.starts.get(host)?;
        Some(self.options.logs.join(format!("{}.{host}.{start}.log", self.label)))
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        for (_, mut process) in std::mem::take(&mut self.running) {
            end(&mut process.child);
        }
    }
}

/// The last lines of a process's output, for a failure that needs them.
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn output_files(log: &Path) -> Result<(File, File), String> {
    let stdout =
        File::create(log).map_err(|e| format!("cannot write the process output file {}: {e}", log.display()))?;
    let stderr = stdout.try_clone().map_err(|e| format!("cannot share {}: {e}", log.display()))?;
    Ok((stdout, stderr))
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// Kills a child's group, then reaps the child.
fn end(child: &mut Child) {
    signal_group(child.id(), libc::SIGKILL);
    let _ = child.wait();
    forget_group(child.id());
}

/// Sends `signal` to the process group `leader` leads (a process of ours, started in a group of
/// its own). A group that is gone already is not an error.
fn signal_group(leader: u32, signal: libc::c_int) {
    let Ok(group) = libc::pid_t::try_from(leader) else { return };
    // SAFETY: killpg takes two integers and touches no memory of ours.
    unsafe { libc::killpg(group, signal) };
}

/// Every process group the rig has started and not yet ended, with the thread that started it,
/// for the panic hook and the signal thread.
static GROUPS: Mutex<BTreeMap<u32, ThreadId>> = Mutex::new(BTreeMap::new());

/// Starts `command`, its group registered for the last-resort cleanups (installed on first use).
fn spawn_guarded(command: &mut Command) -> std::io::Result<Child> {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(install_cleanups);
    // Under the lock, so a signal's cleanup (which holds it until the rig exits) sees every one.
    let mut groups = GROUPS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let child = command.spawn()?;
    groups.insert(child.id(), std::thread::current().id());
    Ok(child)
}

/// Starts `command` as the leader of a session of its own, and so of a process group of its own
/// (its pid), which a crash kills whole. A session, not only a group: where the kernel shares
/// the CPU between sessions (Linux's autogroup scheduling, on by default in desktop and many
/// server kernels), the harness's own work (an interpreter loading its SDK after each restart
/// takes a second of CPU) then takes its own share rather than the rig's, whose timers the run
/// depends on; on a loaded machine that work, beside the rig's, made the rig's timers late and
/// the run void.
fn in_a_session_of_its_own(command: &mut Command) {
    // SAFETY: setsid is async-signal-safe, takes nothing and touches no memory of ours; it runs
    // in the child between fork and exec. It cannot fail there: a child just forked leads no
    // process group.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
}

fn forget_group(leader: u32) {
    GROUPS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&leader);
}

/// Kills every registered group `owned` picks by the thread that started it.
fn kill_groups(groups: &BTreeMap<u32, ThreadId>, owned: impl Fn(ThreadId) -> bool) {
    for (leader, _) in groups.iter().filter(|(_, thread)| owned(**thread)) {
        signal_group(*leader, libc::SIGKILL);
    }
}

/// The panic hook and the signal thread that end every process when the rig goes down.
fn install_cleanups() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Unwinding ends them too (each supervisor's `Drop`), but a panic may abort. Other
        // threads' runs (side by side in one process) are theirs to end.
        // Never blocks: a panic while this very thread holds the lock must not hang the hook.
        let panicking = std::thread::current().id();
        match GROUPS.try_lock() {
            Ok(groups) => kill_groups(&groups, |thread| thread == panicking),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                kill_groups(&poisoned.into_inner(), |thread| thread == panicking)
            }
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        previous(info);
    }));
    // The first process starts only once the signal handlers are in place: a Ctrl-C a moment
    // after it started must not end the rig the default way, leaving the process behind.
    crate::interrupt::before_exit(end_every_process);
    crate::interrupt::watch();
}

/// Kills every process group the rig started and has not ended, and keeps any more from
/// starting: for a signal that ends the rig at once ([`crate::interrupt`]).
fn end_every_process() {
    let groups = GROUPS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    kill_groups(&groups, |_| true);
    // Held until the process exits: nothing starts after this.
    std::mem::forget(groups);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Whether `pid` is gone or a zombie, within a few seconds of being killed.
    fn gone(pid: u32) -> bool {
        let dead = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
        };
        let started = Instant::now();
        while !dead() && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        dead()
    }

    #[test]
    fn a_run_that_panics_leaves_no_process_of_its_own_behind() {
        let logs = std::env::temp_dir().join(format!("rig-spawn-test-{}", std::process::id()));
        std::fs::create_dir_all(&logs).expect("a scratch folder");
        let child_pid = logs.join("child.pid");
        // A command with a child of its own, which outlives it unless its whole group is killed.
        let command = format!("sleep 600 & echo $! > {}; sleep 600", child_pid.display());
        let options = SpawnOptions { command, logs: logs.clone() };
        let (sender, started) = std::sync::mpsc::channel();
        let run = std::thread::spawn(move || {
            let urls = BTreeMap::from([("harness".to_string(), "ws://127.0.0.1:1/".to_string())]);
            let mut supervisor = Supervisor::new(options, "panics".into(), urls);
            let (pid, _) = supervisor.start("harness").expect("sh starts");
            // The shell creates the file before `echo` writes into it: under load the run could
            // panic (and its group die) in between, leaving an empty file. Wait for the whole line.
            let written = || std::fs::read_to_string(&child_pid).is_ok_and(|text| text.ends_with('\n'));
            let deadline = Instant::now() + Duration::from_secs(30);
            while !written() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            sender.send(pid).expect("the test waits");
            panic!("a bug in the rig, mid-run");
        });
        assert!(run.join().is_err(), "the run panicked");
        let leader = started.recv().expect("the process started");
        let child: u32 = std::fs::read_to_string(logs.join("child.pid"))
            .expect("the command wrote its child's pid")
            .trim()
            .parse()
            .expect("a pid");
        assert!(gone(leader) && gone(child), "a process outlived the panicking run ({leader}, {child})");
        let _ = std::fs::remove_dir_all(&logs);
    }
}

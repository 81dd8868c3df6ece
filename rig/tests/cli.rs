//! The command-line contract other tools rely on: exit codes, error locations, JSON fields,
//! and the README's annotated example staying a valid, passing scenario.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn rig(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rig")).args(args).output().expect("the rig binary runs")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("rig sits in the workspace").to_path_buf()
}

/// A scratch file under the target directory, unique per test.
fn scratch(name: &str, text: &str) -> PathBuf {
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&folder).expect("scratch folder");
    let path = folder.join(name);
    std::fs::write(&path, text).expect("scratch file");
    path
}

#[test]
fn bad_input_exits_2_naming_file_line_and_column() {
    let path = scratch("unknown-key.toml", "[world]\nsession_timeout_ms = 300\nbogus = 1\n[policy.reference]\n");
    let out = rig(&["run", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown-key.toml:3:1"), "{stderr}");
    assert!(stderr.contains("bogus"), "{stderr}");
    let missing = rig(&["run", "no/such/file.toml"]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn a_failing_run_exits_1_with_its_failures_and_a_repro_line() {
    // The released binary's behaviour, expected of the reference policy: it must fail.
    let source =
        std::fs::read_to_string(workspace().join("scenarios/incident-001/finalization/write-timeout.toml")).unwrap();
    let swapped = source
        .replace("[policy.reference]", "[policy.ignored]")
        .replace("[policy.swallow]", "[policy.reference]")
        .replace("[policy.ignored]", "[policy.swallow]");
    let path = scratch("swapped.toml", &swapped);
    let out = rig(&["run", path.to_str().unwrap(), "--policy", "reference", "--seed", "3"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("FAIL"), "{stdout}");
    assert!(stdout.contains("oracle `liveness` was expected to fire"), "{stdout}");
    assert!(stdout.contains("--policy reference --seed 3"), "the repro line names policy and seed: {stdout}");
}

#[test]
fn json_lines_carry_the_documented_fields() {
    let scenario = workspace().join("scenarios/smoke/healthy-turn.toml");
    let out = rig(&["run", scenario.to_str().unwrap(), "--seeds", "0..2", "--json", "--policy", "reference"]);
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "one line per seed");
    for field in [
        "scenario",
        "policy",
        "seed",
        "passed",
        "trace_hash",
        "sim_ms",
        "wall_us",
        "effects",
        "violations",
        "expected_violations",
        "failures",
        "repro",
        "unresolved",
    ] {
        assert!(lines[0].get(field).is_some(), "missing `{field}` in {}", lines[0]);
    }
    assert_eq!(lines[1]["seed"], 1);
}

#[test]
fn the_readme_example_is_a_valid_passing_scenario() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let start = readme.find("```toml\n").expect("the README has a TOML example") + "```toml\n".len();
    let end = start + readme[start..].find("```").expect("the example ends");
    let path = scratch("readme-example.toml", &readme[start..end]);
    let out = rig(&["run", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn matrix_shards_partition_the_runs_and_junit_names_failures() {
    let smoke = workspace().join("scenarios/smoke/healthy-turn.toml");
    let count = |shard: &str| {
        let out = rig(&["matrix", smoke.to_str().unwrap(), "--seeds", "0..7", "--shard", shard]);
        assert_eq!(out.status.code(), Some(0));
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let passed: u64 =
            stdout.split(": ").nth(1).and_then(|s| s.split(' ').next()).and_then(|n| n.parse().ok()).expect(&stdout);
        passed
    };
    // Three policies times seven seeds, dealt to two shards.
    assert_eq!(count("1/2") + count("2/2"), 21);

    let path = failing_scenario("matrix-swapped.toml");
    let junit = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/junit.xml");
    let out = rig(&[
        "matrix",
        path.to_str().unwrap(),
        "--seeds",
        "3..6",
        "--policy",
        "reference",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("3 of 3 seeds failed; lowest seed 3"), "{stdout}");
    let xml = std::fs::read_to_string(junit).unwrap();
    assert!(xml.contains("failures=\"1\"") && xml.contains("--policy reference --seed 3"), "{xml}");
}

#[test]
fn a_policy_no_scenario_declares_is_bad_input_not_zero_runs() {
    let smoke = workspace().join("scenarios/smoke/healthy-turn.toml");
    for command in ["run", "matrix"] {
        let out = rig(&[command, smoke.to_str().unwrap(), "--policy", "no-fencing", "--seeds", "0..2"]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("declares policy `no-fencing`"), "{command}: {stderr}");
    }
}

#[test]
fn closed_output_streams_never_panic() {
    use std::process::Stdio;
    let bad = scratch("closed-stderr.toml", "[world]\nbogus = 1\n[policy.reference]\n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rig"))
        .args(["run", bad.to_str().unwrap()])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    assert_eq!(child.wait().unwrap().code(), Some(2), "closed stderr: still bad input, not a panic");
}

/// Standard output opened on `/dev/full`: every write fails with "no space left on device".
fn full_disk() -> std::process::Stdio {
    std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full").into()
}

#[test]
fn every_lost_output_is_exit_2_with_a_message() {
    let smoke = workspace().join("scenarios/smoke/healthy-turn.toml");
    let smoke = smoke.to_str().unwrap();
    let cases: [(&[&str], bool); 5] = [
        (&["run", smoke, "--trace", "/dev/full"], false),
        (&["run", smoke, "--trace", "-"], true),
        (&["run", smoke, "--json"], true),
        (&["run", smoke], true),
        (&["matrix", smoke, "--seeds", "0..3"], true),
    ];
    for (args, to_full_stdout) in cases {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rig"));
        command.args(args);
        if to_full_stdout {
            command.stdout(full_disk());
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} (stdout on /dev/full: {to_full_stdout}): {stderr}");
        let named = if to_full_stdout { "cannot write to standard output" } else { "cannot write the trace file" };
        assert!(stderr.contains(named) && stderr.contains("No space left"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_closed_pipe_stops_the_runs_quietly_and_does_not_exit_0() {
    use std::io::BufRead;
    use std::process::Stdio;
    let smoke = workspace().join("scenarios/smoke/healthy-turn.toml");
    // As `rig run ... --seeds 0..5000 | head -1`: three policies, 15,000 runs, one line read.
    let trace = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/closed-pipe.trace.jsonl");
    std::fs::create_dir_all(trace.parent().unwrap()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rig"))
        .args(["run", smoke.to_str().unwrap(), "--seeds", "0..5000", "--jobs", "1"])
        .args(["--trace", trace.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("PASS"), "{first}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(141), "closed stdout: as a program ended by SIGPIPE, not 0");
    assert!(out.stderr.is_empty(), "quietly: {}", String::from_utf8_lossy(&out.stderr));
    let runs_traced: std::collections::BTreeSet<(String, u64)> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            (line["policy"].as_str().unwrap().to_string(), line["seed"].as_u64().unwrap())
        })
        .collect();
    assert!(runs_traced.len() < 15_000, "the runs stopped when the reader went away: {} ran", runs_traced.len());
}

#[test]
fn a_sweep_budget_of_0_is_refused() {
    let workload = workspace().join("scenarios/workloads/multi-round.toml");
    let out = rig(&["sweep", workload.to_str().unwrap(), "--budget", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("would sweep nothing"), "{out:?}");
    assert!(out.stdout.is_empty());
}

#[test]
fn the_sweep_wall_time_is_elapsed_time_not_the_sum_of_the_runs() {
    // Four workers on a two-core machine: each run's own wall time includes the time it waited
    // for a core, so their sum is well above the time that passed. Elapsed time cannot be more
    // than the whole process took.
    let workload = workspace().join("scenarios/workloads/multi-round.toml");
    let started = std::time::Instant::now();
    let out = rig(&["sweep", workload.to_str().unwrap(), "--jobs", "4"]);
    let process_s = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.contains("s of wall time")).unwrap_or_else(|| panic!("{stdout}"));
    let printed: f64 = line.split(" runs in ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!(printed <= process_s, "`{line}`, but the whole sweep took {process_s:.2} s");
}

#[test]
fn a_symlink_loop_is_reported_once() {
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/looping");
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(workspace().join("scenarios/smoke/healthy-turn.toml"), folder.join("smoke.toml")).unwrap();
    std::os::unix::fs::symlink(&folder, folder.join("again")).unwrap();
    let out = rig(&["run", folder.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("loops back").count(), 1, "{stderr}");
}

#[test]
fn a_trace_to_dash_goes_to_standard_output() {
    let smoke = workspace().join("scenarios/smoke/healthy-turn.toml");
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/dash");
    std::fs::create_dir_all(&folder).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rig"))
        .current_dir(&folder)
        .args(["run", smoke.to_str().unwrap(), "--policy", "reference", "--trace", "-"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().any(|l| l.starts_with("{\"scenario\":") && l.contains("\"event\":")), "{stdout}");
    assert!(!folder.join("-").exists(), "no file named `-`");
}

#[test]
fn a_cut_that_never_fires_fails_the_run_unless_optional() {
    let source = std::fs::read_to_string(workspace().join("scenarios/smoke/healthy-turn.toml")).unwrap();
    let vacuous = format!("{source}\n[[cut]]\nfunction = \"state::delete\"\naction = \"timeout\"\n");
    let out = rig(&["run", scratch("vacuous.toml", &vacuous).to_str().unwrap(), "--policy", "reference"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cut #1 (timeout on state::delete) never fired"), "{stdout}");
    let optional = format!("{vacuous}optional = true\n");
    let out = rig(&["run", scratch("optional.toml", &optional).to_str().unwrap(), "--policy", "reference"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

/// The write-timeout scenario with its reference policy expecting an oracle that never fires:
/// every seed fails, deterministically.
fn failing_scenario(name: &str) -> PathBuf {
    let source =
        std::fs::read_to_string(workspace().join("scenarios/incident-001/finalization/write-timeout.toml")).unwrap();
    scratch(name, &source.replace("[policy.reference]\n", "[policy.reference]\nviolations = [\"liveness\"]\n"))
}

#[test]
fn jobs_change_neither_the_output_order_nor_a_trace_hash() {
    let finalization = workspace().join("scenarios/incident-001/finalization");
    let without_wall_time = |out: Output| -> Vec<serde_json::Value> {
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let mut line: serde_json::Value = serde_json::from_str(l).unwrap();
                line.as_object_mut().unwrap().remove("wall_us");
                line
            })
            .collect()
    };
    let run = |jobs: &str| rig(&["run", finalization.to_str().unwrap(), "--seeds", "0..3", "--json", "--jobs", jobs]);
    let one = without_wall_time(run("1"));
    assert!(one.len() > 20, "{} runs", one.len());
    assert_eq!(one, without_wall_time(run("3")));

    let smoke = workspace().join("scenarios/smoke");
    let failing = failing_scenario("jobs-failing.toml");
    let matrix = |jobs: &str| {
        let out = rig(&[
            "matrix",
            smoke.to_str().unwrap(),
            failing.to_str().unwrap(),
            "--seeds",
            "0..5",
            "--shard",
            "2/3",
            "--jobs",
            jobs,
        ]);
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let one = matrix("1");
    assert!(one.contains("runs digest"), "{one}");
    assert_eq!(one, matrix("4"), "same summary, same lowest seeds, same digest of every trace hash");
}

#[test]
fn failures_only_prints_the_failing_runs_and_the_summary() {
    // Three policies, of which only `reference` fails, every seed.
    let failing = failing_scenario("failures-only.toml");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", failing.to_str().unwrap(), "--seeds", "0..3"];
        args.extend(extra);
        let out = rig(&args);
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let everything = run(&[]);
    assert!(everything.lines().any(|l| l.starts_with("PASS ")), "{everything}");
    for flag in ["-q", "--failures-only"] {
        let failures = run(&[flag]);
        let reports: Vec<&str> = failures.lines().filter(|l| !l.starts_with(' ')).collect();
        assert_eq!(reports.len(), 4, "three failing runs and the summary: {failures}");
        assert!(reports[..3].iter().all(|l| l.starts_with("FAIL ") && l.contains("[reference]")), "{failures}");
        assert_eq!(reports[3], "6 passed, 3 failed, 0 skipped (harness reference)");
    }
    let json = run(&["--json", "-q"]);
    let lines: Vec<serde_json::Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{json}");
    assert!(lines.iter().all(|l| l["passed"] == false));
}

#[test]
fn a_failing_matrix_pair_is_printed_once_with_its_failing_seeds() {
    let failing = failing_scenario("matrix-once.toml");
    let matrix = |extra: &[&str]| {
        let mut args = vec!["matrix", failing.to_str().unwrap(), "--seeds", "0..6", "--jobs", "2"];
        args.extend(extra);
        let out = rig(&args);
        assert_eq!(out.status.code(), Some(1));
        (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (stdout, stderr) = matrix(&[]);
    assert_eq!(stderr.matches("FAIL ").count(), 1, "one line as it fails, not one per seed: {stderr}");
    assert_eq!(stdout.matches("FAIL ").count(), 1, "{stdout}");
    assert!(stdout.contains("6 of 6 seeds failed; lowest seed 0\n    failing seeds: 0, 1, 2, 3, 4, 5\n"), "{stdout}");
    let (quiet, stderr) = matrix(&["-q"]);
    assert!(!stderr.contains("FAIL "), "{stderr}");
    assert!(!quiet.contains("--out DIR"), "{quiet}");
    assert!(quiet.contains("failing seeds: 0, 1, 2, 3, 4, 5") && quiet.contains("shard 1/1: 12 passed, 6 failed"));
}

#[test]
fn sweep_and_explore_find_the_same_things_on_any_number_of_jobs() {
    let workload = workspace().join("scenarios/workloads/multi-round.toml");
    let without_wall_time = |out: Output| -> String {
        assert_eq!(out.status.code(), Some(1), "a known-bad policy is found: {}", String::from_utf8_lossy(&out.stderr));
        // The only line that may differ is the sweep's wall-time total.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.contains("s of wall time"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let sweep = |jobs: &str| rig(&["sweep", workload.to_str().unwrap(), "--policy", "swallow", "--jobs", jobs]);
    let one = without_wall_time(sweep("1"));
    assert!(one.contains("finding `liveness`"), "{one}");
    assert_eq!(one, without_wall_time(sweep("3")));

    // The swarm's seeds each on their own; a guided exploration's runs in batches drawn from
    // what the batches before found, the same for any number of jobs.
    for (mode, seeds) in [("swarm", "0..12"), ("guided", "0..40")] {
        let explore = |jobs: &str| {
            let args = ["--policy", "unguarded", "--mode", mode, "--seeds", seeds, "--jobs", jobs];
            rig(&[&["explore", workload.to_str().unwrap()][..], &args[..]].concat())
        };
        let one = without_wall_time(explore("1"));
        assert!(one.contains("shrunk to") && one.contains("abstract states"), "{mode}: {one}");
        assert_eq!(one, without_wall_time(explore("3")), "{mode}");
    }
}

#[test]
fn outputs_are_checked_before_the_first_run() {
    let smoke = workspace().join("scenarios/smoke/healthy-turn.toml");
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&folder).unwrap();
    let missing = folder.join("no/such/folder/out.xml");
    let cases: [&[&str]; 5] = [
        &["matrix", smoke.to_str().unwrap(), "--seeds", "0..1000", "--junit", missing.to_str().unwrap()],
        &["matrix", smoke.to_str().unwrap(), "--seeds", "0..1000", "--junit", folder.to_str().unwrap()],
        &["run", smoke.to_str().unwrap(), "--timeline", missing.to_str().unwrap()],
        &["run", smoke.to_str().unwrap(), "--mermaid", folder.to_str().unwrap()],
        &["run", smoke.to_str().unwrap(), "--trace", missing.to_str().unwrap()],
    ];
    for args in cases {
        let out = rig(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("cannot write") && stderr.contains(args[args.len() - 1]), "names the file: {stderr}");
        assert!(out.stdout.is_empty(), "no run before the check: {args:?}");
    }
    let out = rig(&["run", smoke.to_str().unwrap(), "--jobs", "0"]);
    assert_eq!(out.status.code(), Some(2), "--jobs 0 is bad input");
    let out = rig(&["run", smoke.to_str().unwrap(), "--seeds", "0..20", "--timeline", "x.html"]);
    assert_eq!(out.status.code(), Some(2), "sixty runs are too many to draw");
    assert!(String::from_utf8_lossy(&out.stderr).contains("choose one with --policy and --seed"));
}

#[test]
fn the_lost_result_timeline_shows_the_drop_the_long_wait_and_the_redelivery() {
    let scenario = workspace().join("scenarios/incident-001/lost-result/lost-result.toml");
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/timeline");
    std::fs::create_dir_all(&folder).unwrap();
    let (html, markdown) = (folder.join("lost-result.html"), folder.join("lost-result.md"));
    let out = rig(&[
        "run",
        scenario.to_str().unwrap(),
        "--seed",
        "0",
        "--timeline",
        html.to_str().unwrap(),
        "--mermaid",
        markdown.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<section id=\"run-").count(), 2, "both policies, one section each");
    assert!(
        page.contains("<svg") && page.contains(">invocationresult harness::turn dropped</text>"),
        "the dropped frame, drawn"
    );
    assert!(page.contains("29 min 58.8 s"), "the 30-minute deadline as a break");
    assert!(page.contains("queue_redeliver: visibility deadline passed"), "the redelivery");
    assert!(page.contains("oracle `monotonic` fired (expected under this policy)"), "the oracle, at its moment");
    for outside in ["<script", "src=", "href=", "@import", "url(http"] {
        assert!(!page.contains(outside), "self-contained: no `{outside}`");
    }
    let diagram = std::fs::read_to_string(&markdown).unwrap();
    assert!(diagram.contains("```mermaid\nsequenceDiagram\n"), "{diagram}");
    assert!(diagram.contains("-xL") && diagram.contains("rect rgb(255, 214, 214)"), "the drop, in red");
}

#[test]
fn a_failing_matrix_case_writes_its_timeline_trace_and_repro_side_by_side() {
    let failing = failing_scenario("out-failing.toml");
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/matrix-out");
    let _ = std::fs::remove_dir_all(&folder);
    let out = rig(&[
        "matrix",
        failing.to_str().unwrap(),
        "--seeds",
        "2..5",
        "--policy",
        "reference",
        "--out",
        folder.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("NOT REPRODUCIBLE"), "{stdout}");
    for suffix in ["timeline.html", "trace.jsonl", "repro.sh"] {
        let wrote = stdout.lines().find(|l| l.trim().starts_with("wrote:") && l.ends_with(suffix)).expect(&stdout);
        let path = wrote.trim().trim_start_matches("wrote:").trim();
        assert!(path.ends_with(&format!("out-failing.reference.seed2.{suffix}")), "{path}");
        assert!(std::fs::metadata(path).unwrap().len() > 0, "{path}");
    }
}

#[test]
fn a_repro_line_replays_the_run_from_any_folder() {
    let failing = failing_scenario("repro-failing.toml");
    let out = rig(&["run", failing.to_str().unwrap(), "--policy", "reference", "--seed", "4"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let hash = |text: &str| text.split("hash=").nth(1).map(|h| h[..12].to_string());
    let repro = stdout.lines().find_map(|l| l.trim().strip_prefix("repro: ")).expect(&stdout);
    // The binary that ran it, on the scenario's absolute path: it runs as printed, from anywhere,
    // installed or not.
    let binary = Path::new(env!("CARGO_BIN_EXE_rig")).canonicalize().unwrap();
    assert!(repro.starts_with(&format!("{} run /", binary.display())), "{repro}");
    let elsewhere = Command::new("sh").arg("-c").arg(repro).current_dir("/").output().unwrap();
    assert_eq!(elsewhere.status.code(), Some(1), "{}", String::from_utf8_lossy(&elsewhere.stderr));
    assert_eq!(hash(&String::from_utf8_lossy(&elsewhere.stdout)), hash(&stdout), "the same run, replayed");
}

#[test]
fn an_explored_finding_is_written_with_its_timeline_trace_and_repro_and_overwrites_nothing() {
    let workload = workspace().join("scenarios/workloads/multi-round.toml");
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/explore-out");
    let _ = std::fs::remove_dir_all(&folder);
    let explore = |seeds: &str| {
        let out = rig(&[
            "explore",
            workload.to_str().unwrap(),
            "--policy",
            "unguarded",
            "--mode",
            "swarm",
            "--seeds",
            seeds,
            "--out",
            folder.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(!stdout.contains("NOT REPRODUCED"), "{stdout}");
        // `... -> PATH (replay: RIG run PATH --policy P --seed N; trace hash H) with its timeline, trace and repro beside it`
        stdout
            .lines()
            .filter(|l| l.trim_start().starts_with("shrunk to"))
            .map(|l| {
                assert!(l.ends_with("with its timeline, trace and repro beside it"), "{l}");
                let written = l.split(" -> ").nth(1).unwrap();
                let seed = written
                    .split("--seed ")
                    .nth(1)
                    .map_or(0, |s| s.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap());
                (PathBuf::from(written.split(" (replay").next().unwrap()), seed)
            })
            .collect::<Vec<(PathBuf, u64)>>()
    };
    let found = explore("0..20");
    let written: Vec<&PathBuf> = found.iter().map(|(path, _)| path).collect();
    assert!(written.len() >= 2, "the unguarded policy is found more than once");
    let distinct: std::collections::BTreeSet<_> = written.iter().collect();
    assert_eq!(distinct.len(), written.len(), "each finding has a file of its own: {written:?}");
    for path in written {
        let stem = path.with_extension("");
        for suffix in ["timeline.html", "trace.jsonl", "repro.sh"] {
            let beside = PathBuf::from(format!("{}.{suffix}", stem.display()));
            assert!(std::fs::metadata(&beside).is_ok_and(|m| m.len() > 0), "{}", beside.display());
        }
    }

    // A file of another content already at a finding's name is kept, and the finding takes the
    // next name; written again, the finding replaces only itself.
    let (first, seed) = &found[0];
    std::fs::write(first, "# someone else's file\n").unwrap();
    let range = format!("{seed}..{}", seed + 1);
    let again = explore(&range);
    let renamed = PathBuf::from(format!("{}-2.toml", first.with_extension("").display()));
    assert_eq!(again, [(renamed.clone(), *seed)]);
    assert_eq!(std::fs::read_to_string(first).unwrap(), "# someone else's file\n");
    assert_eq!(explore(&range), [(renamed, *seed)]);
}

/// Seeds whose failures shrink to the same oracle and the same kinds and sites of cut are one
/// finding: each failing seed's line names it, it is printed once with its count and seeds, and
/// written to one file whose header lists the other seeds.
#[test]
fn seeds_that_shrink_to_the_same_cuts_are_one_finding_in_one_file() {
    let workload = workspace().join("scenarios/workloads/multi-round.toml");
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/explore-signatures");
    let _ = std::fs::remove_dir_all(&folder);
    let explore = |extra: &[&str]| {
        let mut args =
            vec!["explore", workload.to_str().unwrap(), "--policy", "unguarded", "--mode", "swarm", "--seeds", "0..40"];
        args.extend(extra);
        let out = rig(&args);
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let stdout = explore(&["--out", folder.to_str().unwrap()]);
    let failing: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert!(failing.iter().all(|l| l.ends_with(')') && l.contains(" (finding #")), "{stdout}");
    // `finding #N `ORACLE` with CUTS on FILE [POLICY], K seeds: A, B` (or `, seed A`).
    let findings: Vec<(&str, Vec<u64>)> = stdout
        .lines()
        .filter(|l| l.starts_with("finding #"))
        .map(|l| {
            let seeds = l
                .rsplit_once("seeds: ")
                .map_or_else(|| l.rsplit_once(", seed ").unwrap().1.to_string(), |(_, seeds)| seeds.to_string());
            (l, seeds.split(", ").map(|s| s.parse().unwrap()).collect())
        })
        .collect();
    let counted: usize = findings.iter().map(|(_, seeds)| seeds.len()).sum();
    assert_eq!(counted, failing.len(), "every failing seed is counted in one finding: {stdout}");
    assert!(findings.len() < failing.len(), "some seeds shrink to the same finding: {stdout}");
    let summary = format!("{} failing ({} distinct findings)", failing.len(), findings.len());
    assert!(stdout.contains(&summary), "{stdout}");
    let files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    assert_eq!(files.len(), findings.len(), "one file per finding: {files:?}");
    let (line, seeds) = findings.iter().find(|(_, seeds)| seeds.len() == 2).expect("a finding of two seeds");
    assert!(line.contains(&format!(", 2 seeds: {}, {}", seeds[0], seeds[1])), "{line}");
    let file = files
        .iter()
        .find(|p| p.to_string_lossy().ends_with(&format!("--seed{}.toml", seeds[0])))
        .expect("the file is written from the first seed");
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains("\n# 2 runs in all came to the same finding"), "{text}");
    assert!(text.contains(&format!("\n# The others: seed {}.\n", seeds[1])), "{text}");

    // Failures only: each finding once, and no line per failing seed.
    let quiet = explore(&["-q"]);
    assert!(!quiet.contains("FAIL "), "{quiet}");
    let printed: Vec<&str> = quiet.lines().filter(|l| l.starts_with("finding #")).collect();
    assert_eq!(printed, findings.iter().map(|(l, _)| *l).collect::<Vec<_>>());
}

#[test]
fn thousands_of_unused_model_replies_are_summed_up_not_listed() {
    let source = std::fs::read_to_string(workspace().join("scenarios/smoke/healthy-turn.toml")).unwrap();
    let spare = "[[world.model]]\ntext = \"never asked for\"\n".repeat(4_999);
    let path = scratch("unused-replies.toml", &source.replace("[[step]]", &format!("{spare}\n[[step]]")));
    let out = rig(&["run", path.to_str().unwrap(), "--policy", "reference"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains("model script:")).collect();
    assert_eq!(lines.len(), 4, "three listed, the rest in one line: {}", lines.join("\n"));
    assert!(lines[0].contains("scripted model reply #2 ("), "{}", lines[0]);
    assert!(lines[3].contains("4996 more scripted model replies, among #5 to #5000"), "{}", lines[3]);
}

#[test]
fn a_binary_file_is_bad_input_with_a_location() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/binary.toml");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"[world]\n\xff\xfe\x00\x01").unwrap();
    let out = rig(&["run", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("binary.toml:2:1: found a byte that is not UTF-8"), "{stderr}");
}

#[test]
fn an_exploration_whose_uncut_workload_trips_an_oracle_fails_saying_so() {
    // `mint-child-budget` overspends the child's budget with no cut at all: each seed's uncut run
    // fails, which a mix adding nothing must not hide as `clean`.
    let workload = workspace().join("scenarios/workloads/budget-across-a-child.toml");
    let args =
        ["explore", workload.to_str().unwrap(), "--policy", "mint-child-budget", "--mode", "swarm", "--seeds", "0..2"];
    let out = rig(&args);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for seed in [0, 1] {
        let line = format!("[mint-child-budget] seed {seed}: [budget] on the uncut workload itself");
        assert!(stdout.contains(&line), "{stdout}");
    }
    assert!(stdout.contains("explored 2 seed(s): 0 clean, 2 failing"), "{stdout}");
    let reference = rig(&["explore", workload.to_str().unwrap(), "--mode", "swarm", "--seeds", "0..2"]);
    assert_eq!(reference.status.code(), Some(0), "{}", String::from_utf8_lossy(&reference.stdout));
    // Guided, the runs share one uncut run, which fails once, with the first run.
    let out = rig(&[
        "explore",
        workload.to_str().unwrap(),
        "--policy",
        "mint-child-budget",
        "--mode",
        "guided",
        "--seeds",
        "0..2",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = "[mint-child-budget] run 0: [budget] on the uncut workload itself";
    assert_eq!(stdout.matches(line).count(), 1, "{stdout}");
}

#[test]
fn a_fifo_named_like_a_scenario_is_bad_input_naming_it() {
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli/fifo");
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).unwrap();
    let fifo = folder.join("pipe.toml");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    // Given itself, or found in a folder beside a scenario it would otherwise run, it is named
    // for what it is (and never opened: a read would wait on its writer for good).
    std::fs::copy(workspace().join("scenarios/smoke/healthy-turn.toml"), folder.join("smoke.toml")).unwrap();
    for path in [&fifo, &folder] {
        let out = rig(&["run", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("{}: a named pipe (FIFO), not a scenario file", fifo.display())), "{stderr}");
        assert!(!stderr.contains("no scenario files"), "{stderr}");
        assert!(out.stdout.is_empty(), "nothing ran: {out:?}");
    }
}

#[test]
fn a_negative_seed_is_told_what_a_seed_is() {
    let file = workspace().join("scenarios/smoke/healthy-turn.toml");
    let file = file.to_str().unwrap();
    for args in [
        vec!["run", file, "--seed", "-1"],
        vec!["run", file, "--seed=-1"],
        vec!["run", file, "--seeds", "-1..3"],
        vec!["matrix", file, "--seeds", "0..-3"],
        vec!["sweep", file, "--seed", "-1"],
        vec!["explore", file, "--seed", "-1"],
        vec!["run", file, "--seed", "18446744073709551616"],
    ] {
        let out = rig(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("is not a seed: a seed is a non-negative integer"), "{args:?}: {stderr}");
        assert!(!stderr.contains("unexpected argument"), "{args:?}: {stderr}");
    }
}

/// Issue 35, item 14: hostile runs keep a bounded report. A user message of 10 MB, which a
/// transcript expectation reads back and fails on, used to be printed whole in every line that
/// quoted it; 10,000 queued inputs never admitted were 10,000 `stranded` lines in one run. Now a
/// long value is its start and its length, and an oracle shows a few findings and how many more
/// there are, in the human report, `--json` (still one JSON object per line, with the totals)
/// and the timeline.
#[test]
fn a_huge_value_and_ten_thousand_violations_give_a_bounded_report() {
    const VALUE_BYTES: usize = 10 << 20;
    const INPUTS: usize = 10_000;
    let source = std::fs::read_to_string(workspace().join("scenarios/smoke/healthy-turn.toml")).unwrap();
    let mut hostile = source.replace("text = \"hello\" }", &format!("text = \"{}\" }}", "a".repeat(VALUE_BYTES)));
    for n in 0..INPUTS {
        hostile.push_str(&format!(
            "\n[[world.record]]\nscope = \"harness_queue\"\nkey = \"q{n}:in\"\nvalue = {{ id = \"in\", session_id = \"q{n}\", entry_id = \"e{n}\", queued_at = 1, message = {{ role = \"user\", text = \"x\" }} }}\n"
        ));
    }
    let path = scratch("hostile.toml", &hostile);
    let timeline = scratch("hostile.html", "");
    let args = ["run", path.to_str().unwrap(), "--policy", "reference"];
    let human = rig(&[&args[..], &["--timeline", timeline.to_str().unwrap()]].concat());
    assert_eq!(human.status.code(), Some(1), "{}", String::from_utf8_lossy(&human.stderr));
    let report = String::from_utf8_lossy(&human.stdout);
    assert!(report.len() < 64 << 10, "a report of {} bytes:\n{}", report.len(), &report[..4096.min(report.len())]);
    assert!(report.contains("text expected = hello"), "the transcript expectation failed: {report}");
    assert!(report.contains(&format!("…` ({VALUE_BYTES} bytes)")), "the value's length is said: {report}");
    let stranded = report.lines().filter(|l| l.contains("oracle `stranded` fired")).count();
    assert_eq!(stranded, 5, "a few findings of the oracle: {report}");
    assert!(report.contains(&format!("and {} more of oracle `stranded`", INPUTS - 5)), "{report}");
    let page = std::fs::metadata(&timeline).expect("the timeline was written").len();
    assert!(page < 1 << 20, "a timeline of {page} bytes");

    let json = rig(&[&args[..], &["--json"]].concat());
    assert_eq!(json.status.code(), Some(1));
    let text = String::from_utf8_lossy(&json.stdout);
    assert!(text.len() < 256 << 10, "a JSON line of {} bytes", text.len());
    let line: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON object");
    assert_eq!(line["violation_details_total"], INPUTS);
    assert_eq!(line["violation_details"].as_array().map(Vec::len), Some(5));
    let failures = line["failures"].as_array().expect("failures");
    assert!(failures.len() <= 41 && line["failures_total"].as_u64() > Some(INPUTS as u64), "{line}");
    assert!(failures.iter().any(|f| f.as_str().is_some_and(|f| f.contains(&format!("({VALUE_BYTES} bytes)")))));
}

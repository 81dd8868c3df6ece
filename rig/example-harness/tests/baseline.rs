//! A team adopting the rig with a harness that is not yet clean: the naive harness, whose
//! planted flaws fail real scenario files (see `src/lib.rs`), writes a baseline of what it fails
//! on and finds today, and from then on `--baseline` passes while nothing else fails: for `run`,
//! `matrix`, `sweep` and `explore` of its own binary, and for its `cargo test` suite. Each command
//! gives the four answers: a listed failure still failing passes (0); an unlisted one is a
//! regression (1); a listed one that passes now makes the baseline stale (1, naming the entry);
//! `--write-baseline` writes the current state (0). `changes` then tells a night's failures and
//! findings from the nights before's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A team's checkout: the finalization files of incident 001 (the naive harness fails four of
/// them, for flaws `src/lib.rs` plants) in `scenarios/`, and a workload it sweeps in `workloads/`.
fn team(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("naive-baseline").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("scenarios")).unwrap();
    std::fs::create_dir_all(dir.join("workloads")).unwrap();
    let finalization = workspace().join("scenarios/incident-001/finalization");
    for file in std::fs::read_dir(finalization).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, dir.join("scenarios").join(file.file_name().unwrap())).unwrap();
    }
    let workload = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/opens-a-ticket.toml");
    std::fs::copy(workload, dir.join("workloads/opens-a-ticket.toml")).unwrap();
    dir
}

/// The naive harness's own binary, run in `dir`.
fn naive(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out: Output =
        Command::new(env!("CARGO_BIN_EXE_naive-harness")).args(args).current_dir(dir).output().expect("it runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (
        out.status.code(),
        format!("{stdout}{}", if stderr.is_empty() { String::new() } else { format!("\n[stderr]\n{stderr}") }),
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `text` without its lines containing `containing` (one at least).
fn without(text: &str, containing: &str) -> String {
    assert!(text.contains(containing), "no `{containing}` in:\n{text}");
    text.lines().filter(|l| !l.contains(containing)).map(|l| format!("{l}\n")).collect()
}

/// `text` with `line` added as the first entry of the list `list`.
fn with_entry(text: &str, list: &str, line: &str) -> String {
    let empty = format!("\n{list} = []\n");
    if text.contains(&empty) {
        return text.replace(&empty, &format!("\n{list} = [\n  {line},\n]\n"));
    }
    let open = format!("\n{list} = [\n");
    assert!(text.contains(&open), "no list `{list}` in:\n{text}");
    text.replacen(&open, &format!("{open}  {line},\n"), 1)
}

/// The line of `text` that `needle` is on, from 1.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("no `{needle}` in:\n{text}")) + 1
}

/// What each of `run` and `matrix` (`command`, its arguments before the baseline's) answers.
fn four_answers_for_failures(name: &str, command: &[&str]) -> PathBuf {
    let dir = team(name);
    let with = |extra: &[&str]| -> (Option<i32>, String) {
        let args: Vec<&str> = command.iter().chain(extra).copied().collect();
        naive(&dir, &args)
    };

    // --write-baseline: the current state, and exit 0.
    let (code, out) = with(&["--write-baseline", "rig-baseline.toml"]);
    assert_eq!(code, Some(0), "writing a baseline records the failures, it does not fail on them:\n{out}");
    let written = read(&dir.join("rig-baseline.toml"));
    assert!(written.contains("harness = \"naive\"\n"), "{written}");
    // What the naive harness's flaws fail (src/lib.rs): a swallowed failed write leaves the turn
    // running (`liveness`, and the file's expected `failed` record), a `running` reply over a
    // durable `failed` (`truthful-reply`), queued input left behind (`stranded`).
    for entry in [
        r#"{ file = "scenarios/write-timeout.toml", policy = "reference", oracle = "liveness", seed = 0 }"#,
        r#"{ file = "scenarios/write-timeout.toml", policy = "reference", expectation = "state harness_turn/s1", seed = 0 }"#,
        r#"{ file = "scenarios/write-rejected.toml", policy = "reference", oracle = "liveness", seed = 0 }"#,
        r#"{ file = "scenarios/lost-ack.toml", policy = "reference", oracle = "truthful-reply", seed = 0 }"#,
        r#"{ file = "scenarios/reseed-without-queue.toml", policy = "reference", oracle = "stranded", seed = 0 }"#,
    ] {
        assert!(written.contains(&format!("\n  {entry},\n")), "{entry} in:\n{written}");
    }
    let listed: Vec<&str> = written.lines().filter(|l| l.starts_with("  { file = ")).collect();
    let failing = ["write-timeout", "write-rejected", "lost-ack", "reseed-without-queue"];
    assert!(
        listed.iter().all(|l| failing.iter().any(|f| l.contains(&format!("\"scenarios/{f}.toml\"")))),
        "only the four failing files are listed: {listed:#?}"
    );
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "one entry a line, sorted");

    // A listed failure still failing: 0, and under -q nothing but the baseline's verdict.
    let (code, out) = with(&["--baseline", "rig-baseline.toml", "-q"]);
    assert_eq!(code, Some(0), "{out}");
    let verdict =
        format!("baseline rig-baseline.toml: {} known failure(s) still failing, 0 new, 0 stale", listed.len());
    assert!(out.contains(&verdict), "{out}");
    assert!(!out.contains("FAIL "), "a known failure is not reported under -q:\n{out}");

    // An unlisted failure: a regression, 1.
    let liveness = r#"{ file = "scenarios/write-timeout.toml", policy = "reference", oracle = "liveness""#;
    std::fs::write(dir.join("regressed.toml"), without(&written, liveness)).unwrap();
    let (code, out) = with(&["--baseline", "regressed.toml", "-q"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("NEW   scenarios/write-timeout.toml [reference] oracle `liveness`: not in the baseline"),
        "{out}"
    );
    assert!(out.contains("FAIL scenarios/write-timeout.toml [reference]"), "the regression's run is reported:\n{out}");
    assert!(!out.contains("FAIL scenarios/lost-ack.toml"), "a known one is not:\n{out}");

    // A listed failure that passes now: the baseline is stale, 1, naming the entry.
    let passing = r#"{ file = "scenarios/healthy.toml", policy = "reference", oracle = "ledger", seed = 0 }"#;
    let stale = with_entry(&written, "failures", passing);
    std::fs::write(dir.join("stale.toml"), &stale).unwrap();
    let (code, out) = with(&["--baseline", "stale.toml", "-q"]);
    assert_eq!(code, Some(1), "{out}");
    let at = line_of(&stale, "scenarios/healthy.toml");
    assert!(
        out.contains(&format!(
            "STALE stale.toml:{at}: scenarios/healthy.toml [reference] oracle `ledger` is listed, and no longer fails on it at seed 0"
        )),
        "{out}"
    );

    // Written again over the stale file: the entry that passes is gone, the rest kept, 0.
    let (code, out) = with(&["--baseline", "stale.toml", "--write-baseline", "stale.toml"]);
    assert_eq!(code, Some(1), "judged by the file as it was: still stale\n{out}");
    assert_eq!(read(&dir.join("stale.toml")), written, "the current state, as first written");
    dir
}

#[test]
fn run_passes_known_failures_and_fails_regressions_and_stale_entries() {
    four_answers_for_failures("run", &["run", "scenarios", "--seeds", "0..2"]);
}

#[test]
fn matrix_passes_known_failures_and_fails_regressions_and_stale_entries() {
    let dir = four_answers_for_failures("matrix", &["matrix", "scenarios", "--seeds", "0..2", "--shard", "1/1"]);
    // A known failure is no red case in CI's report either: skipped, saying why.
    let args = ["matrix", "scenarios", "--seeds", "0..2", "--baseline", "regressed.toml", "--junit", "junit.xml"];
    let (code, out) = naive(&dir, &args);
    assert_eq!(code, Some(1), "{out}");
    let xml = read(&dir.join("junit.xml"));
    let case = |file: &str| {
        let at = xml.find(&format!("name=\"{file} [reference]\"")).unwrap_or_else(|| panic!("{file}: {xml}"));
        xml[at..].split("</testcase>").next().unwrap().to_string()
    };
    let known = case("lost-ack.toml");
    assert!(known.contains("<skipped message=\"known failure, listed in the baseline regressed.toml: 2 of 2 seeds failed; lowest seed 0\""), "{xml}");
    assert!(known.contains(" type=\"known failure\""), "{xml}");
    assert!(case("write-timeout.toml").contains("<failure "), "what the baseline does not list fails: {xml}");
    assert!(out.contains("FAIL scenarios/lost-ack.toml [reference] 2 of 2 seeds failed; lowest seed 0 (known: the baseline regressed.toml lists it)"), "{out}");
}

#[test]
fn a_known_failure_says_so_in_json() {
    let dir = team("json");
    let (code, _) = naive(&dir, &["run", "scenarios/write-timeout.toml", "--write-baseline", "b.toml"]);
    assert_eq!(code, Some(0));
    let (code, out) = naive(&dir, &["run", "scenarios", "--json", "--baseline", "b.toml"]);
    assert_eq!(code, Some(1), "the other failing files are new: {out}");
    let runs: Vec<serde_json::Value> =
        out.lines().take_while(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    let of = |name: &str| runs.iter().find(|r| r["scenario"].as_str().unwrap().ends_with(name)).unwrap();
    assert_eq!(of("write-timeout.toml")["baseline"], "known");
    assert_eq!(of("lost-ack.toml")["baseline"], serde_json::json!({ "new": ["oracle `truthful-reply`"] }));
    assert!(of("healthy.toml").get("baseline").is_none(), "a passing run needs no word from the baseline");
    assert!(
        out.contains("[stderr]\n") && out.contains("NEW   scenarios/lost-ack.toml"),
        "the verdict on stderr: {out}"
    );
}

#[test]
fn a_malformed_or_foreign_baseline_is_bad_input_with_its_place() {
    let dir = team("malformed");
    std::fs::write(
        dir.join("bad.toml"),
        "harness = \"naive\"\nfailures = [\n  { file = \"scenarios/lost-ack.toml\", policy = \"reference\", oracle = \"truthfull-reply\" },\n]\n",
    )
    .unwrap();
    let (code, out) = naive(&dir, &["run", "scenarios", "--baseline", "bad.toml"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains(
            "error: bad baseline: bad.toml:3:70: unknown oracle `truthfull-reply` (did you mean `truthful-reply`?)"
        ),
        "{out}"
    );
    assert!(!out.contains("passed"), "nothing ran: {out}");
    std::fs::write(dir.join("theirs.toml"), "harness = \"reference\"\n").unwrap();
    let (code, out) = naive(&dir, &["sweep", "workloads", "--baseline", "theirs.toml"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("lists the failures of harness `reference`, and this is harness `naive`"), "{out}");
    let (code, out) = naive(&dir, &["explore", "workloads", "--seed", "1", "--strict"]);
    assert_eq!(code, Some(2), "--strict needs a baseline: {out}");
}

/// What each of `sweep` and `explore` (`command`) answers: a finding listed and found again
/// passes, a new one fails, a gone one fails only under `--strict`.
fn four_answers_for_findings(name: &str, command: &[&str], list: &str) -> PathBuf {
    let dir = team(name);
    let with = |extra: &[&str]| -> (Option<i32>, String) {
        let args: Vec<&str> = command.iter().chain(extra).copied().collect();
        naive(&dir, &args)
    };
    let (code, out) = with(&["-q", "--write-baseline", "known.toml"]);
    assert_eq!(code, Some(0), "{out}");
    let written = read(&dir.join("known.toml"));
    let findings: Vec<&str> = written.lines().filter(|l| l.starts_with("  { workload = ")).collect();
    // The naive harness sends a ticket request again after a lost acknowledgement (src/lib.rs).
    assert!(findings.iter().any(|l| l.contains("oracle = \"blind-replay\"")), "{written}");
    assert!(
        findings
            .iter()
            .all(|l| l.starts_with("  { workload = \"workloads/opens-a-ticket.toml\", policy = \"reference\", ")),
        "{written}"
    );
    assert!(written.contains(&format!("\n{list} = [\n")), "{written}");

    // Found again, all of them: 0, and under -q not a line about them.
    let (code, out) = with(&["-q", "--baseline", "known.toml"]);
    assert_eq!(code, Some(0), "{out}");
    let verdict = format!("baseline known.toml: {} known finding(s) found again, 0 new, 0 gone", findings.len());
    assert!(out.contains(&verdict), "{out}");
    assert!(!out.contains("finding #") && !out.contains("finding `"), "only what changed is printed:\n{out}");

    // One taken out of the baseline is new: 1.
    let taken = findings.iter().find(|l| l.contains("\"blind-replay\"")).unwrap();
    std::fs::write(dir.join("fewer.toml"), without(&written, taken)).unwrap();
    let (code, out) = with(&["-q", "--baseline", "fewer.toml"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("NEW   finding `blind-replay` with "), "{out}");
    assert!(out.contains("baseline fewer.toml: ") && out.contains(" 1 new, 0 gone"), "{out}");

    // One listed and not found: gone, which is news, not a failure, unless --strict.
    let never = r#"{ workload = "workloads/opens-a-ticket.toml", policy = "reference", oracle = "budget", cuts = ["crash @ point harness@nowhere"] }"#;
    let more = with_entry(&written, list, never);
    std::fs::write(dir.join("more.toml"), &more).unwrap();
    let (code, out) = with(&["-q", "--baseline", "more.toml"]);
    assert_eq!(code, Some(0), "{out}");
    let at = line_of(&more, "harness@nowhere");
    let gone = format!(
        "GONE  more.toml:{at}: finding `budget` with crash @ point harness@nowhere on workloads/opens-a-ticket.toml [reference] is listed, and was not found this time"
    );
    assert!(out.contains(&gone), "{out}");
    let (code, out) = with(&["-q", "--baseline", "more.toml", "--strict"]);
    assert_eq!(code, Some(1), "--strict fails on a gone finding:\n{out}");
    dir
}

#[test]
fn sweep_reports_findings_new_known_and_gone() {
    let dir = four_answers_for_findings("sweep", &["sweep", "workloads"], "sweep");
    // The signature, whole: a second request after a lost acknowledgement of the one ticket its
    // turn opens (the naive harness names it `TURN:STEP:INDEX`, src/lib.rs), at any ordinal.
    // A change in what a signature is made of shows here, and would make every baseline stale.
    let entry = r#"  { workload = "workloads/opens-a-ticket.toml", policy = "reference", oracle = "blind-replay", cuts = ["lost-ack @ call ticket::create[action_id=t1:1:0]"], seed = 0 },"#;
    let written = read(&dir.join("known.toml"));
    assert!(written.lines().any(|l| l == entry), "{written}");
}

#[test]
fn explore_reports_findings_new_known_and_gone() {
    four_answers_for_findings("explore", &["explore", "workloads", "--seeds", "0..12"], "explore");
}

/// A nightly run with a baseline prints only what changed: the new finding and the gone one,
/// then the summaries; every finding it knows goes unsaid.
#[test]
fn a_nightly_style_exploration_prints_only_new_and_gone_findings() {
    let dir = team("nightly");
    let explore = ["explore", "workloads", "--seeds", "0..12", "-q"];
    let (code, out) = naive(&dir, &[&explore[..], &["--write-baseline", "known.toml"]].concat());
    assert_eq!(code, Some(0), "{out}");
    let written = read(&dir.join("known.toml"));
    let findings: Vec<&str> = written.lines().filter(|l| l.starts_with("  { workload = ")).collect();
    assert!(findings.len() >= 3, "the naive harness has more than one known gap: {written}");
    let taken = findings[0];
    let never = r#"{ workload = "workloads/opens-a-ticket.toml", policy = "reference", oracle = "budget", cuts = ["crash @ point harness@nowhere"] }"#;
    std::fs::write(dir.join("tonight.toml"), with_entry(&without(&written, taken), "explore", never)).unwrap();

    let (code, out) = naive(&dir, &[&explore[..], &["--baseline", "tonight.toml"]].concat());
    assert_eq!(code, Some(1), "a new finding fails the night: {out}");
    let oracle = taken.split("oracle = \"").nth(1).unwrap().split('"').next().unwrap();
    let cuts = taken.split("cuts = [\"").nth(1).unwrap().split("\"]").next().unwrap();
    let signature = format!("`{oracle}` with {cuts}");
    let lines: Vec<&str> = out.lines().collect();
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| match l {
            l if l.starts_with("NEW finding #") && l.contains(&signature) => "new finding",
            l if l.starts_with("    repro: ") => "repro",
            l if l.starts_with("    shrunk to ") => "shrunk",
            l if l.starts_with(&format!("NEW   finding {signature} on workloads/opens-a-ticket.toml")) => "new",
            l if l.starts_with("GONE  tonight.toml:") && l.contains("`budget` with crash @ point harness@nowhere") => {
                "gone"
            }
            l if l.starts_with("baseline tonight.toml: ") && l.ends_with(" 1 new, 1 gone") => "baseline summary",
            l if l.starts_with("explored 12 seed(s): ") => "summary",
            other => panic!("a line about something that did not change: {other}\n{out}"),
        })
        .collect();
    assert_eq!(
        kinds,
        ["new finding", "repro", "shrunk", "new", "repro", "gone", "baseline summary", "summary"],
        "{out}"
    );
}

/// `changes`: the nightly's report, from the files its shards wrote.
#[test]
fn changes_tells_new_ongoing_and_gone_from_the_nights_before() {
    let dir = team("changes");
    let lost_result = workspace().join("scenarios/incident-001/lost-result/lost-result.toml");
    std::fs::copy(lost_result, dir.join("scenarios/lost-result.toml")).unwrap();
    // The night before: the finalization files and an exploration of the workload.
    let finalization: Vec<String> =
        ["lost-ack", "write-timeout", "healthy"].iter().map(|f| format!("scenarios/{f}.toml")).collect();
    let before: Vec<&str> = finalization.iter().map(String::as_str).collect();
    let (code, out) = naive(&dir, &[&["run"][..], &before, &["--write-baseline", "night1/run.toml"]].concat());
    assert_eq!(code, Some(0), "{out}");
    let explore = [
        "explore",
        "workloads",
        "--seeds",
        "0..8",
        "-q",
        "--out",
        "night1/found",
        "--write-baseline",
        "night1/explore.toml",
    ];
    let (code, out) = naive(&dir, &explore);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = naive(
        &dir,
        &["changes", "--now", "night1/run.toml", "night1/explore.toml", "--write-baseline", "state/state.toml"],
    );
    assert_eq!(code, Some(1), "the first night's are all new: {out}");
    assert!(out.contains("changes with nothing before (every failure and finding is new): "), "{out}");
    let state = read(&dir.join("state/state.toml"));
    let explored: Vec<&str> = state.lines().filter(|l| l.starts_with("  { workload = ")).collect();
    assert!(!explored.is_empty(), "{state}");
    for line in &explored {
        let shrunk = line.split("shrunk = \"").nth(1).unwrap().split('"').next().unwrap();
        assert!(shrunk.starts_with("state.findings/"), "the finding's file is kept beside the state: {line}");
        assert!(dir.join("state").join(shrunk).is_file(), "{shrunk}");
    }
    // The state remembers a failure that passes now too (a fixed bug).
    let fixed = r#"{ file = "../scenarios/healthy.toml", policy = "reference", oracle = "liveness", seed = 3 }"#;
    std::fs::write(dir.join("state/state.toml"), with_entry(&state, "failures", fixed)).unwrap();

    // This night: the same files, one more failing file, no exploration.
    let mut tonight = before.clone();
    tonight.push("scenarios/lost-result.toml");
    let (code, out) = naive(&dir, &[&["run"][..], &tonight, &["--write-baseline", "night2/run.toml"]].concat());
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = naive(
        &dir,
        &[
            "changes",
            "--since",
            "state/state.toml",
            "--now",
            "night2/run.toml",
            "--good",
            "aaa",
            "--bad",
            "bbb",
            "--write-baseline",
            "state/state.toml",
        ],
    );
    assert_eq!(code, Some(1), "a new failure fails the night: {out}");
    // New: the file the night before did not run, with its repro and its bisect command.
    assert!(
        out.contains("NEW       failure scenarios/lost-result.toml [reference] oracle `stranded` (seed 0)"),
        "{out}"
    );
    let program = env!("CARGO_BIN_EXE_naive-harness");
    assert!(
        out.contains(&format!("    repro: {program} run scenarios/lost-result.toml --policy reference --seed 0")),
        "{out}"
    );
    // The bisect script builds the binary's own profile: a debug build says so, a release build
    // (`cargo test --release`) is the script's default and says nothing.
    let profile = if std::path::Path::new(program).parent().and_then(|p| p.file_name()) == Some("debug".as_ref()) {
        "RIG_PROFILE=dev "
    } else {
        ""
    };
    assert!(
        out.contains(&format!(
            "    bisect: RIG_BIN=naive-harness {profile}.ci/bisect-finding aaa bbb scenarios/lost-result.toml --policy reference --seed 0"
        )),
        "{out}"
    );
    // Gone: its repro passes now.
    assert!(
        out.contains("GONE      failure scenarios/healthy.toml [reference] oracle `liveness` (last seen at seed 3)"),
        "{out}"
    );
    assert!(
        out.contains(&format!("    passes now: {program} run scenarios/healthy.toml --policy reference --seed 3")),
        "{out}"
    );
    // The explored findings were not drawn tonight; run again, they still fail: ongoing, unsaid.
    assert!(!out.contains("explore finding"), "only what changed is printed: {out}");
    let summary = out.lines().find(|l| l.starts_with("changes since state/state.toml: ")).unwrap();
    let ongoing_before = state.lines().filter(|l| l.starts_with("  { ")).count();
    assert!(
        summary.contains(&format!(
            " new, {ongoing_before} ongoing ({} of them not found this time, whose repro still fails), 1 gone",
            explored.len()
        )),
        "{summary}\n{out}"
    );
    let next = read(&dir.join("state/state.toml"));
    assert!(!next.contains("scenarios/healthy.toml"), "the gone one is forgotten: {next}");
    assert!(next.contains("\"../scenarios/lost-result.toml\""), "the new one is remembered: {next}");
    assert_eq!(next.lines().filter(|l| l.starts_with("  { workload = ")).count(), explored.len(), "{next}");

    // The same night again: nothing changed.
    let (code, out) = naive(&dir, &["changes", "--since", "state/state.toml", "--now", "night2/run.toml"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.lines().all(|l| l.starts_with("changes since ")), "{out}");
}

/// The `cargo test` suite with a baseline: a file failing only on what it lists is known
/// (ignored, saying so), one failing on anything else fails, one whose listed failure passes now
/// fails as stale; writing the baseline records what fails.
#[test]
fn the_test_suite_knows_its_known_failures() {
    let dir = team("suite");
    let root = dir.to_str().unwrap();
    let suite = || rig::testing::Suite::new(naive_harness::factory(), root, "scenarios");
    let file = |name: &str| dir.join("scenarios").join(name);

    let writer = suite().with_baseline(root, "rig-baseline.toml").writing_baseline();
    for name in ["write-timeout.toml", "lost-ack.toml", "healthy.toml"] {
        assert!(writer.check(&file(name)).is_ok(), "writing judges nothing: {name}");
    }
    writer.write_baseline().unwrap();
    let written = read(&dir.join("rig-baseline.toml"));
    assert!(
        written.contains(
            r#"{ file = "scenarios/write-timeout.toml", policy = "reference", oracle = "liveness", seed = 0 }"#
        ),
        "{written}"
    );

    let judged = suite().with_baseline(root, "rig-baseline.toml");
    let known = judged.check(&file("write-timeout.toml"));
    let Ok(rig::testing::Checked::Known(why)) = &known else { panic!("a known failure: {known:?}") };
    assert!(why.starts_with("known failure (") && why.contains("oracle `liveness`"), "{why}");
    assert_eq!(judged.check(&file("healthy.toml")), Ok(rig::testing::Checked::Passed));
    let regression = judged.check(&file("write-rejected.toml")).unwrap_err();
    assert!(
        regression.contains("(a regression: ") && regression.contains("lists no oracle `liveness`"),
        "{regression}"
    );

    let stale = with_entry(
        &written,
        "failures",
        r#"{ file = "scenarios/healthy.toml", policy = "reference", oracle = "ledger" }"#,
    );
    std::fs::write(dir.join("stale.toml"), &stale).unwrap();
    let judged = suite().with_baseline(root, "stale.toml");
    let error = judged.check(&file("healthy.toml")).unwrap_err();
    let at = line_of(&stale, "scenarios/healthy.toml");
    assert!(error.starts_with(&format!("stale baseline: {}:{at} lists ", dir.join("stale.toml").display())), "{error}");
    assert!(error.contains("oracle `ledger`, and no run fails on it now"), "{error}");
}

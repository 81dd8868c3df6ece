//! The rig's outputs read by the tools our users read them with: a timeline page rendered by a
//! real browser (headless Chromium, Debian's package), and the JUnit of two shards merged and
//! validated against the JUnit schema CI tools validate with (`xmllint`, Debian's
//! libxml2-utils, against `tests/junit/junit-10.xsd`).
//!
//! `.ci/run` installs both. On a developer's machine without them each check is reported
//! *ignored*, with the reason and the package to install, never passed unchecked; with `CI` set
//! a missing tool fails the check instead.

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The colours the timeline draws lanes and cuts in (`rig::timeline`).
const LANE_GREY: [u8; 3] = [0x8a, 0x9b, 0xb0];
const CUT_RED: [u8; 3] = [0xd6, 0x27, 0x28];
const WHITE: [u8; 3] = [0xff, 0xff, 0xff];
/// How long the browser may take before the check gives up on it (a hang guard, not a target).
const BROWSER_WAIT_MAX: Duration = Duration::from_secs(180);

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        Trial::ignorable_test(
            "timeline_in_chromium_fits_1280_px_keeps_the_lanes_in_view_and_names_each_arrow",
            timeline_in_chromium,
        ),
        Trial::ignorable_test("junit_of_two_shards_merges_and_validates_against_the_schema", junit_validates),
        Trial::ignorable_test(
            "a_signal_leaves_a_valid_partial_junit_outputs_that_say_so_and_the_signals_exit_status",
            interrupted_outputs,
        ),
        Trial::ignorable_test(
            "a_signal_stops_explore_bench_and_its_child_and_the_table_says_what_was_made",
            explore_bench_interrupted,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("rig sits in the workspace").to_path_buf()
}

fn scratch(name: &str) -> PathBuf {
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("external").join(name);
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).expect("scratch folder");
    folder
}

/// The first of `names` found on the PATH.
fn find_tool(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).flat_map(|dir| names.iter().map(move |n| dir.join(n))).find(|p| p.is_file())
}

/// A missing tool: ignored with the reason on a developer's machine, a failure in CI.
fn missing(tool: &str, package: &str) -> Result<Completion, Failed> {
    let reason = format!("{tool} not found: install Debian's `{package}` to run this check (.ci/run does)");
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
        return Err(format!("CI must run this check, but {reason}").into());
    }
    Ok(Completion::ignored_with(reason))
}

fn rig(args: &[&str]) -> Result<std::process::Output, Failed> {
    Command::new(env!("CARGO_BIN_EXE_rig")).args(args).output().map_err(|e| format!("the rig binary: {e}").into())
}

/// The window the timeline must fit, as a laptop shows it.
const WINDOW_WIDTH: usize = 1_280;

/// The lost result's timeline at 1,280 px: every lane and the description column on screen,
/// nothing off the right edge, the red cut frame between two lanes (screenshot); and in the
/// browser's own layout, no horizontal scrolling, the lane names still at the top of the
/// window after scrolling down, every small label inside the lanes, and the dropped
/// `invocationresult` named with its function; each section headed with its own policy.
fn timeline_in_chromium() -> Result<Completion, Failed> {
    let Some(chromium) = find_tool(&["chromium", "chromium-browser"]) else { return missing("chromium", "chromium") };
    let folder = scratch("timeline");
    let page = folder.join("lost-result.html");
    timeline(&page, &["--policy", "reference"])?;
    let html = std::fs::read_to_string(&page)?;
    let lanes = html.matches(&format!("stroke=\"#{}\"", hex(LANE_GREY))).count();
    let height: usize = svg_heights(&html).iter().sum();
    let screenshot = folder.join("lost-result.png");
    let window = (WINDOW_WIDTH, (height + 400).min(16_000));
    run_chromium(&chromium, &page, &["--screenshot", screenshot.to_str().unwrap()], window, &folder)?;
    check_screenshot(&Image::read(&screenshot)?, lanes, &screenshot)?;
    check_layout(&chromium, &html, lanes, &folder)?;
    check_headings(&folder)?;
    Ok(Completion::Completed)
}

fn timeline(page: &Path, extra: &[&str]) -> Result<(), Failed> {
    let scenario = workspace().join("scenarios/incident-001/lost-result/lost-result.toml");
    let mut args = vec!["run", scenario.to_str().unwrap(), "--seed", "0", "--timeline", page.to_str().unwrap()];
    args.extend(extra);
    let out = rig(&args)?;
    if out.status.code() != Some(0) {
        return Err(format!("rig run failed: {}", String::from_utf8_lossy(&out.stdout)).into());
    }
    Ok(())
}

fn check_screenshot(image: &Image, lanes: usize, path: &Path) -> Result<(), Failed> {
    let lane_columns = image.columns_of(LANE_GREY, image.height / 3);
    if lanes < 5 || lane_columns.len() != lanes {
        return Err(format!(
            "the page draws {lanes} lanes, the screenshot shows {} lane lines at x = {lane_columns:?} ({})",
            lane_columns.len(),
            path.display()
        )
        .into());
    }
    // In the lanes, not the description column beside them (whose red text names the cut).
    let lanes_right = lane_columns.last().copied().unwrap_or(0) + 20;
    let (red_row, start, end) =
        image.longest_run(CUT_RED, lanes_right).ok_or("no red in the lanes of the screenshot")?;
    let near_lane = |x: usize| lane_columns.iter().any(|&lane| lane.abs_diff(x) <= 12);
    if end - start < 60 || !near_lane(start) || !near_lane(end) {
        return Err(format!(
            "the longest red stroke (row {red_row}, x {start}..{end}) is not a cut frame between two lanes ({})",
            path.display()
        )
        .into());
    }
    let inked = |x: std::ops::Range<usize>| x.into_iter().any(|x| (0..image.height).any(|y| !image.is(x, y, WHITE)));
    if !inked(lanes_right + 20..image.width - 16) {
        return Err(format!("no description column right of the lanes ({})", path.display()).into());
    }
    if inked(image.width - 12..image.width) {
        return Err(
            format!("the page runs off the right edge of a {WINDOW_WIDTH} px window ({})", path.display()).into()
        );
    }
    Ok(())
}

/// What the browser's layout of the first section says, read back with `--dump-dom` from a
/// copy of the page with a measuring script (the page itself has none).
fn check_layout(chromium: &Path, html: &str, lanes: usize, folder: &Path) -> Result<(), Failed> {
    let probe = folder.join("probe.html");
    std::fs::write(&probe, html.replace("</body>", &format!("<script>{LAYOUT_PROBE}</script></body>")))?;
    let dom = run_chromium(chromium, &probe, &["--dump-dom"], (WINDOW_WIDTH, 900), folder)?;
    let json = dom
        .split_once("data-probe=\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(json, _)| json.replace("&quot;", "\"").replace("&amp;", "&"))
        .ok_or("the layout probe left no result")?;
    let layout: serde_json::Value = serde_json::from_str(&json)?;
    let number = |key: &str| layout[key].as_f64().unwrap_or(f64::NAN);
    let texts = |key: &str| -> Vec<String> {
        layout[key].as_array().into_iter().flatten().map(|t| t.as_str().unwrap_or_default().to_string()).collect()
    };
    let mut wrong = Vec::new();
    if !(number("width") <= number("client") && number("client") >= 1_200.0) {
        wrong.push(format!("{} px wide in a {} px window: it scrolls sideways", number("width"), number("client")));
    }
    if !(number("scrolled") > 1_000.0 && number("lanes_top").abs() < 1.0) {
        wrong.push(format!(
            "scrolled {} px past the lane names, they are at {} px, not at the top",
            number("scrolled"),
            number("lanes_top")
        ));
    }
    let names = texts("names");
    if names.len() != lanes + 2 || !["harness", "proxy", "engine"].iter().all(|n| names.iter().any(|m| m == n)) {
        wrong.push(format!("the lane header names {names:?} for {lanes} lanes"));
    }
    let outside = texts("outside");
    if !outside.is_empty() {
        wrong.push(format!("labels reaching past the lanes into the descriptions: {outside:?}"));
    }
    let labels = texts("labels");
    for label in ["invokefunction harness::turn", "invocationresult harness::turn dropped"] {
        if !labels.iter().any(|l| l == label) {
            wrong.push(format!("no arrow labelled `{label}`"));
        }
    }
    match wrong.is_empty() {
        true => Ok(()),
        false => Err(wrong.join("; ").into()),
    }
}

/// Measures the first section, scrolls well into it and measures the lane header again.
const LAYOUT_PROBE: &str = r##"
const lanes = document.querySelector("#run-1 .lanes");
const band = lanes.querySelector("rect").getBoundingClientRect();
const labels = [...lanes.nextElementSibling.querySelectorAll('text[font-size="9"]')];
const outside = labels.filter(t => { const r = t.getBoundingClientRect(); return r.width > 0 && r.right > band.right + 1; });
const probe = {
  width: document.documentElement.scrollWidth,
  client: document.documentElement.clientWidth,
  names: [...lanes.querySelectorAll("text")].map(t => t.textContent),
  labels: labels.map(t => t.textContent),
  outside: outside.map(t => t.textContent),
};
// Measured before scrolling: a stuck header's offset follows the scroll.
const lanes_at = lanes.getBoundingClientRect().top + window.scrollY;
window.scrollTo(0, lanes_at + 1500);
probe.scrolled = window.scrollY - lanes_at;
probe.lanes_top = lanes.getBoundingClientRect().top;
document.body.setAttribute("data-probe", JSON.stringify(probe));
"##;

/// Each section is headed with the policy it ran: the known-bad one is not called `reference`.
fn check_headings(folder: &Path) -> Result<(), Failed> {
    let page = folder.join("both-policies.html");
    timeline(&page, &[])?;
    let html = std::fs::read_to_string(&page)?;
    let headings: Vec<&str> =
        html.split("<div class=\"who\">").skip(1).filter_map(|rest| rest.split("</div>").next()).collect();
    let right = headings.len() == 2
        && headings[0].starts_with("policy <b>reference</b>")
        && headings[1].starts_with("policy <b>unguarded</b>")
        && headings[1].contains("known-bad");
    match right {
        true => Ok(()),
        false => Err(format!("the sections are headed {headings:?}").into()),
    }
}

fn hex([r, g, b]: [u8; 3]) -> String {
    format!("{r:02x}{g:02x}{b:02x}")
}

/// The `height` of each SVG in the page (the lane header's and the rows').
fn svg_heights(html: &str) -> Vec<usize> {
    html.split("<svg ")
        .skip(1)
        .filter_map(|tag| tag.split_once(" height=\"").and_then(|(_, rest)| rest.split('"').next()?.parse().ok()))
        .collect()
}

/// Headless Chromium as Debian ships it, run as the machines here run it: no sandbox (root),
/// no GPU, no background networking (the network is closed), a fresh profile, and a home of its
/// own in the scratch folder (it keeps certificate and font caches there) and its temporary
/// files there too, so nothing is written outside the target directory.
/// `what` is `--screenshot FILE` or `--dump-dom`; returns what it printed.
fn run_chromium(
    chromium: &Path,
    page: &Path,
    what: &[&str],
    (width, height): (usize, usize),
    folder: &Path,
) -> Result<String, Failed> {
    let stdout = folder.join("chromium.out");
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", folder.join("profile").display()))
        .arg(format!("--window-size={width},{}", height.min(16_000)))
        .arg(what.join("="))
        .arg(format!("file://{}", page.display()))
        .env("HOME", folder.join("home"))
        .env("XDG_CONFIG_HOME", folder.join("home/.config"))
        .env("XDG_CACHE_HOME", folder.join("home/.cache"))
        .env("TMPDIR", folder)
        .stdout(std::fs::File::create(&stdout)?)
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", chromium.display()))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let wrote = what.get(1).is_none_or(|file| Path::new(file).exists());
            if !status.success() || !wrote {
                return Err(format!("chromium exited {status} without doing {what:?}").into());
            }
            return Ok(std::fs::read_to_string(&stdout)?);
        }
        if started.elapsed() > BROWSER_WAIT_MAX {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("chromium took more than {BROWSER_WAIT_MAX:?}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A decoded screenshot, as RGB rows.
struct Image {
    width: usize,
    height: usize,
    rgb: Vec<[u8; 3]>,
}

impl Image {
    fn read(path: &Path) -> Result<Self, Failed> {
        let mut decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path)?));
        decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        let mut reader = decoder.read_info().map_err(|e| e.to_string())?;
        let mut buffer = vec![0; reader.output_buffer_size().ok_or("the screenshot is too large")?];
        let info = reader.next_frame(&mut buffer).map_err(|e| e.to_string())?;
        let samples = info.color_type.samples();
        if samples < 3 {
            return Err(format!("a {:?} screenshot, expected colour", info.color_type).into());
        }
        let rgb = buffer[..info.buffer_size()].chunks_exact(samples).map(|p| [p[0], p[1], p[2]]).collect();
        Ok(Self { width: info.width as usize, height: info.height as usize, rgb })
    }

    fn is(&self, x: usize, y: usize, colour: [u8; 3]) -> bool {
        let pixel = self.rgb[y * self.width + x];
        pixel.iter().zip(colour).all(|(a, b)| a.abs_diff(b) <= 10)
    }

    /// The middle of each band of columns in which at least `count_min` pixels have `colour`.
    fn columns_of(&self, colour: [u8; 3], count_min: usize) -> Vec<usize> {
        let full: Vec<bool> =
            (0..self.width).map(|x| (0..self.height).filter(|&y| self.is(x, y, colour)).count() >= count_min).collect();
        let mut bands = Vec::new();
        let mut x = 0;
        while x < self.width {
            if full[x] {
                let start = x;
                while x < self.width && full[x] {
                    x += 1;
                }
                bands.push((start + x - 1) / 2);
            }
            x += 1;
        }
        bands
    }

    /// The longest solid horizontal stroke of `colour` left of `x_max` (a stroke, not text:
    /// gaps of one pixel at most): row, start, end.
    fn longest_run(&self, colour: [u8; 3], x_max: usize) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for y in 0..self.height {
            let mut run: Option<(usize, usize)> = None;
            for x in (0..self.width.min(x_max)).filter(|&x| self.is(x, y, colour)) {
                run = match run {
                    Some((start, end)) if x <= end + 2 => Some((start, x)),
                    _ => Some((x, x)),
                };
                let (start, end) = run.unwrap_or((x, x));
                if best.is_none_or(|(_, s, e)| end - start > e - s) {
                    best = Some((y, start, end));
                }
            }
        }
        best
    }
}

fn junit_validates() -> Result<Completion, Failed> {
    let folder = scratch("junit");
    // A scenario whose reference policy must fail, so the report carries a failure element.
    let source = std::fs::read_to_string(workspace().join("scenarios/incident-001/finalization/write-timeout.toml"))?;
    let failing = folder.join("write-timeout-expects-liveness.toml");
    std::fs::write(
        &failing,
        source.replace("[policy.reference]\n", "[policy.reference]\nviolations = [\"liveness\"]\n"),
    )?;
    let smoke = workspace().join("scenarios/smoke/healthy-turn.toml");
    let mut shards = Vec::new();
    for shard in ["1/2", "2/2"] {
        let path = folder.join(format!("junit-{}.xml", shard.replace('/', "-of-")));
        let out = rig(&[
            "matrix",
            smoke.to_str().unwrap(),
            failing.to_str().unwrap(),
            "--seeds",
            "0..6",
            "--shard",
            shard,
            "--junit",
            path.to_str().unwrap(),
        ])?;
        if out.status.code() != Some(1) {
            return Err(format!("shard {shard}: expected exit 1, got {:?}", out.status.code()).into());
        }
        shards.push((path.clone(), std::fs::read_to_string(&path)?));
    }
    // What CI tools do first: read each shard's report.
    let mut names = std::collections::BTreeSet::new();
    for (path, xml) in &shards {
        let report = quick_junit::Report::deserialize_from_str(xml).map_err(|e| format!("{}: {e}", path.display()))?;
        for suite in &report.test_suites {
            if !names.insert(suite.name.as_str().to_string()) {
                return Err(format!("two shards share the suite name `{}`", suite.name.as_str()).into());
            }
            if suite.failures == 0 || suite.test_cases.iter().all(|c| c.classname.is_none()) {
                return Err(format!("{}: expected a failure and class names", path.display()).into());
            }
        }
    }
    let merged = folder.join("merged.xml");
    std::fs::write(&merged, merge(&shards.iter().map(|(_, xml)| xml.as_str()).collect::<Vec<_>>()))?;
    let Some(xmllint) = find_tool(&["xmllint"]) else { return missing("xmllint", "libxml2-utils") };
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/junit/junit-10.xsd");
    for file in shards.iter().map(|(path, _)| path).chain([&merged]) {
        let out = Command::new(&xmllint).arg("--noout").arg("--schema").arg(&schema).arg(file).output()?;
        if !out.status.success() {
            return Err(
                format!("{} does not validate: {}", file.display(), String::from_utf8_lossy(&out.stderr)).into()
            );
        }
    }
    Ok(Completion::Completed)
}

/// Merges JUnit reports the way CI's merge tools do: every file's `<testsuite>` elements, as
/// written, under one `<testsuites>` root with the counts added up.
fn merge(reports: &[&str]) -> String {
    let (mut tests, mut failures, mut errors) = (0u64, 0u64, 0u64);
    let mut suites = String::new();
    for xml in reports {
        let root = &xml[xml.find("<testsuites").unwrap_or(0)..];
        let root_tag = &root[..root.find('>').unwrap_or(0)];
        let count = |name: &str| -> u64 {
            root_tag
                .split(&format!(" {name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        tests += count("tests");
        failures += count("failures");
        errors += count("errors");
        let (start, end) = (xml.find("<testsuite ").unwrap_or(0), xml.rfind("</testsuites>").unwrap_or(xml.len()));
        suites.push_str(&xml[start..end]);
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"merged\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\">\n{suites}</testsuites>\n"
    )
}

/// How long a command may take to stop after a signal (a hang guard, not a target).
const STOP_WAIT_MAX: Duration = Duration::from_secs(120);

/// Issue 35, item 13: a SIGTERM in the middle of `rig matrix --junit --out` left a 0-byte JUnit
/// file (not XML at all) and exit 143 with no word. Now the matrix starts no new run, writes a
/// JUnit report of what it ran that validates against the schema and says it was interrupted
/// (an errored case and a property), the failing case's files in `--out` (from the run itself:
/// there is no replay after a signal), the summary with the interruption, and exits 143; and a
/// SIGINT in the middle of `rig run --json` leaves whole JSON lines, the last one saying it was
/// interrupted, and exit 130. The signals are real, sent to the child process with `kill`.
fn interrupted_outputs() -> Result<Completion, Failed> {
    let folder = scratch("interrupted");
    let source = std::fs::read_to_string(workspace().join("scenarios/incident-001/finalization/write-timeout.toml"))?;
    let failing = folder.join("fails-every-seed.toml");
    std::fs::write(
        &failing,
        source.replace("[policy.reference]\n", "[policy.reference]\nviolations = [\"liveness\"]\n"),
    )?;
    let junit = folder.join("junit.xml");
    let out = folder.join("out");
    let mut matrix = Command::new(env!("CARGO_BIN_EXE_rig"));
    matrix.args([
        "matrix",
        failing.to_str().unwrap(),
        "--policy",
        "reference",
        "--seeds",
        "0..10000000",
        "--jobs",
        "2",
    ]);
    matrix.args(["--junit", junit.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    // The matrix says a case failed on stderr the moment its first seed fails: runs are going.
    let (code, stdout) = signalled(&mut matrix, "TERM", |stderr: &str| stderr.starts_with("FAIL "))?;
    if code != Some(143) {
        return Err(format!("rig matrix stopped by SIGTERM exited {code:?}:\n{stdout}").into());
    }
    if !stdout.contains("interrupted by SIGTERM") || !stdout.contains("not replayed: the matrix was interrupted") {
        return Err(format!("the summary does not say it was interrupted:\n{stdout}").into());
    }
    let xml = std::fs::read_to_string(&junit)?;
    let report =
        quick_junit::Report::deserialize_from_str(&xml).map_err(|e| format!("{}: {e}\n{xml}", junit.display()))?;
    let suite = report.test_suites.first().ok_or("no suite")?;
    let said = suite.properties.iter().any(|p| p.name.as_str() == "interrupted" && p.value.contains("SIGTERM"));
    if !said || suite.errors != 1 || suite.failures != 1 {
        return Err(format!("the partial report does not say what happened:\n{xml}").into());
    }
    let written: Vec<String> =
        std::fs::read_dir(&out)?.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    for suffix in [".timeline.html", ".trace.jsonl", ".repro.sh"] {
        if !written.iter().any(|name| name.ends_with(suffix)) {
            return Err(format!("no *{suffix} in --out: {written:?}").into());
        }
    }

    let mut run = Command::new(env!("CARGO_BIN_EXE_rig"));
    let smoke = workspace().join("scenarios/smoke/healthy-turn.toml");
    run.args(["run", smoke.to_str().unwrap(), "--seeds", "0..10000000", "--json", "--jobs", "2"]);
    let (code, stdout) = signalled(&mut run, "INT", |_| false)?;
    if code != Some(130) {
        return Err(format!("rig run stopped by SIGINT exited {code:?}").into());
    }
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).map_err(|e| format!("not a whole JSON line ({e}): {line}")))
        .collect::<Result<_, _>>()?;
    let last = lines.last().ok_or("no line at all")?;
    if last["interrupted"] != "SIGINT" || last["runs_made"].as_u64() != Some(lines.len() as u64 - 1) {
        return Err(format!("the last line does not say how the run was interrupted: {last}").into());
    }

    let Some(xmllint) = find_tool(&["xmllint"]) else { return missing("xmllint", "libxml2-utils") };
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/junit/junit-10.xsd");
    let lint = Command::new(&xmllint).arg("--noout").arg("--schema").arg(&schema).arg(&junit).output()?;
    if !lint.status.success() {
        return Err(format!("the partial JUnit does not validate: {}", String::from_utf8_lossy(&lint.stderr)).into());
    }
    Ok(Completion::Completed)
}

/// Issue 37, item 3: `rig explore-bench` took no notice of SIGTERM (every search ran to its end,
/// and the small harness's binary it runs for the default set never heard of the signal). Now a
/// signal stops its searches and is passed on to that child; the table of what was made is
/// printed, saying it was interrupted and judging no target, and it exits with the signal's
/// status. The child here stands in for the small harness's binary: a script that says on
/// standard error that it is searching, and records the signal when it comes.
fn explore_bench_interrupted() -> Result<Completion, Failed> {
    use std::os::unix::fs::PermissionsExt;
    let folder = scratch("explore-bench-interrupted");
    let heard = folder.join("child-heard");
    let child = folder.join("small-harness");
    let script = format!(
        "#!/bin/sh\ntrap 'echo TERM > \"{}\"; exit 143' TERM\necho 'child: searching' >&2\nwhile :; do sleep 0.05; done\n",
        heard.display()
    );
    std::fs::write(&child, script)?;
    std::fs::set_permissions(&child, std::fs::Permissions::from_mode(0o755))?;
    let mut bench = Command::new(env!("CARGO_BIN_EXE_rig"));
    bench.current_dir(workspace()).args(["explore-bench", "--searcher", "swarm", "--explorer-seeds", "1"]);
    bench.args(["--cap", "1", "--jobs", "1", "--small-harness", child.to_str().unwrap()]);
    let (code, stdout) = signalled(&mut bench, "TERM", |line: &str| line == "child: searching")?;
    if code != Some(143) {
        return Err(format!("rig explore-bench stopped by SIGTERM exited {code:?}:\n{stdout}").into());
    }
    if std::fs::read_to_string(&heard).map(|text| text.trim().to_string()).ok().as_deref() != Some("TERM") {
        return Err("the small harness's binary was not passed the signal".into());
    }
    let said = stdout.contains("interrupted by SIGTERM: 18 of 26 searches made, no more started")
        && stdout.contains("targets NOT judged: a signal stopped the searches");
    let table = stdout.lines().filter(|line| line.starts_with("replay-unfinished ")).count();
    if !said || table != 1 {
        return Err(format!("the table does not say what was made and that it was interrupted:\n{stdout}").into());
    }
    Ok(Completion::Completed)
}

/// Starts `command`, sends it `signal` (with `kill`) once a line of its standard error meets
/// `ready` or, failing that, its standard output has printed a few lines; its exit code and
/// standard output.
fn signalled(
    command: &mut Command,
    signal: &str,
    ready: impl Fn(&str) -> bool + Send + 'static,
) -> Result<(Option<i32>, String), Failed> {
    use std::io::{BufRead, BufReader, Read};
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let (sender, going) = std::sync::mpsc::channel::<()>();
    let stderr = child.stderr.take().ok_or("stderr")?;
    let on_stderr = sender.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if ready(&line) {
                let _ = on_stderr.send(());
            }
        }
    });
    let stdout = child.stdout.take().ok_or("stdout")?;
    let (lines_sender, printed) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut text = String::new();
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            if text.lines().count() == 20 {
                let _ = sender.send(());
            }
            text.push_str(&line);
            line.clear();
        }
        let _ = reader.read_to_string(&mut text);
        let _ = lines_sender.send(text);
    });
    going.recv_timeout(STOP_WAIT_MAX).map_err(|_| "the command never got going")?;
    let status = Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status()?;
    if !status.success() {
        return Err("kill failed".into());
    }
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait()? {
            break status.code();
        }
        if started.elapsed() > STOP_WAIT_MAX {
            let _ = child.kill();
            return Err(format!("still running {STOP_WAIT_MAX:?} after SIG{signal}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok((code, printed.recv_timeout(STOP_WAIT_MAX).map_err(|_| "no standard output")?))
}

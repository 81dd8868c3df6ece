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
/// How long the browser may take before the check gives up on it (a hang guard, not a target).
const BROWSER_WAIT_MAX: Duration = Duration::from_secs(180);

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        Trial::ignorable_test("timeline_in_chromium_shows_the_lanes_and_the_red_cut", timeline_in_chromium),
        Trial::ignorable_test("junit_of_two_shards_merges_and_validates_against_the_schema", junit_validates),
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

fn timeline_in_chromium() -> Result<Completion, Failed> {
    let Some(chromium) = find_tool(&["chromium", "chromium-browser"]) else { return missing("chromium", "chromium") };
    let folder = scratch("timeline");
    let page = folder.join("lost-result.html");
    let scenario = workspace().join("scenarios/incident-001/lost-result/lost-result.toml");
    let out = rig(&[
        "run",
        scenario.to_str().unwrap(),
        "--seed",
        "0",
        "--policy",
        "reference",
        "--timeline",
        page.to_str().unwrap(),
    ])?;
    if out.status.code() != Some(0) {
        return Err(format!("rig run failed: {}", String::from_utf8_lossy(&out.stdout)).into());
    }
    let html = std::fs::read_to_string(&page)?;
    let lanes = html.matches(&format!("stroke=\"#{}\"", hex(LANE_GREY))).count();
    let (width, height) = svg_size(&html).ok_or("the page has no sized SVG")?;
    let screenshot = folder.join("lost-result.png");
    screenshot_page(&chromium, &page, &screenshot, (width + 60, height + 240), &folder)?;
    let image = Image::read(&screenshot)?;

    let lane_columns = image.columns_of(LANE_GREY, image.height / 3);
    if lanes < 5 || lane_columns.len() != lanes {
        return Err(format!(
            "the page draws {lanes} lanes, the screenshot shows {} lane lines at x = {lane_columns:?} ({})",
            lane_columns.len(),
            screenshot.display()
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
            screenshot.display()
        )
        .into());
    }
    Ok(Completion::Completed)
}

fn hex([r, g, b]: [u8; 3]) -> String {
    format!("{r:02x}{g:02x}{b:02x}")
}

/// The SVG's `width` and `height` attributes.
fn svg_size(html: &str) -> Option<(usize, usize)> {
    let tag = &html[html.find("<svg ")?..];
    let attribute = |name: &str| -> Option<usize> {
        let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[start..].split('"').next()?.parse().ok()
    };
    Some((attribute("width")?, attribute("height")?))
}

/// Headless Chromium as Debian ships it, run as the machines here run it: no sandbox (root),
/// no GPU, no background networking (the network is closed), a fresh profile, and a home of its
/// own in the scratch folder (it keeps certificate and font caches there), so nothing is written
/// outside the target directory.
fn screenshot_page(
    chromium: &Path,
    page: &Path,
    png: &Path,
    (width, height): (usize, usize),
    folder: &Path,
) -> Result<(), Failed> {
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
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()))
        .env("HOME", folder.join("home"))
        .env("XDG_CONFIG_HOME", folder.join("home/.config"))
        .env("XDG_CACHE_HOME", folder.join("home/.cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", chromium.display()))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() || !png.exists() {
                return Err(format!("chromium exited {status} without a screenshot").into());
            }
            return Ok(());
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

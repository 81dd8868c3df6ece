//! The shipped workloads, swept and explored from the library by the small harness (and its
//! `turns`-only variant) exactly as its own binary does: the same workloads served and skipped,
//! with the same reasons, and the same summaries. A team with a harness like this one has at
//! least six shipped workloads to explore, whichever way it drives the rig.

use rig::explore::{self, ExploreTally, SweepOptions, SweepTally};
use rig::{HarnessFactory, Scenario};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// The workloads folder as the binary is given it (the tests run in the crate's folder).
const WORKLOADS: &str = "../../scenarios/workloads";

/// The fewest shipped workloads a harness serving `turns` alone must be able to sweep.
const SERVED_MIN: usize = 6;

fn workloads() -> Vec<Scenario> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(WORKLOADS)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files.iter().map(|path| Scenario::load(path).unwrap()).collect()
}

/// The lines the small harness's binary (`turns_only`: the variant) prints for `args`.
fn binary(turns_only: bool, args: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_small-harness"))
        .args(args)
        .env("SMALL_HARNESS_TURNS_ONLY", if turns_only { "1" } else { "0" })
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("the binary runs");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

fn variants() -> [(bool, Arc<dyn HarnessFactory>); 2] {
    [(false, small_harness::factory()), (true, small_harness::turns_only())]
}

#[test]
fn the_library_serves_and_skips_the_workloads_the_binary_lists() {
    let workloads = workloads();
    for (turns_only, harness) in variants() {
        let lines: Vec<(String, bool)> =
            workloads.iter().map(|w| explore::needs_line(&harness, w, "reference", false)).collect();
        let served = lines.iter().filter(|(_, serves)| *serves).count();
        assert!(served >= SERVED_MIN, "harness `{}` serves {served} workloads: {lines:#?}", harness.name());
        let mut expected: Vec<String> = lines.into_iter().map(|(line, _)| line).collect();
        expected.push(format!(
            "{} workload(s): harness `{}` serves {served}, skips {}",
            workloads.len(),
            harness.name(),
            workloads.len() - served
        ));
        for command in ["sweep", "explore"] {
            assert_eq!(binary(turns_only, &[command, WORKLOADS, "--list"]), expected, "{command} --list");
        }
    }
}

#[test]
fn sweeps_and_explorations_from_the_library_count_as_the_binary_does() {
    let workloads = workloads();
    let options = SweepOptions { budget: Some(3), ..SweepOptions::default() };
    for (turns_only, harness) in variants() {
        let mut sweeps = SweepTally::default();
        let mut explorations = ExploreTally::default();
        for workload in &workloads {
            let swept = explore::sweep(&harness, workload, &options);
            // A skip is the reason the binary prints for the workload.
            if let Err(skip) = &swept {
                let line = rig::report::skip_line(&workload.path.display().to_string(), "reference", skip);
                let printed = binary(turns_only, &["sweep", &workload.path.display().to_string()]);
                assert!(printed.contains(&line), "{line}\n{printed:#?}");
            }
            sweeps.add(&swept);
            explorations.add(&explore::explore(&harness, workload, "reference", 0, false));
        }
        assert!(sweeps.swept >= SERVED_MIN as u64, "{}", sweeps.summary(harness.name()));
        assert_eq!(sweeps.swept + sweeps.skipped, workloads.len() as u64);
        assert_eq!(explorations.explored, sweeps.swept, "explore serves what sweep serves");
        let printed = binary(turns_only, &["sweep", WORKLOADS, "--budget", "3", "-q"]);
        assert_eq!(printed.last(), Some(&sweeps.summary(harness.name())), "the same sweep summary");
        let printed = binary(turns_only, &["explore", WORKLOADS, "--seeds", "0..1", "-q", "--jobs", "1"]);
        assert_eq!(printed.last(), Some(&explorations.summary(harness.name())), "the same explore summary");
    }
}

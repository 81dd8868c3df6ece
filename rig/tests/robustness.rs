//! Bad input gets a clear error, never a panic: seeded mutations of every shipped scenario must
//! parse to a scenario or to an error with a location, and a mutant that still parses must run
//! to an outcome (pass or fail) without panicking.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rig::{run, Scenario};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

const MUTANTS_PER_FILE: usize = 60;
const RUNS_MAX: usize = 40;
const NOISE: [&str; 14] =
    ["=", "[", "]", "{", "}", "\"", ",", "\n", "0", "-1", "18446744073709551615", "x", "[[step]]\n", "."];

/// One random edit at a char boundary: delete a span, insert noise, or duplicate a line.
fn mutate(source: &str, rng: &mut ChaCha8Rng) -> String {
    let chars: Vec<char> = source.chars().collect();
    let at = rng.random_range(0..=chars.len());
    let (before, after): (String, String) = (chars[..at].iter().collect(), chars[at..].iter().collect());
    match rng.random_range(0..3) {
        0 => {
            let cut = rng.random_range(0..=after.chars().count().min(40));
            format!("{before}{}", after.chars().skip(cut).collect::<String>())
        }
        1 => format!("{before}{}{after}", NOISE[rng.random_range(0..NOISE.len())]),
        _ => {
            let lines: Vec<&str> = source.lines().collect();
            let line = lines[rng.random_range(0..lines.len())];
            format!("{source}\n{line}\n")
        }
    }
}

#[test]
fn mutated_scenarios_never_panic() {
    let files = rig::scenario_files(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")]).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let (mut errors, mut runs) = (0, 0);
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        for _ in 0..MUTANTS_PER_FILE {
            let mutant = mutate(&source, &mut rng);
            let parsed = catch_unwind(|| Scenario::parse(Path::new("mutant.toml"), &mutant));
            let parsed =
                parsed.unwrap_or_else(|_| panic!("parsing panicked on a mutant of {}:\n{mutant}", file.display()));
            match parsed {
                Err(error) => {
                    assert!(error.line > 0 && error.column > 0, "an error without a location: {error}");
                    errors += 1;
                }
                Ok(scenario) if runs < RUNS_MAX => {
                    runs += 1;
                    for policy_run in &scenario.runs {
                        let outcome = catch_unwind(AssertUnwindSafe(|| run(&scenario, policy_run, 0)));
                        let outcome = outcome.unwrap_or_else(|_| {
                            panic!("running panicked on a mutant of {}:\n{mutant}", file.display())
                        });
                        // Whatever durable data the mutant seeds, the harness's own tasks never panic.
                        let panicked: Vec<&String> =
                            outcome.failures.iter().filter(|f| f.contains("panicked")).collect();
                        assert!(panicked.is_empty(), "{panicked:?} on a mutant of {}:\n{mutant}", file.display());
                    }
                }
                Ok(_) => {}
            }
        }
    }
    assert!(errors > 0 && runs > 0, "the mutations exercised both paths ({errors} errors, {runs} runs)");
}

/// A harness whose worker panics on every turn, as any harness's code may.
struct Panicking;

struct PanickingWorker;

impl rig::HarnessFactory for Panicking {
    fn name(&self) -> &str {
        "panicking"
    }

    fn start(&self, _policy: &str, _env: rig::HarnessEnv) -> std::rc::Rc<dyn rig::Provider> {
        std::rc::Rc::new(PanickingWorker)
    }
}

impl rig::Provider for PanickingWorker {
    fn invoke(
        self: std::rc::Rc<Self>,
        call: rig::Invocation,
        _bus: rig::Bus,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = rig::Answer>>> {
        Box::pin(async move { panic!("the worker cannot serve {}", call.function_id) })
    }
}

#[test]
fn a_harness_that_panics_is_reported_as_such_with_its_message() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/smoke/healthy-turn.toml");
    let scenario = Scenario::load(&file).unwrap();
    let harness: std::sync::Arc<dyn rig::HarnessFactory> = std::sync::Arc::new(Panicking);
    let outcome =
        rig::run_with(&harness, &scenario, scenario.run_of("reference").unwrap(), 0).expect("it serves turns");
    assert!(!outcome.passed);
    let line = "the harness panicked on `harness`: the worker cannot serve harness::turn (at ";
    assert!(outcome.failures.iter().any(|f| f.starts_with(line)), "{:#?}", outcome.failures);
}

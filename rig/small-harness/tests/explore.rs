//! The explorer's abstract state is read through the record layout and what the services saw,
//! so it means the same for the small harness as for the reference: the same workload, run by two
//! correct harnesses, ends in the same abstract state; and a guided exploration of it is
//! deterministic here too.

use rig::explore::{self, Abstraction, Campaign, Runs};
use rig::Scenario;
use std::path::Path;
use std::sync::Arc;

fn workload(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/workloads").join(name);
    explore::workload(&Scenario::load(&path).unwrap(), false)
}

fn last_state(harness: &Arc<dyn rig::HarnessFactory>, scenario: &Scenario) -> String {
    let outcome = Runs::run(harness, scenario, &explore::bare_run("reference"), 0);
    Abstraction::new(scenario, Runs::layout(harness)).last_state(outcome.trace.events())
}

#[test]
fn a_workload_ends_in_the_abstract_state_it_ends_in_under_the_reference() {
    let mut served = 0;
    for name in ["rounds-any-harness.toml", "input-queued-any-harness.toml", "lease-taken-over-any-harness.toml"] {
        let scenario = workload(name);
        if Runs::skip(&small_harness::factory(), &scenario, "reference").is_some() {
            continue;
        }
        served += 1;
        let small = last_state(&small_harness::factory(), &scenario);
        if name == "rounds-any-harness.toml" {
            assert!(small.contains("action 1: intent"), "the actions are read through the layout: {small}");
        }
        // How many grants a takeover took is each harness's own way with leases; what became of
        // the actions, turns, messages and inputs is the same.
        let outcome =
            |state: &str| state.split("; ").filter(|part| !part.starts_with("lease ")).collect::<Vec<_>>().join("; ");
        assert_eq!(outcome(&small), outcome(&last_state(&rig::reference(), &scenario)), "{name}");
    }
    assert!(served > 0);
}

#[test]
fn a_guided_exploration_makes_the_same_runs_again() {
    let harness = small_harness::factory();
    let scenario = workload("rounds-any-harness.toml");
    let explore = || {
        let mut campaign = Campaign::new(&harness, &scenario, "reference", 7..55, false).unwrap();
        let mut runs = Vec::new();
        loop {
            let trials = campaign.batch();
            if trials.is_empty() {
                break;
            }
            for trial in &trials {
                let tried = campaign.try_mix(trial);
                runs.push((tried.mix.iter().map(|p| p.id()).collect::<Vec<_>>(), tried.fired.clone()));
                campaign.fold(tried);
            }
        }
        (runs, campaign.coverage.states(), campaign.corpus().count())
    };
    let (runs, states, corpus) = explore();
    assert_eq!(runs.len(), 48);
    assert!(corpus > 1, "some run reached a state the uncut run did not");
    assert_eq!(explore(), (runs, states, corpus));
}

//! Every rule of every oracle bites: rig/docs/oracles.md ("Every rule bites") names, for each
//! rule, a known-bad policy and a shipped file in which that rule alone makes its oracle fire.
//! Each row runs here at seed 0: the oracle fires, every violation it reports says what the row
//! says (so no other rule of the oracle fires there, and a weakened rule leaves the file's
//! declared violation unmet), and the file declares the violation for that policy.

use rig::{Oracle, Scenario};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// One row of the table.
#[derive(Debug)]
struct Rule {
    oracle: String,
    rule: String,
    policy: String,
    file: PathBuf,
    says: String,
}

/// The text between the first pair of `open`/`close` in `cell`.
fn between(cell: &str, open: char, close: char) -> Option<&str> {
    let start = cell.find(open)? + open.len_utf8();
    let end = start + cell[start..].find(close)?;
    Some(&cell[start..end])
}

fn rules() -> Vec<Rule> {
    let page = std::fs::read_to_string(workspace().join("rig/docs/oracles.md")).unwrap();
    let table = page.split("## Every rule bites").nth(1).expect("oracles.md has the section");
    table
        .lines()
        .skip_while(|line| !line.starts_with("| oracle | rule |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            let [oracle, rule, known_bad, file, says] = cells[..] else { panic!("a row of five cells: {line}") };
            let link = between(file, '(', ')').expect("the file cell is a link");
            Rule {
                oracle: between(oracle, '`', '`').expect("the oracle in backticks").to_string(),
                rule: rule.to_string(),
                policy: between(known_bad, '`', '`').expect("the policy in backticks").to_string(),
                file: workspace().join("rig/docs").join(link),
                says: says.trim_matches('"').to_string(),
            }
        })
        .collect()
}

#[test]
fn every_oracle_has_a_row_for_each_of_its_rules() {
    let rules = rules();
    assert!(rules.len() >= Oracle::ALL.len(), "the table has {} rows", rules.len());
    let covered: BTreeSet<&str> = rules.iter().map(|r| r.oracle.as_str()).collect();
    for oracle in Oracle::ALL {
        assert!(covered.contains(oracle.name()), "no rule of `{}` in the table", oracle.name());
    }
}

#[test]
fn each_rule_alone_makes_its_oracle_fire_in_its_file() {
    let mut wrong = Vec::new();
    for rule in rules() {
        let scenario = Scenario::load(&rule.file).unwrap_or_else(|e| panic!("{}: {e}", rule.file.display()));
        let Some(run) = scenario.run_of(&rule.policy) else {
            wrong.push(format!("{}: no [policy.{}]", rule.file.display(), rule.policy));
            continue;
        };
        let oracle = Oracle::from_name(&rule.oracle).expect("an oracle's name");
        if !run.expected_violations.contains(&oracle) {
            wrong.push(format!("{} [{}]: does not declare `{}`", rule.file.display(), rule.policy, rule.oracle));
        }
        let outcome = rig::run(&scenario, run, 0);
        let details: Vec<&str> =
            outcome.violations.iter().filter(|v| v.oracle == oracle).map(|v| v.detail.as_str()).collect();
        if details.is_empty() || details.iter().any(|d| !d.contains(&rule.says)) {
            wrong.push(format!(
                "`{}` ({}) in {} [{}]: expected every violation to say \"{}\", got {details:#?}",
                rule.oracle,
                rule.rule,
                rule.file.display(),
                rule.policy,
                rule.says
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

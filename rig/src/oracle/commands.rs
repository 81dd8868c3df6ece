//! A rule of `cancellation` for the control commands themselves: a turn is cancelled, paused or
//! resumed only by a command naming it. The contract gives a turn no other way to end
//! `cancelled` (a `cancel` or a `stop` ends it so), to be parked (`pause`) or to leave its park
//! for `running` (a `resume`'s claim); and a command is about the turn it was recorded for (its
//! `turn_id`), never the later turn its session holds once that one ended. So a harness that
//! applies a stale command to whichever turn the session holds now, or that records a turn its
//! timeout gave up on as `cancelled`, is seen here, whatever the file expects.

use super::{violation, Evidence, Oracle, Violation, CONTROL_SCOPE};
use crate::trace::EventKind;
use std::collections::{BTreeMap, BTreeSet};

/// What moved a turn, and the commands that may move it so.
#[derive(Clone, Copy)]
enum Move {
    Cancelled,
    Paused,
    Resumed,
}

impl Move {
    fn commands(self) -> &'static [&'static str] {
        match self {
            Move::Cancelled => &["cancel", "stop"],
            Move::Paused => &["pause"],
            Move::Resumed => &["resume"],
        }
    }

    fn what(self) -> &'static str {
        match self {
            Move::Cancelled => "ended `cancelled`",
            Move::Paused => "was paused",
            Move::Resumed => "was taken from `paused` back to `running`",
        }
    }
}

/// Every command of each session the run's control records ever held (seeded or committed), as
/// `(key, command, turn_id, state)`, each key once with the states it was recorded in.
type Commands<'a> = BTreeMap<&'a str, BTreeMap<&'a str, (&'a str, Option<&'a str>, BTreeSet<&'a str>)>>;

fn commands<'a>(evidence: &Evidence<'a>) -> Commands<'a> {
    let mut all: Commands<'a> = BTreeMap::new();
    let seeded = evidence
        .seeded
        .iter()
        .filter(|(scope, _, _)| scope == CONTROL_SCOPE)
        .map(|(_, key, value)| (key.as_str(), value));
    let committed = evidence.events.iter().filter_map(|event| match &event.kind {
        EventKind::Commit { scope, key, value, .. } if scope == CONTROL_SCOPE => Some((key.as_str(), &**value)),
        _ => None,
    });
    for (session, control) in seeded.chain(committed) {
        for (key, command) in control["commands"].as_object().into_iter().flatten() {
            let entry = all.entry(session).or_default().entry(key.as_str()).or_insert((
                command["command"].as_str().unwrap_or("?"),
                command["turn_id"].as_str(),
                BTreeSet::new(),
            ));
            entry.2.insert(command["state"].as_str().unwrap_or("?"));
        }
    }
    all
}

/// A turn record committed by a worker (not the scenario's own writes) that cancelled, paused
/// or resumed its turn, with no command of that kind recorded for the turn in the session's
/// control record at any time in the run. A command counts in any state it was recorded in but
/// `rejected` (refused, it moves nothing; one accepted first and refused later still counts),
/// and one recorded with no turn names whichever turn its session holds. A turn that was already
/// so before the write (seeded, or written so before) is not moved by it.
pub(super) fn moved_without_a_command(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let commands = commands(evidence);
    let names = |session: &str, turn: &str, movement: Move| -> bool {
        commands.get(session).is_some_and(|of_session| {
            of_session.values().any(|(command, turn_id, states)| {
                movement.commands().contains(command)
                    && turn_id.is_none_or(|id| id == turn)
                    && states.iter().any(|state| *state != "rejected")
            })
        })
    };
    // Each session's turn as it last stood: (turn id, status).
    let mut last: BTreeMap<&str, (&str, &str)> = evidence
        .seeded
        .iter()
        .filter(|(scope, _, value)| *scope == layout.turn_scope && !value.is_null())
        .map(|(_, key, value)| (key.as_str(), (layout.turn_id(value), layout.status(value))))
        .collect();
    // The store handles one call at a time: what it commits follows that call.
    let mut caller: Option<&str> = None;
    for event in evidence.events {
        match &event.kind {
            EventKind::Call { function, caller: sender, .. } if function.starts_with("state::") => {
                caller = sender.as_deref();
            }
            EventKind::Commit { scope, key, value, .. } if *scope == layout.turn_scope && !value.is_null() => {
                let (turn, status) = (layout.turn_id(value), layout.status(value));
                let before = last.insert(key.as_str(), (turn, status));
                // A scenario's `put` (committed with no store call before it) and the driver's
                // own store calls are a person's writes: they need no command.
                if event.host == crate::topology::DRIVER || caller == Some(crate::topology::DRIVER) {
                    continue;
                }
                let was = before.filter(|(of, _)| *of == turn).map(|(_, status)| status);
                let movement = if status == "cancelled" && was != Some(status) {
                    Move::Cancelled
                } else if layout.is_parked(value) && was != Some(status) {
                    Move::Paused
                } else if was.is_some_and(|was| layout.parked_statuses.iter().any(|p| p == was)) && status == "running"
                {
                    Move::Resumed
                } else {
                    continue;
                };
                if names(key, turn, movement) {
                    continue;
                }
                let seen: Vec<String> = commands
                    .get(key.as_str())
                    .into_iter()
                    .flatten()
                    .map(|(id, (command, turn_id, states))| {
                        let states: Vec<&str> = states.iter().copied().collect();
                        format!("{id} ({command} of {}, {})", turn_id.unwrap_or("no turn"), states.join("/"))
                    })
                    .collect();
                violations.push(violation(
                    Oracle::Cancellation,
                    format!(
                        "turn {key}/{turn} {} at {} ms with no {} naming it recorded: the commands of session {key} were {}",
                        movement.what(),
                        event.at_ms,
                        movement.commands().join(" or "),
                        if seen.is_empty() { "none".to_string() } else { seen.join(", ") }
                    ),
                ));
            }
            _ => {}
        }
    }
}

//! Fault rules: which frames to cut, and how.
//!
//! A rule is read from one of three places that must agree: a `--rule` command-line string, a
//! `[[rule]]` table of a TOML file (also embedded in the rig's scenario files) and a JSON body
//! posted to the admin endpoint. The TOML and JSON forms are the serde shape of [`Rule`]; the
//! command-line form is parsed into the same struct, so one validation serves all three.

use crate::field::{all_match, FieldMatch};
use crate::project::{Projection, Values};
use rand::Rng;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The longest delay a rule may ask for (10 minutes): a limit on how long a frame is held.
pub const MAX_DELAY_MS: u64 = 600_000;
/// The most rules one proxy holds, so the admin endpoint cannot grow memory without bound.
pub const MAX_RULES: usize = 1024;
/// The longest close reason: a close frame's payload is at most 125 bytes, 2 of them the code.
pub const MAX_CLOSE_REASON_BYTES: usize = 123;
/// How long a `reorder` holds a frame for its partner when the rule gives no `delay_ms`.
pub const REORDER_HOLD_MS_DEFAULT: u64 = 10_000;

/// Which way a frame travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Client to upstream.
    Up,
    /// Upstream to client.
    Down,
}

impl Direction {
    /// The name used on the command line and in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}

/// Which directions a rule watches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Directions {
    Up,
    Down,
    #[default]
    Both,
}

impl Directions {
    fn admits(self, direction: Direction) -> bool {
        matches!(
            (self, direction),
            (Directions::Both, _) | (Directions::Up, Direction::Up) | (Directions::Down, Direction::Down)
        )
    }
}

/// The kind of a WebSocket frame as the rules and the log see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    Text,
    Binary,
    Ping,
    Pong,
    Close,
}

impl FrameKind {
    /// The name used on the command line and in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Text => "text",
            FrameKind::Binary => "binary",
            FrameKind::Ping => "ping",
            FrameKind::Pong => "pong",
            FrameKind::Close => "close",
        }
    }
}

/// Which data frames a rule watches; control frames are never cut by rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KindFilter {
    Text,
    Binary,
}

/// What a rule does to a frame it selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    Drop,
    Delay,
    Duplicate,
    Close,
    /// Hold the frame until the next frame the rule selects in the same direction of the same
    /// connection (its partner) has passed, then send it: the two arrive in the opposite order.
    Reorder,
}

/// How many frames a rule may fire on before it stops matching.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Count {
    #[default]
    Once,
    Times(u64),
    Always,
}

impl Count {
    fn budget(self) -> Option<u64> {
        match self {
            Count::Once => Some(1),
            Count::Times(n) => Some(n),
            Count::Always => None,
        }
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Count::Once => f.write_str("once"),
            Count::Times(n) => write!(f, "times={n}"),
            Count::Always => f.write_str("always"),
        }
    }
}

impl Serialize for Count {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Count::Once => serializer.serialize_str("once"),
            Count::Always => serializer.serialize_str("always"),
            Count::Times(n) => serializer.serialize_u64(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;
        const EXPECTED: &str = "\"once\", \"always\" or a positive integer";
        impl serde::de::Visitor<'_> for CountVisitor {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Count, E> {
                match v {
                    "once" => Ok(Count::Once),
                    "always" => Ok(Count::Always),
                    other => Err(E::custom(format!("invalid count `{other}`, expected {EXPECTED}"))),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Count, E> {
                if v == 0 {
                    Err(E::custom(format!("invalid count 0, expected {EXPECTED}")))
                } else {
                    Ok(Count::Times(v))
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Count, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("invalid count {v}, expected {EXPECTED}")))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        deserializer.deserialize_any(CountVisitor)
    }
}

/// A scalar a `match` table compares a field with.
///
/// Strings, numbers and booleans are kept as the text [`FieldMatch`] compares; a JSON `null`
/// stays apart, because it means a field that is `null` and never the string `"null"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchValue {
    Text(String),
    Null,
}

impl MatchValue {
    /// The condition this value sets on the field at `path`.
    fn condition(&self, path: &str) -> Result<FieldMatch, crate::field::FieldMatchError> {
        match self {
            MatchValue::Text(text) => FieldMatch::new(path, text.clone()),
            MatchValue::Null => FieldMatch::null(path),
        }
    }

    /// The value as the command-line form writes it (where `null` is text like any other).
    fn text(&self) -> &str {
        match self {
            MatchValue::Text(text) => text,
            MatchValue::Null => "null",
        }
    }
}

impl Serialize for MatchValue {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            MatchValue::Text(text) => serializer.serialize_str(text),
            MatchValue::Null => serializer.serialize_unit(),
        }
    }
}

impl<'de> Deserialize<'de> for MatchValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        // Numbers take the text serde_json gives them, so a TOML `step = 1` or `ratio = 1.5`
        // reads exactly like the frame's JSON `1` or `1.5` does through `value_text`.
        impl serde::de::Visitor<'_> for ScalarVisitor {
            type Value = MatchValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number, boolean or null")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MatchValue, E> {
                Ok(MatchValue::Text(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<MatchValue, E> {
                Ok(MatchValue::Text(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<MatchValue, E> {
                Ok(MatchValue::Text(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<MatchValue, E> {
                Ok(MatchValue::Text(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<MatchValue, E> {
                match serde_json::Number::from_f64(v) {
                    Some(n) => Ok(MatchValue::Text(n.to_string())),
                    None => Err(E::custom(format!("{v} cannot appear in JSON"))),
                }
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<MatchValue, E> {
                Ok(MatchValue::Null)
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<MatchValue, E> {
                Ok(MatchValue::Null)
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

/// One fault rule, in the shape of a TOML `[[rule]]` table or an admin JSON body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// A name for the admin endpoint and the log; the rule set names unnamed rules `rule-N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub action: ActionKind,
    /// How long a `delay` holds the frame; for `reorder`, the longest it waits for its partner
    /// (then it is sent anyway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The code a `close` sends to both peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_code: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_reason: Option<String>,
    #[serde(default)]
    pub count: Count,
    /// Frames the rule selects and lets through before it starts firing (the N+1-th is the first
    /// it takes), so a rule can pick out the n-th of many like frames.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skip: u64,
    #[serde(default)]
    pub direction: Directions,
    /// Only text or only binary frames; both when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<KindFilter>,
    /// The chance that a frame the rule selects is cut (1.0 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// JSON fields by dotted path and the text each must have.
    #[serde(default, rename = "match", skip_serializing_if = "BTreeMap::is_empty")]
    pub matches: BTreeMap<String, MatchValue>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why a rule, or a rules file, could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RuleError {
    #[error("rule `{rule}`: {problem}")]
    Invalid { rule: String, problem: String },
    #[error("rules file {path}: {message}")]
    File { path: String, message: String },
    #[error("too many rules (at most {MAX_RULES})")]
    TooMany,
    #[error("a rule named `{0}` already exists")]
    DuplicateName(String),
}

/// What to do with one frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Forward,
    Drop,
    /// Hold the frame (and, to keep order, the frames behind it in the same direction).
    Delay(u64),
    /// Forward the frame twice.
    Duplicate,
    /// Swallow the frame and close both peers with this code and reason.
    Close {
        code: u16,
        reason: String,
    },
    /// Hold the frame until its partner (the next frame the same rule selects, in the same
    /// direction of the same connection) has passed, at most this many milliseconds.
    Reorder(u64),
}

impl Action {
    /// The name written to the log.
    pub fn as_str(&self) -> &'static str {
        match self {
            Action::Forward => "forward",
            Action::Drop => "drop",
            Action::Delay(_) => "delay",
            Action::Duplicate => "duplicate",
            Action::Close { .. } => "close",
            Action::Reorder(_) => "reorder",
        }
    }
}

/// The rule that fired on a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleHit {
    /// Position in the rule set when it fired.
    pub index: usize,
    pub name: String,
}

/// The verdict on one frame: which rule fired (if any) and the action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub rule: Option<RuleHit>,
    pub action: Action,
}

impl Decision {
    /// Forward unchanged, no rule involved.
    pub fn forward() -> Self {
        Decision { rule: None, action: Action::Forward }
    }
}

fn invalid(rule: &str, problem: impl Into<String>) -> RuleError {
    RuleError::Invalid { rule: rule.to_string(), problem: problem.into() }
}

/// Whether a close code may be sent in a close frame (RFC 6455 section 7.4).
fn sendable_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

impl Rule {
    /// A rule with this action and every other field at its default.
    pub fn new(action: ActionKind) -> Self {
        Rule {
            name: None,
            action,
            delay_ms: None,
            close_code: None,
            close_reason: None,
            count: Count::Once,
            skip: 0,
            direction: Directions::Both,
            kind: None,
            probability: None,
            matches: BTreeMap::new(),
        }
    }

    /// Reads the command-line form `ACTION [COUNT] [DIRECTION] [KIND] [p=P] [--] [PATH=VALUE]...`.
    ///
    /// Options may come in any order before the first condition; `--` ends them early so a
    /// condition on a field called `p` or `times` can be written. Double quotes group words
    /// (`text="a b"`), so the whole rule can be one shell argument.
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let words = split_words(text).map_err(|problem| invalid(text, problem))?;
        let mut words = words.into_iter().peekable();
        let action = words.next().ok_or_else(|| {
            invalid(
                text,
                "empty rule; expected ACTION (drop, delay=MS, duplicate, reorder[=MS] or close=CODE[:REASON])",
            )
        })?;
        let mut rule = parse_action(text, &action)?;
        let (mut count, mut direction, mut kind, mut probability, mut skip) = (None, None, None, None, None);
        while let Some(word) = words.peek() {
            let word = word.as_str();
            fn set<T>(slot: &mut Option<T>, value: T, what: &str, text: &str) -> Result<(), RuleError> {
                match slot.replace(value) {
                    Some(_) => Err(invalid(text, format!("{what} given twice"))),
                    None => Ok(()),
                }
            }
            match word {
                "--" => {
                    words.next();
                    break;
                }
                "once" => set(&mut count, Count::Once, "count", text)?,
                "always" => set(&mut count, Count::Always, "count", text)?,
                "up" => set(&mut direction, Directions::Up, "direction", text)?,
                "down" => set(&mut direction, Directions::Down, "direction", text)?,
                "both" => set(&mut direction, Directions::Both, "direction", text)?,
                "text" => set(&mut kind, KindFilter::Text, "frame kind", text)?,
                "binary" => set(&mut kind, KindFilter::Binary, "frame kind", text)?,
                _ => {
                    // `times=N`, or a bare `N` as in the TOML form's `count = N`.
                    let times =
                        word.strip_prefix("times=").or(word.bytes().all(|b| b.is_ascii_digit()).then_some(word));
                    if let Some(n) = times {
                        let n = n.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                            invalid(
                                text,
                                format!("bad count `{word}`, expected times=N or N with N a positive integer"),
                            )
                        })?;
                        set(&mut count, Count::Times(n), "count", text)?;
                    } else if let Some(n) = word.strip_prefix("skip=") {
                        let n = n.parse::<u64>().map_err(|_| {
                            invalid(text, format!("bad skip `{word}`, expected skip=N with N a whole number"))
                        })?;
                        set(&mut skip, n, "skip", text)?;
                    } else if let Some(p) = word.strip_prefix("p=") {
                        let p = p.parse::<f64>().map_err(|_| {
                            invalid(text, format!("bad probability `{word}`, expected p=P with 0 <= P <= 1"))
                        })?;
                        set(&mut probability, p, "probability", text)?;
                    } else if word.contains('=') {
                        break;
                    } else {
                        return Err(invalid(
                            text,
                            format!("unexpected word `{word}`; expected once, always, times=N, N, skip=N, up, down, both, text, binary, p=P or PATH=VALUE"),
                        ));
                    }
                }
            }
            words.next();
        }
        for word in words {
            let condition = FieldMatch::parse(&word).map_err(|e| invalid(text, e.to_string()))?;
            if rule.matches.insert(condition.path(), MatchValue::Text(condition.expected().to_string())).is_some() {
                return Err(invalid(text, format!("field `{}` given twice", condition.path())));
            }
        }
        rule.count = count.unwrap_or_default();
        rule.skip = skip.unwrap_or(0);
        rule.direction = direction.unwrap_or_default();
        rule.kind = kind;
        rule.probability = probability;
        rule.compile(text)?;
        Ok(rule)
    }

    /// A short text naming the rule in errors: its name or its command-line form.
    pub fn label(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.to_string())
    }

    /// Checks the fields belong together and builds the matcher; `label` names it in errors.
    fn compile(&self, label: &str) -> Result<Compiled, RuleError> {
        let action = match self.action {
            ActionKind::Drop => Action::Drop,
            ActionKind::Duplicate => Action::Duplicate,
            ActionKind::Delay => {
                let ms = self.delay_ms.ok_or_else(|| invalid(label, "action delay needs delay_ms"))?;
                if ms > MAX_DELAY_MS {
                    return Err(invalid(label, format!("delay_ms {ms} is above the limit of {MAX_DELAY_MS}")));
                }
                Action::Delay(ms)
            }
            ActionKind::Close => {
                let code = self.close_code.ok_or_else(|| invalid(label, "action close needs close_code"))?;
                if !sendable_close_code(code) {
                    return Err(invalid(
                        label,
                        format!("close code {code} cannot be sent; expected 1000-1003, 1007-1014 or 3000-4999"),
                    ));
                }
                let reason = self.close_reason.clone().unwrap_or_default();
                if reason.len() > MAX_CLOSE_REASON_BYTES {
                    return Err(invalid(
                        label,
                        format!(
                            "close reason is {} bytes, at most {MAX_CLOSE_REASON_BYTES} fit in a close frame",
                            reason.len()
                        ),
                    ));
                }
                Action::Close { code, reason }
            }
            ActionKind::Reorder => {
                let ms = self.delay_ms.unwrap_or(REORDER_HOLD_MS_DEFAULT);
                if ms > MAX_DELAY_MS {
                    return Err(invalid(label, format!("delay_ms {ms} is above the limit of {MAX_DELAY_MS}")));
                }
                Action::Reorder(ms)
            }
        };
        if self.delay_ms.is_some() && !matches!(self.action, ActionKind::Delay | ActionKind::Reorder) {
            return Err(invalid(label, "delay_ms is only for actions delay and reorder"));
        }
        if (self.close_code.is_some() || self.close_reason.is_some()) && self.action != ActionKind::Close {
            return Err(invalid(label, "close_code and close_reason are only for action close"));
        }
        if let Some(p) = self.probability {
            if !(0.0..=1.0).contains(&p) {
                return Err(invalid(label, format!("probability {p} is outside 0..=1")));
            }
        }
        if let Some(name) = &self.name {
            if name.is_empty() || name.len() > 128 || name.contains(['/', '?', '#', ' ']) {
                return Err(invalid(label, "name must be 1-128 characters without `/`, `?`, `#` or spaces"));
            }
        }
        let conditions = self
            .matches
            .iter()
            .map(|(path, value)| value.condition(path))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(label, e.to_string()))?;
        Ok(Compiled { action, conditions })
    }

    /// Checks the rule is complete and consistent, as [`RuleSet::push`] will.
    pub fn validate(&self) -> Result<(), RuleError> {
        self.compile(&self.label()).map(|_| ())
    }
}

/// The command-line form, which [`Rule::parse`] reads back (names are not part of it).
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.action {
            ActionKind::Drop => f.write_str("drop")?,
            ActionKind::Duplicate => f.write_str("duplicate")?,
            ActionKind::Reorder => match self.delay_ms {
                Some(ms) => write!(f, "reorder={ms}")?,
                None => f.write_str("reorder")?,
            },
            // A value that is missing is shown missing, not as a made-up 0.
            ActionKind::Delay => match self.delay_ms {
                Some(ms) => write!(f, "delay={ms}")?,
                None => f.write_str("delay")?,
            },
            ActionKind::Close => {
                match self.close_code {
                    Some(code) => write!(f, "close={code}")?,
                    None => f.write_str("close")?,
                }
                if let Some(reason) = &self.close_reason {
                    write!(f, ":{}", quote_word(reason))?;
                }
            }
        }
        write!(f, " {}", self.count)?;
        if self.skip > 0 {
            write!(f, " skip={}", self.skip)?;
        }
        let direction = match self.direction {
            Directions::Up => "up",
            Directions::Down => "down",
            Directions::Both => "both",
        };
        write!(f, " {direction}")?;
        match self.kind {
            Some(KindFilter::Text) => f.write_str(" text")?,
            Some(KindFilter::Binary) => f.write_str(" binary")?,
            None => {}
        }
        if let Some(p) = self.probability {
            write!(f, " p={p}")?;
        }
        if !self.matches.is_empty() {
            f.write_str(" --")?;
        }
        for (path, value) in &self.matches {
            write!(f, " {}", quote_word(&format!("{path}={}", value.text())))?;
        }
        Ok(())
    }
}

fn quote_word(word: &str) -> String {
    if word.is_empty() || word.contains([' ', '\t', '\n', '"', '\\']) {
        let escaped = word.replace('\\', "\\\\").replace('"', "\\\"");
        format!("\"{escaped}\"")
    } else {
        word.to_string()
    }
}

/// Splits on whitespace; double quotes group, and inside them `\"` and `\\` escape.
fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        None => return Err("unterminated double quote".to_string()),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e @ ('"' | '\\')) => current.push(e),
                            Some(other) => {
                                current.push('\\');
                                current.push(other);
                            }
                            None => return Err("unterminated double quote".to_string()),
                        },
                        Some(other) => current.push(other),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                current.push(c);
            }
        }
    }
    if in_word {
        words.push(current);
    }
    Ok(words)
}

fn parse_action(text: &str, word: &str) -> Result<Rule, RuleError> {
    let expected = "expected ACTION: drop, delay=MS, duplicate, reorder[=MS] or close=CODE[:REASON]";
    let (name, arg) = match word.split_once('=') {
        Some((name, arg)) => (name, Some(arg)),
        None => (word, None),
    };
    match (name, arg) {
        ("drop", None) => Ok(Rule::new(ActionKind::Drop)),
        ("reorder", None) => Ok(Rule::new(ActionKind::Reorder)),
        ("reorder", Some(ms)) => {
            let ms = ms.parse::<u64>().map_err(|_| {
                invalid(
                    text,
                    format!("bad reorder `{word}`, expected reorder=MS with MS the longest hold in milliseconds"),
                )
            })?;
            let mut rule = Rule::new(ActionKind::Reorder);
            rule.delay_ms = Some(ms);
            Ok(rule)
        }
        ("duplicate", None) => Ok(Rule::new(ActionKind::Duplicate)),
        ("delay", Some(ms)) => {
            let ms = ms.parse::<u64>().map_err(|_| {
                invalid(text, format!("bad delay `{word}`, expected delay=MS with MS a whole number of milliseconds"))
            })?;
            let mut rule = Rule::new(ActionKind::Delay);
            rule.delay_ms = Some(ms);
            Ok(rule)
        }
        ("close", Some(arg)) => {
            let (code, reason) = match arg.split_once(':') {
                Some((code, reason)) => (code, Some(reason.to_string())),
                None => (arg, None),
            };
            let code = code
                .parse::<u16>()
                .map_err(|_| invalid(text, format!("bad close `{word}`, expected close=CODE or close=CODE:REASON")))?;
            let mut rule = Rule::new(ActionKind::Close);
            rule.close_code = Some(code);
            rule.close_reason = reason;
            Ok(rule)
        }
        ("delay" | "close", None) => Err(invalid(text, format!("`{word}` needs a value; {expected}"))),
        ("drop" | "duplicate", Some(_)) => Err(invalid(text, format!("`{name}` takes no value; {expected}"))),
        _ => Err(invalid(text, format!("unknown action `{word}`; {expected}"))),
    }
}

/// The `[[rule]]` array of a rules file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    rule: Vec<toml::Spanned<Rule>>,
}

/// Reads the rules of a TOML text; `origin` names it in errors (a path, usually).
pub fn parse_rules_toml(text: &str, origin: &str) -> Result<Vec<Rule>, RuleError> {
    let at = |offset: usize| {
        let (line, column) = line_column(text, offset);
        format!("line {line}, column {column}: ")
    };
    let file_error = |message: String| RuleError::File { path: origin.to_string(), message };
    let file: RulesFile = toml::from_str(text).map_err(|e| {
        file_error(format!("{}{}", e.span().map(|span| at(span.start)).unwrap_or_default(), e.message()))
    })?;
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, rule) in file.rule.iter().enumerate() {
        let start = rule.span().start;
        rule.get_ref().validate().map_err(|e| file_error(format!("{}rule {} of the file: {e}", at(start), i + 1)))?;
        if let Some(name) = &rule.get_ref().name {
            if let Some(first) = names.insert(name, start) {
                let (first_line, _) = line_column(text, first);
                return Err(file_error(format!(
                    "{}rule {} of the file: the name `{name}` is already used by the rule at line {first_line}",
                    at(start),
                    i + 1
                )));
            }
        }
    }
    Ok(file.rule.into_iter().map(toml::Spanned::into_inner).collect())
}

/// Reads a rules file from disk.
pub fn load_rules_file(path: &Path) -> Result<Vec<Rule>, RuleError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| RuleError::File { path: path.display().to_string(), message: e.to_string() })?;
    parse_rules_toml(&text, &path.display().to_string())
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..text.floor_char_boundary_compat(offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, index: usize) -> usize;
}

impl FloorCharBoundary for str {
    fn floor_char_boundary_compat(&self, index: usize) -> usize {
        let mut i = index.min(self.len());
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

#[derive(Clone, Debug)]
struct Compiled {
    action: Action,
    conditions: Vec<FieldMatch>,
}

/// A rule's conditions as indices into the rule set's [`Projection`].
type ProjectedConditions = Vec<usize>;

#[derive(Clone, Debug)]
struct Entry {
    name: String,
    rule: Rule,
    compiled: Compiled,
    /// Frames the rule may still fire on; `None` for `always`.
    remaining: Option<u64>,
    /// Selected frames let through so far, up to the rule's `skip`.
    skipped: u64,
}

/// A rule as listed by [`RuleSet::rules`]: its name, its definition and how often it may still fire.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleStatus {
    pub name: String,
    #[serde(flatten)]
    pub rule: Rule,
    /// `null` for a rule that never runs out.
    pub remaining: Option<u64>,
}

/// The ordered rules of one proxy, their remaining counts and the seeded generator for probabilities.
#[derive(Clone, Debug)]
pub struct RuleSet {
    entries: Vec<Entry>,
    /// Every path the rules read, walked once per frame; rebuilt when the rules change.
    projection: Projection,
    /// For each entry, its conditions' paths in `projection`.
    projected: Vec<ProjectedConditions>,
    seed: u64,
    rng: ChaCha8Rng,
    /// Source of `rule-N` names; never reused, so a deleted name stays deleted.
    next_id: u64,
}

impl RuleSet {
    /// An empty set whose probabilities are drawn from ChaCha8 seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        RuleSet {
            entries: Vec::new(),
            projection: Projection::default(),
            projected: Vec::new(),
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            next_id: 1,
        }
    }

    /// A set holding these rules in order.
    pub fn with_rules(seed: u64, rules: impl IntoIterator<Item = Rule>) -> Result<Self, RuleError> {
        let mut set = RuleSet::new(seed);
        for rule in rules {
            set.push(rule)?;
        }
        Ok(set)
    }

    /// Appends a rule (it matches after every rule already there) and returns its name.
    pub fn push(&mut self, rule: Rule) -> Result<String, RuleError> {
        let compiled = rule.compile(&rule.label())?;
        if self.entries.len() >= MAX_RULES {
            return Err(RuleError::TooMany);
        }
        let name = match &rule.name {
            Some(name) => name.clone(),
            None => loop {
                let candidate = format!("rule-{}", self.next_id);
                self.next_id += 1;
                if !self.entries.iter().any(|e| e.name == candidate) {
                    break candidate;
                }
            },
        };
        if self.entries.iter().any(|e| e.name == name) {
            return Err(RuleError::DuplicateName(name));
        }
        self.entries.push(Entry { name: name.clone(), remaining: rule.count.budget(), skipped: 0, rule, compiled });
        self.project();
        Ok(name)
    }

    /// Rebuilds the projection of the paths the rules read.
    fn project(&mut self) {
        let mut projection = Projection::default();
        self.projected = self
            .entries
            .iter()
            .map(|e| e.compiled.conditions.iter().map(|c| projection.add(c.segments())).collect())
            .collect();
        self.projection = projection;
    }

    /// Removes the rule with this name; false if there is none.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.name != name);
        self.project();
        self.entries.len() != before
    }

    /// Removes every rule and reseeds the generator, so a reset run draws as a fresh one does.
    pub fn reset(&mut self) {
        self.entries.clear();
        self.project();
        self.rng = ChaCha8Rng::seed_from_u64(self.seed);
        self.next_id = 1;
    }

    /// The rules in match order.
    pub fn rules(&self) -> Vec<RuleStatus> {
        self.entries
            .iter()
            .map(|e| RuleStatus { name: e.name.clone(), rule: e.rule.clone(), remaining: e.remaining })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The verdict on one data frame. `json` is the frame parsed as JSON, if it is JSON text.
    ///
    /// The first rule that admits the direction and kind, whose conditions all hold, whose
    /// count is not used up and whose probability draw succeeds fires; a rule whose draw fails
    /// lets the frame fall through to the rules after it (as toxiproxy's toxicity does). The
    /// generator is drawn from only for rules with a probability below 1 that otherwise
    /// match, so the draws depend on the frames alone. Control frames (`ping`, `pong`,
    /// `close`) are never cut.
    pub fn decide(&mut self, direction: Direction, kind: FrameKind, json: Option<&serde_json::Value>) -> Decision {
        self.decide_with(direction, kind, || json.cloned())
    }

    /// Like [`decide`](Self::decide), but parses the frame only if some rule needs its fields.
    pub fn decide_with(
        &mut self,
        direction: Direction,
        kind: FrameKind,
        json: impl FnOnce() -> Option<serde_json::Value>,
    ) -> Decision {
        let mut json = Some(json);
        let mut parsed: Option<serde_json::Value> = None;
        self.decide_by(direction, kind, None, |entry, _| {
            if let Some(parse) = json.take() {
                parsed = parse();
            }
            parsed.as_ref().is_some_and(|doc| all_match(&entry.compiled.conditions, doc))
        })
    }

    /// The verdict on one data frame given as its text (`None` for binary): what the relay
    /// asks. The text is read only if a rule has conditions, and then only along the paths
    /// the rules name (see [`Projection`]), never built into a whole JSON tree.
    pub fn decide_frame(&mut self, direction: Direction, kind: FrameKind, text: Option<&str>) -> Decision {
        self.decide_frame_except(direction, kind, text, None)
    }

    /// Like [`decide_frame`](Self::decide_frame), with the rule named `except` left out: the
    /// partner of a frame a `reorder` rule holds is not taken by that rule again.
    pub fn decide_frame_except(
        &mut self,
        direction: Direction,
        kind: FrameKind,
        text: Option<&str>,
        except: Option<&str>,
    ) -> Decision {
        let projection = std::mem::take(&mut self.projection);
        let projected = std::mem::take(&mut self.projected);
        let mut read: Option<Option<Values<'_>>> = None;
        let decision = self.decide_by(direction, kind, except, |entry, index| {
            let found = read.get_or_insert_with(|| text.and_then(|text| projection.read(text)));
            let Some(found) = found else { return false };
            entry
                .compiled
                .conditions
                .iter()
                .zip(&projected[index])
                .all(|(condition, path)| found[*path].as_ref().is_some_and(|f| condition.holds_for_found(f)))
        });
        self.projection = projection;
        self.projected = projected;
        decision
    }

    /// Whether the rule named `name` selects this frame by its direction, kind and conditions
    /// alone (its count, skip and probability aside): how a relay recognises the partner of a
    /// frame that rule holds. False when no rule has the name (it was removed meanwhile).
    pub fn selects(&self, name: &str, direction: Direction, kind: FrameKind, text: Option<&str>) -> bool {
        let Some(index) = self.entries.iter().position(|e| e.name == name) else { return false };
        let entry = &self.entries[index];
        let kind_filter = match kind {
            FrameKind::Text => KindFilter::Text,
            FrameKind::Binary => KindFilter::Binary,
            FrameKind::Ping | FrameKind::Pong | FrameKind::Close => return false,
        };
        if !entry.rule.direction.admits(direction) || entry.rule.kind.is_some_and(|k| k != kind_filter) {
            return false;
        }
        if entry.compiled.conditions.is_empty() {
            return true;
        }
        let Some(found) = text.and_then(|text| self.projection.read(text)) else { return false };
        entry
            .compiled
            .conditions
            .iter()
            .zip(&self.projected[index])
            .all(|(condition, path)| found[*path].as_ref().is_some_and(|f| condition.holds_for_found(f)))
    }

    /// The first-match loop of [`decide`](Self::decide); `conditions_hold` is asked only for
    /// a rule with conditions that otherwise admits the frame.
    fn decide_by(
        &mut self,
        direction: Direction,
        kind: FrameKind,
        except: Option<&str>,
        mut conditions_hold: impl FnMut(&Entry, usize) -> bool,
    ) -> Decision {
        let kind_filter = match kind {
            FrameKind::Text => KindFilter::Text,
            FrameKind::Binary => KindFilter::Binary,
            FrameKind::Ping | FrameKind::Pong | FrameKind::Close => return Decision::forward(),
        };
        for (index, entry) in self.entries.iter_mut().enumerate() {
            if entry.remaining == Some(0)
                || except == Some(entry.name.as_str())
                || !entry.rule.direction.admits(direction)
                || entry.rule.kind.is_some_and(|k| k != kind_filter)
            {
                continue;
            }
            if !entry.compiled.conditions.is_empty() && !conditions_hold(entry, index) {
                continue;
            }
            if let Some(p) = entry.rule.probability {
                if p < 1.0 && self.rng.random::<f64>() >= p {
                    continue;
                }
            }
            if entry.skipped < entry.rule.skip {
                entry.skipped += 1;
                continue;
            }
            if let Some(remaining) = &mut entry.remaining {
                *remaining -= 1;
            }
            return Decision {
                rule: Some(RuleHit { index, name: entry.name.clone() }),
                action: entry.compiled.action.clone(),
            };
        }
        Decision::forward()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn turn_result(session: &str) -> serde_json::Value {
        json!({"type": "invocationresult", "function_id": "harness::turn", "result": {"session_id": session, "step": 1}})
    }

    #[test]
    fn parses_the_documented_example() {
        let rule =
            Rule::parse("drop once up type=invocationresult function_id=harness::turn result.session_id=s1").unwrap();
        assert_eq!(rule.action, ActionKind::Drop);
        assert_eq!(rule.count, Count::Once);
        assert_eq!(rule.direction, Directions::Up);
        assert_eq!(rule.matches.len(), 3);
        assert_eq!(rule.matches["result.session_id"], MatchValue::Text("s1".into()));
    }

    #[test]
    fn parses_every_option_and_round_trips_through_display() {
        for text in [
            "drop",
            "delay=250 always down text",
            "duplicate times=3 binary p=0.25",
            "close=4000:bye once both type=x",
            "close=1001",
            "reorder once down type=invocationresult",
            "reorder=250 times=2 up",
            "drop -- p=1 times=2",
            r#"drop text="hello world" quote="say \"hi\"""#,
        ] {
            let rule = Rule::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let again = Rule::parse(&rule.to_string()).unwrap();
            assert_eq!(rule, again, "{text} -> {rule}");
        }
        let rule = Rule::parse(r#"drop text="hello world""#).unwrap();
        assert_eq!(rule.matches["text"], MatchValue::Text("hello world".into()));
        let rule = Rule::parse("drop -- p=1 times=2").unwrap();
        assert_eq!(rule.probability, None);
        assert_eq!(rule.matches["p"], MatchValue::Text("1".into()));
        let rule = Rule::parse("close=4000:bye").unwrap();
        assert_eq!(rule.close_reason.as_deref(), Some("bye"));
    }

    #[test]
    fn rejects_bad_rules_with_the_rule_and_the_expectation() {
        for (text, needle) in [
            ("", "empty rule"),
            ("explode", "unknown action `explode`"),
            ("delay", "needs a value"),
            ("delay=soon", "delay=MS"),
            ("drop=1", "takes no value"),
            ("close=1006", "cannot be sent"),
            ("close=abc", "close=CODE"),
            ("drop times=0", "times=N"),
            ("drop p=2", "outside 0..=1"),
            ("drop p=x", "p=P"),
            ("drop once always", "count given twice"),
            ("drop sideways", "unexpected word `sideways`"),
            ("drop a..b=1", "empty segment"),
            ("drop a=1 nonsense", "expected PATH=VALUE"),
            ("drop a=1 a=2", "field `a` given twice"),
            ("drop x=\"open", "unterminated"),
            ("delay=600001", "above the limit"),
        ] {
            let err = Rule::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
            assert!(err.contains(&format!("rule `{text}`")), "{text:?}: {err}");
        }
    }

    #[test]
    fn limits_hold_up_to_and_including_their_bound() {
        assert!(Rule::parse("delay=600000").is_ok(), "the longest delay");
        assert!(Rule::parse("reorder=600000").is_ok(), "the longest reorder hold");
        assert!(Rule::parse("reorder=600001").unwrap_err().to_string().contains("above the limit"));
        let close = |reason_bytes: usize| Rule::parse(&format!("close=4000:{}", "r".repeat(reason_bytes)));
        assert!(close(MAX_CLOSE_REASON_BYTES).is_ok(), "the longest close reason");
        assert!(close(MAX_CLOSE_REASON_BYTES + 1).unwrap_err().to_string().contains("fit in a close frame"));
        let named =
            |name: &str| parse_rules_toml(&format!("[[rule]]\naction = \"drop\"\nname = \"{name}\"\n"), "r.toml");
        assert!(named(&"n".repeat(128)).is_ok(), "a name of 128 characters");
        for bad in ["n".repeat(129), String::new(), "a/b".into(), "a b".into(), "a?b".into(), "a#b".into()] {
            let err = named(&bad).unwrap_err().to_string();
            assert!(err.contains("name must be 1-128 characters"), "{bad:?}: {err}");
        }
        // A close field on another action is refused, each field alone.
        for field in ["close_code = 4000", "close_reason = \"bye\""] {
            let err = parse_rules_toml(&format!("[[rule]]\naction = \"drop\"\n{field}\n"), "r.toml").unwrap_err();
            assert!(err.to_string().contains("only for action close"), "{field}: {err}");
        }
        let err = parse_rules_toml("[[rule]]\naction = \"drop\"\ndelay_ms = 5\n", "r.toml").unwrap_err();
        assert!(err.to_string().contains("only for actions delay and reorder"), "{err}");
    }

    #[test]
    fn a_rule_reads_back_as_written_without_a_skip_it_does_not_have() {
        let rule = Rule::parse("drop once up type=x").unwrap();
        assert_eq!(rule.to_string(), "drop once up -- type=x");
        assert_eq!(rule.label(), "drop once up -- type=x", "an unnamed rule is labelled by its form");
        let named = parse_rules_toml("[[rule]]\nname = \"cut\"\naction = \"drop\"\n", "r.toml").unwrap();
        assert_eq!(named[0].label(), "cut");
        assert_eq!(Action::Drop.as_str(), "drop");
    }

    #[test]
    fn a_rules_file_is_read_from_disk_and_its_errors_say_where() {
        let path = std::env::temp_dir().join(format!("proxy-rules-{}.toml", std::process::id()));
        std::fs::write(&path, "[[rule]]\naction = \"drop\"\ncount = \"once\"\n").unwrap();
        let rules = load_rules_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!((rules.len(), rules[0].action), (1, ActionKind::Drop));
        assert!(load_rules_file(&path).unwrap_err().to_string().contains(&path.display().to_string()));
        // Line and column count characters, and an offset inside a character counts from its start.
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("é\nx", 1), (1, 1));
        assert_eq!(line_column("é\nx", 2), (1, 2));
    }

    #[test]
    fn a_rule_serializes_its_skip_only_when_it_has_one() {
        let plain = serde_json::to_value(Rule::parse("drop once up").unwrap()).unwrap();
        assert!(plain.get("skip").is_none(), "{plain}");
        let skipping = serde_json::to_value(Rule::parse("drop once up skip=2").unwrap()).unwrap();
        assert_eq!(skipping["skip"], 2, "{skipping}");
    }

    #[test]
    fn removing_says_whether_a_rule_was_there() {
        let mut set = RuleSet::with_rules(0, [Rule::parse("drop").unwrap()]).unwrap();
        assert!(!set.is_empty());
        assert!(!set.remove("rule-9"));
        assert!(set.remove("rule-1"));
        assert!(set.is_empty());
        assert_eq!(set.len(), 0);
    }

    #[test]
    fn a_rule_that_always_fires_draws_nothing_from_the_generator() {
        // Rules with probability 1 draw no number, so adding one changes no other rule's draws.
        let b = Rule::parse("drop always p=0.5 type=b").unwrap();
        let sure = Rule::parse("duplicate always p=1 type=a").unwrap();
        let mut alone = RuleSet::with_rules(7, [b.clone()]).unwrap();
        let mut with_sure = RuleSet::with_rules(7, [sure, b]).unwrap();
        let (a, b) = (json!({"type": "a"}), json!({"type": "b"}));
        let mut drawn = (Vec::new(), Vec::new());
        for _ in 0..32 {
            with_sure.decide(Direction::Up, FrameKind::Text, Some(&a));
            drawn.0.push(alone.decide(Direction::Up, FrameKind::Text, Some(&b)).action);
            drawn.1.push(with_sure.decide(Direction::Up, FrameKind::Text, Some(&b)).action);
        }
        assert_eq!(drawn.0, drawn.1);
        assert!(drawn.0.contains(&Action::Drop) && drawn.0.contains(&Action::Forward), "{:?}", drawn.0);
    }

    #[test]
    fn reads_the_toml_shape() {
        let rules = parse_rules_toml(
            r#"
[[rule]]
action = "drop"
count = "once"
direction = "up"
probability = 1.0
match = { type = "invocationresult", function_id = "harness::turn", "result.session_id" = "s1", "result.step" = 1 }

[[rule]]
action = "delay"
delay_ms = 20
count = 3

[[rule]]
name = "bye"
action = "close"
close_code = 4000
close_reason = "rig says bye"
count = "always"
direction = "down"
kind = "binary"
"#,
            "rules.toml",
        )
        .unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0].matches["result.step"], MatchValue::Text("1".into()));
        assert_eq!(rules[1].count, Count::Times(3));
        assert_eq!(rules[2].close_reason.as_deref(), Some("rig says bye"));
        let mut set = RuleSet::with_rules(0, rules).unwrap();
        let d = set.decide(Direction::Up, FrameKind::Text, Some(&turn_result("s1")));
        assert_eq!(d.action, Action::Drop);
    }

    #[test]
    fn toml_errors_name_the_file_line_and_column() {
        let err =
            parse_rules_toml("[[rule]]\naction = \"drop\"\ncount = \"twice\"\n", "r.toml").unwrap_err().to_string();
        assert!(err.contains("r.toml") && err.contains("line 3"), "{err}");
        assert!(err.contains("\"once\", \"always\" or a positive integer"), "{err}");
        let err = parse_rules_toml("[[rule]]\naction = \"drop\"\ncount = true\n", "r.toml").unwrap_err().to_string();
        assert!(err.contains("expected \"once\", \"always\" or a positive integer"), "a count of another type: {err}");
        let err = parse_rules_toml("[[rule]]\naction = \"drop\"\nactoin = 1\n", "r.toml").unwrap_err().to_string();
        assert!(err.contains("line 3") && err.contains("actoin"), "{err}");
        let err = parse_rules_toml("[[rule]]\naction = \"delay\"\n", "r.toml").unwrap_err().to_string();
        assert!(err.contains("rule 1") && err.contains("needs delay_ms"), "{err}");
        let err =
            parse_rules_toml("[[rule]]\naction = \"drop\"\nmatch = { a = [1] }\n", "r.toml").unwrap_err().to_string();
        assert!(err.contains("string, number, boolean"), "{err}");
    }

    #[test]
    fn skip_lets_the_first_selected_frames_through() {
        let rule = Rule::parse("drop once up skip=2 type=invocationresult").unwrap();
        assert_eq!(rule.skip, 2);
        assert_eq!(Rule::parse(&rule.to_string()).unwrap(), rule, "the command-line form reads back");
        let mut set = RuleSet::with_rules(0, [rule]).unwrap();
        let frame = json!({"type": "invocationresult"});
        let hits: Vec<bool> =
            (0..4).map(|_| set.decide(Direction::Up, FrameKind::Text, Some(&frame)).rule.is_some()).collect();
        assert_eq!(hits, vec![false, false, true, false], "the third selected frame, once");
        assert!(Rule::parse("drop skip=x").is_err());
    }

    #[test]
    fn first_match_wins_and_counts_run_out() {
        let mut set = RuleSet::with_rules(
            0,
            [
                Rule::parse("drop once up type=invocationresult result.session_id=s1").unwrap(),
                Rule::parse("duplicate times=2 up type=invocationresult").unwrap(),
            ],
        )
        .unwrap();
        let s1 = turn_result("s1");
        let s2 = turn_result("s2");
        // Down frames never match `up` rules.
        assert_eq!(set.decide(Direction::Down, FrameKind::Text, Some(&s1)).action, Action::Forward);
        let first = set.decide(Direction::Up, FrameKind::Text, Some(&s1));
        assert_eq!(first.action, Action::Drop);
        assert_eq!(first.rule, Some(RuleHit { index: 0, name: "rule-1".into() }));
        // The drop is used up: the next s1 frame falls to the second rule.
        assert_eq!(set.decide(Direction::Up, FrameKind::Text, Some(&s1)).action, Action::Duplicate);
        assert_eq!(set.decide(Direction::Up, FrameKind::Text, Some(&s2)).action, Action::Duplicate);
        assert_eq!(set.decide(Direction::Up, FrameKind::Text, Some(&s2)), Decision::forward());
        assert_eq!(set.rules()[0].remaining, Some(0));
    }

    #[test]
    fn non_json_and_binary_frames_only_match_rules_without_conditions() {
        let mut set = RuleSet::with_rules(
            0,
            [Rule::parse("drop always type=x").unwrap(), Rule::parse("delay=5 always binary").unwrap()],
        )
        .unwrap();
        assert_eq!(set.decide(Direction::Up, FrameKind::Text, None), Decision::forward());
        assert_eq!(set.decide(Direction::Up, FrameKind::Binary, None).action, Action::Delay(5));
        assert_eq!(set.decide(Direction::Up, FrameKind::Ping, None), Decision::forward());
        assert_eq!(set.decide(Direction::Up, FrameKind::Close, None), Decision::forward());
    }

    #[test]
    fn the_frame_is_parsed_only_when_a_rule_needs_it() {
        let mut set = RuleSet::with_rules(0, [Rule::parse("drop always binary a=1").unwrap()]).unwrap();
        let d = set.decide_with(Direction::Up, FrameKind::Text, || panic!("parsed a frame no rule reads"));
        assert_eq!(d, Decision::forward());
    }

    #[test]
    fn probability_draws_are_seeded() {
        let run = |seed| {
            let mut set = RuleSet::with_rules(seed, [Rule::parse("drop always p=0.25").unwrap()]).unwrap();
            (0..1000)
                .map(|_| set.decide(Direction::Up, FrameKind::Text, None).action == Action::Drop)
                .collect::<Vec<bool>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        let hits = a.iter().filter(|x| **x).count();
        assert!((200..300).contains(&hits), "{hits} of 1000 at p=0.25");
        // A reset reseeds: the draws start over.
        let mut set = RuleSet::with_rules(7, [Rule::parse("drop always p=0.25").unwrap()]).unwrap();
        let first: Vec<bool> =
            (0..10).map(|_| set.decide(Direction::Up, FrameKind::Text, None).action == Action::Drop).collect();
        set.reset();
        set.push(Rule::parse("drop always p=0.25").unwrap()).unwrap();
        let again: Vec<bool> =
            (0..10).map(|_| set.decide(Direction::Up, FrameKind::Text, None).action == Action::Drop).collect();
        assert_eq!(first, again);
    }

    #[test]
    fn names_are_unique_and_removable() {
        let mut set = RuleSet::new(0);
        assert_eq!(set.push(Rule::parse("drop").unwrap()).unwrap(), "rule-1");
        let mut named = Rule::parse("drop").unwrap();
        named.name = Some("cut".into());
        assert_eq!(set.push(named.clone()).unwrap(), "cut");
        assert_eq!(set.push(named), Err(RuleError::DuplicateName("cut".into())));
        assert!(set.remove("rule-1"));
        assert!(!set.remove("rule-1"));
        assert_eq!(set.push(Rule::parse("drop").unwrap()).unwrap(), "rule-2");
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn no_input_panics() {
        let sample = r#"close=4000:bye times=3 down binary p=0.5 -- a.b="x y" c=1 é=ü"#;
        let mut inputs: Vec<String> = Vec::new();
        for (i, _) in sample.char_indices() {
            for (j, _) in sample.char_indices().filter(|(j, _)| *j > i) {
                inputs.push(sample[i..j].to_string());
            }
        }
        inputs.extend(
            ["\"", "\\", "=", "==", "p=", "times=", "delay=-1", "close=99999", "drop \"\\", "drop \u{0}=\u{0}"]
                .map(String::from),
        );
        for input in &inputs {
            let _ = Rule::parse(input);
            let _ = parse_rules_toml(input, "fuzz.toml");
            let _ = parse_rules_toml(&format!("[[rule]]\naction = \"drop\"\nmatch = {{ {input} }}\n"), "fuzz.toml");
        }
        let err = parse_rules_toml("[[rule]]\nactión = \"é\"\n", "u.toml").unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn json_bodies_use_the_toml_shape() {
        let rule: Rule = serde_json::from_value(json!({
            "action": "close", "close_code": 1011, "count": 2, "direction": "down",
            "match": {"type": "x", "n": 3, "ok": true, "none": null}
        }))
        .unwrap();
        rule.validate().unwrap();
        assert_eq!(rule.matches["n"], MatchValue::Text("3".into()));
        assert_eq!(rule.matches["none"], MatchValue::Null);
        let listed = serde_json::to_value(RuleSet::with_rules(0, [rule]).unwrap().rules()).unwrap();
        assert_eq!(listed[0]["name"], "rule-1");
        assert_eq!(listed[0]["count"], 2);
        assert_eq!(listed[0]["remaining"], 2);
        assert!(serde_json::from_value::<Rule>(json!({"action": "drop", "bogus": 1})).is_err());
    }

    #[test]
    fn a_json_null_matches_only_null() {
        let rule: Rule =
            serde_json::from_value(json!({"action": "drop", "count": "always", "match": {"next": null}})).unwrap();
        let mut set = RuleSet::with_rules(0, [rule]).unwrap();
        assert_eq!(set.decide(Direction::Up, FrameKind::Text, Some(&json!({"next": null}))).action, Action::Drop);
        assert_eq!(set.decide(Direction::Up, FrameKind::Text, Some(&json!({"next": "null"}))), Decision::forward());
        let listed = serde_json::to_value(set.rules()).unwrap();
        assert_eq!(listed[0]["match"]["next"], serde_json::Value::Null, "listed as it was given");
    }

    #[test]
    fn a_bare_count_works_on_the_command_line_too() {
        let rule = Rule::parse("drop 3 up type=x").unwrap();
        assert_eq!(rule.count, Count::Times(3));
        let err = Rule::parse("drop 0").unwrap_err().to_string();
        assert!(err.contains("positive"), "{err}");
    }

    #[test]
    fn a_missing_value_is_not_shown_as_zero() {
        let err = parse_rules_toml("[[rule]]\naction = \"delay\"\n", "r.toml").unwrap_err().to_string();
        assert!(err.contains("needs delay_ms") && !err.contains("delay=0"), "{err}");
        let err = parse_rules_toml("[[rule]]\naction = \"close\"\n", "r.toml").unwrap_err().to_string();
        assert!(err.contains("needs close_code") && !err.contains("close=0"), "{err}");
    }

    #[test]
    fn a_duplicate_name_in_a_rules_file_names_the_file_and_the_line() {
        let text = "[[rule]]\nname = \"cut\"\naction = \"drop\"\n\n[[rule]]\nname = \"cut\"\naction = \"duplicate\"\n";
        let err = parse_rules_toml(text, "cuts.toml").unwrap_err().to_string();
        assert!(err.contains("cuts.toml") && err.contains("`cut`") && err.contains("line 5"), "{err}");
    }

    #[test]
    fn reorder_holds_at_most_its_limit_and_names_its_partner_by_its_conditions() {
        let rule = Rule::parse("reorder down type=invocationresult").unwrap();
        assert_eq!(rule.compile("r").unwrap().action, Action::Reorder(REORDER_HOLD_MS_DEFAULT));
        let too_long = Rule::parse(&format!("reorder={} down", MAX_DELAY_MS + 1));
        assert!(too_long.is_err_and(|e| e.to_string().contains("above the limit")));
        let mut drop = Rule::new(ActionKind::Drop);
        drop.delay_ms = Some(5);
        assert!(drop.validate().is_err_and(|e| e.to_string().contains("only for actions delay and reorder")));
        let mut set = RuleSet::with_rules(0, [rule]).unwrap();
        let result = r#"{"type":"invocationresult","function_id":"x"}"#;
        assert_eq!(set.decide_frame(Direction::Down, FrameKind::Text, Some(result)).action, Action::Reorder(10_000));
        // Used up, yet it still names the next result as the held one's partner.
        assert!(set.selects("rule-1", Direction::Down, FrameKind::Text, Some(result)));
        assert!(!set.selects("rule-1", Direction::Up, FrameKind::Text, Some(result)), "another direction");
        assert!(!set.selects("rule-1", Direction::Down, FrameKind::Text, Some(r#"{"type":"other"}"#)));
        assert!(!set.selects("no-such-rule", Direction::Down, FrameKind::Text, Some(result)));
        let text_only = RuleSet::with_rules(0, [Rule::parse("reorder always down text").unwrap()]).unwrap();
        assert!(text_only.selects("rule-1", Direction::Down, FrameKind::Text, Some(result)));
        assert!(!text_only.selects("rule-1", Direction::Down, FrameKind::Binary, None), "a text rule, a binary frame");
        let mut twice = RuleSet::with_rules(0, [Rule::parse("reorder always down").unwrap()]).unwrap();
        let except = twice.decide_frame_except(Direction::Down, FrameKind::Text, Some(result), Some("rule-1"));
        assert_eq!(except.action, Action::Forward, "the partner is not taken by the rule that holds for it");
    }
}

//! Bounds on what a run's report prints, whatever the run did: a value of ten megabytes is
//! shown by its start and its length, and an oracle that fired ten thousand times shows a few
//! of its findings and how many more there are. The run's outcome keeps everything (and
//! `--trace` writes every event whole); only what is printed for a person, and the lists of
//! messages in `--json`, are bounded.

use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A quoted value (a JSON string in a message) longer than this is cut, in bytes.
pub const VALUE_BYTES_MAX: usize = 1_024;
/// How much of a cut value is shown, in characters.
pub const VALUE_SHOWN_CHARS: usize = 64;
/// One message (a failure, an oracle's finding, a line of a trace) longer than this, once its
/// long values are cut, is cut here, with its whole length said, in bytes.
pub const MESSAGE_BYTES_MAX: usize = 4_096;
/// The findings of one oracle shown per run; the rest are counted.
pub const ONE_ORACLE_LINES_MAX: usize = 5;
/// The messages of one list (a run's failures) shown per run; the rest are counted.
pub const MESSAGES_MAX: usize = 40;

/// `text` with every quoted value (a JSON string in double quotes, or a value a message quotes
/// in backticks) longer than [`VALUE_BYTES_MAX`] cut to its first [`VALUE_SHOWN_CHARS`]
/// characters and its length (`"aaaa…" (10485760 bytes)`), and the whole cut at
/// [`MESSAGE_BYTES_MAX`] (`… (63000000 bytes in all)`).
pub fn text(text: &str) -> Cow<'_, str> {
    if text.len() <= VALUE_BYTES_MAX {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut cut = String::new();
    let (mut at, mut copied) = (0, 0);
    while at < bytes.len() {
        let quote = bytes[at];
        if quote != b'"' && quote != b'`' {
            at += 1;
            continue;
        }
        // The closing quote: the next one (in a JSON string, the next one no backslash escapes),
        // or the end of the text.
        let mut end = at + 1;
        while end < bytes.len() && bytes[end] != quote {
            end += if quote == b'"' && bytes[end] == b'\\' { 2 } else { 1 };
        }
        let close = end.min(bytes.len());
        if close - at - 1 > VALUE_BYTES_MAX {
            // Both ends are quotes (ASCII) or the end of the text: character boundaries.
            let value = &text[at + 1..close];
            let shown: String = value.chars().take(VALUE_SHOWN_CHARS).collect();
            cut.push_str(&text[copied..at]);
            let quote = char::from(quote);
            cut.push_str(&format!("{quote}{}…{quote} ({} bytes)", shown.trim_end_matches('\\'), value.len()));
            copied = (close + 1).min(bytes.len());
        }
        at = close + 1;
    }
    let whole = if copied == 0 {
        Cow::Borrowed(text)
    } else {
        cut.push_str(&text[copied..]);
        Cow::Owned(cut)
    };
    if whole.len() <= MESSAGE_BYTES_MAX {
        return whole;
    }
    let mut end = MESSAGE_BYTES_MAX;
    while !whole.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes in all)", &whole[..end], whole.len()))
}

/// `value` with every string longer than [`VALUE_BYTES_MAX`] cut to its first
/// [`VALUE_SHOWN_CHARS`] characters and its length: still the same JSON shape, for a machine
/// to read, but a value no reader wants whole is not copied into every line.
pub fn json(value: &Value) -> Value {
    match value {
        Value::String(text) if text.len() > VALUE_BYTES_MAX => Value::String(cut_value(text)),
        Value::Array(items) => Value::Array(items.iter().map(json).collect()),
        Value::Object(fields) => Value::Object(fields.iter().map(|(k, v)| (k.clone(), json(v))).collect()),
        other => other.clone(),
    }
}

/// A long string as a cut value says it: its start and its length.
fn cut_value(text: &str) -> String {
    let shown: String = text.chars().take(VALUE_SHOWN_CHARS).collect();
    format!("{shown}… ({} bytes)", text.len())
}

/// The oracle a failure line is a finding of (`oracle `NAME` fired: ...`), if it is one.
pub fn oracle_of(failure: &str) -> Option<&str> {
    failure.strip_prefix("oracle `")?.split_once("` fired: ").map(|(name, _)| name)
}

/// A list of messages as a report shows it: each bounded by [`text`]; at most
/// [`ONE_ORACLE_LINES_MAX`] of each oracle's (`group` names it, or `None` for a message of its
/// own), then `and N more of oracle `NAME``; at most [`MESSAGES_MAX`] in all, then `and N more`.
/// The order is kept.
pub fn messages<'a>(items: impl IntoIterator<Item = (Option<&'a str>, &'a str)>) -> Vec<String> {
    let items: Vec<(Option<&str>, &str)> = items.into_iter().collect();
    let mut of_oracle: BTreeMap<&str, usize> = BTreeMap::new();
    for oracle in items.iter().filter_map(|(oracle, _)| *oracle) {
        *of_oracle.entry(oracle).or_default() += 1;
    }
    // Each line shown, and how many messages it stands for.
    let mut shown: Vec<(String, usize)> = Vec::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (oracle, message) in items {
        if let Some(oracle) = oracle {
            let seen = seen.entry(oracle).or_default();
            *seen += 1;
            if *seen > ONE_ORACLE_LINES_MAX {
                continue;
            }
            shown.push((text(message).into_owned(), 1));
            let all = of_oracle[oracle];
            if *seen == ONE_ORACLE_LINES_MAX && all > ONE_ORACLE_LINES_MAX {
                let more = all - ONE_ORACLE_LINES_MAX;
                shown.push((format!("and {more} more of oracle `{oracle}`"), more));
            }
            continue;
        }
        shown.push((text(message).into_owned(), 1));
    }
    if shown.len() > MESSAGES_MAX {
        let more: usize = shown[MESSAGES_MAX..].iter().map(|(_, stands_for)| stands_for).sum();
        shown.truncate(MESSAGES_MAX);
        shown.push((format!("and {more} more"), more));
    }
    shown.into_iter().map(|(line, _)| line).collect()
}

/// A run's failures as a report shows them (see [`messages`]): an oracle's findings grouped by
/// their oracle.
pub fn failures(failures: &[String]) -> Vec<String> {
    messages(failures.iter().map(|f| (oracle_of(f), f.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_quoted_value_is_cut_to_its_start_and_its_length() {
        let huge = "a".repeat(10 << 20);
        let line = format!("state notes/k: blob expected = \"b\", found \"{huge}\" (and \"short\")");
        let cut = text(&line);
        assert_eq!(
            cut,
            format!(
                "state notes/k: blob expected = \"b\", found \"{}…\" (10485760 bytes) (and \"short\")",
                "a".repeat(VALUE_SHOWN_CHARS)
            )
        );
        let escaped = format!("found \"{}\\\"{}\" end", "x".repeat(2_000), "y".repeat(10));
        assert!(text(&escaped).ends_with("…\" (2012 bytes) end"), "an escaped quote does not end the value");
        let quoted = format!("found `{}` (entry {{}})", "b".repeat(3_000));
        assert_eq!(text(&quoted), format!("found `{}…` (3000 bytes) (entry {{}})", "b".repeat(VALUE_SHOWN_CHARS)));
        let short = "found \"b\"".to_string();
        assert!(matches!(text(&short), Cow::Borrowed(_)), "a short line is not copied");
    }

    #[test]
    fn a_long_message_is_cut_with_its_length_and_a_character_is_never_split() {
        let long = format!("found [{}]", "é,".repeat(5_000));
        let cut = text(&long);
        assert!(cut.len() < MESSAGE_BYTES_MAX + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("… ({} bytes in all)", long.len())), "{cut}");
        let unclosed = format!("found \"{}", "z".repeat(3_000));
        assert_eq!(text(&unclosed), format!("found \"{}…\" (3000 bytes)", "z".repeat(VALUE_SHOWN_CHARS)));
    }

    #[test]
    fn json_strings_are_cut_where_they_are_and_the_shape_stays() {
        let value = serde_json::json!({ "blob": "q".repeat(5_000), "n": [1, "short"] });
        let cut = json(&value);
        assert_eq!(cut["blob"], format!("{}… (5000 bytes)", "q".repeat(VALUE_SHOWN_CHARS)));
        assert_eq!(cut["n"], value["n"]);
    }

    #[test]
    fn each_oracle_shows_a_few_findings_and_counts_the_rest() {
        let mut all: Vec<String> = (0..10_000).map(|n| format!("oracle `stranded` fired: input #{n}")).collect();
        all.insert(3, "state s1: status expected = completed".into());
        all.push("oracle `liveness` fired: a turn never ended".into());
        let shown = failures(&all);
        assert_eq!(shown.len(), ONE_ORACLE_LINES_MAX + 3, "{shown:#?}");
        assert_eq!(shown[3], "state s1: status expected = completed", "the order is kept");
        assert_eq!(shown[ONE_ORACLE_LINES_MAX + 1], "and 9995 more of oracle `stranded`");
        assert_eq!(shown.last().unwrap(), "oracle `liveness` fired: a turn never ended");
        let many: Vec<String> = (0..100).map(|n| format!("expectation #{n}")).collect();
        let shown = failures(&many);
        assert_eq!(shown.len(), MESSAGES_MAX + 1);
        assert_eq!(shown.last().unwrap(), &format!("and {} more", 100 - MESSAGES_MAX));
    }
}

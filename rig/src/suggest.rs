//! "Did you mean": the nearest valid name to one a scenario file got wrong.

/// ` (did you mean `X`?)` when one of `choices` is close to `wrong`, else nothing.
pub fn did_you_mean<'a>(wrong: &str, choices: impl IntoIterator<Item = &'a str>) -> String {
    let nearest = choices
        .into_iter()
        .map(|choice| (strsim::jaro_winkler(wrong, choice), choice))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    nearest.map_or_else(String::new, |(_, choice)| format!(" (did you mean `{choice}`?)"))
}

#[cfg(test)]
mod tests {
    use super::did_you_mean;

    #[test]
    fn suggests_only_close_names() {
        assert_eq!(did_you_mean("state::sett", ["state::set", "state::get"]), " (did you mean `state::set`?)");
        assert_eq!(did_you_mean("liveliness", ["liveness", "effects"]), " (did you mean `liveness`?)");
        assert_eq!(did_you_mean("zzz", ["liveness", "effects"]), "");
    }
}

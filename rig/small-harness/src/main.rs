//! The small harness's own command line: the rig's whole command set, running it.
//! `SMALL_HARNESS_TURNS_ONLY=1` runs the variant declaring `turns` alone.
fn main() -> std::process::ExitCode {
    let turns_only = std::env::var("SMALL_HARNESS_TURNS_ONLY").is_ok_and(|v| v == "1");
    rig::cli::main(if turns_only { small_harness::turns_only() } else { small_harness::factory() })
}

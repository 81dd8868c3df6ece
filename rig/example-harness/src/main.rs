//! The naive harness's own command line: the rig's whole command set (`run`, `matrix`, `sweep`,
//! `explore`, `bench`), running the naive harness. Every repro line it prints names this binary,
//! so it reruns the naive harness.

fn main() -> std::process::ExitCode {
    rig::cli::main(naive_harness::factory())
}

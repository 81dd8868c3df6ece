//! The second harness's own command line: the rig's whole command set (`run`, `matrix`, `sweep`,
//! `explore`, `bench`), running the second harness. Every repro line it prints names this
//! binary, so it reruns the second harness: `second-harness run scenarios --seeds 0..300 -q`
//! judges the whole catalogue against it.

fn main() -> std::process::ExitCode {
    rig::cli::main(second_harness::factory())
}

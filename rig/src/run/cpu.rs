//! CPU time, for benchmarks only: nothing a run does or reports depends on it.
//!
//! On a machine shared with other work, wall time measures the machine as much as the rig, and
//! CPU time (user and system) measures the rig alone; `rig bench` reports both.

/// CPU time the calling thread has used, in nanoseconds (0 where the platform cannot tell).
pub fn thread_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `time` is a valid timespec for the call to fill in.
    if unsafe { libc::clock_gettime(clock, &mut time) } != 0 {
        return 0;
    }
    u64::try_from(time.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(time.tv_nsec).unwrap_or(0))
}

/// Spends `ns` nanoseconds of the calling thread's CPU time doing nothing useful: a planted
/// slowdown, which shows the speed guard bites (see `rig bench`).
pub fn burn(ns: u64) {
    let until = thread_ns().saturating_add(ns);
    let mut spin = 0u64;
    while thread_ns() < until {
        for _ in 0..256 {
            spin = std::hint::black_box(spin.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_burns_cpu_time_sees_it_on_its_clock() {
        let before = thread_ns();
        burn(2_000_000);
        let spent = thread_ns() - before;
        assert!(spent >= 2_000_000, "{spent} ns");
    }
}

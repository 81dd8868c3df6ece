//! Seeded random streams: one per component, all derived from the run's seed.
//!
//! A component's draws depend only on the seed and the component's name, never on how many
//! draws another component made, so adding a host does not reshuffle everyone else's ids.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The random stream of one named component.
pub fn component_stream(seed: u64, component: &str) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(fnv1a(component.as_bytes()));
    rng
}

/// A version-4 UUID drawn from a seeded stream.
pub fn uuid(rng: &mut ChaCha8Rng) -> String {
    let mut bytes = [0u8; 16];
    rng.fill_bytes(&mut bytes);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(36);
    for (index, byte) in bytes.iter().enumerate() {
        if matches!(index, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    text
}

/// A stable 64-bit name hash (FNV-1a), so stream ids do not depend on std's randomized hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_and_name_give_the_same_stream_and_names_differ() {
        let a = uuid(&mut component_stream(7, "harness"));
        assert_eq!(a, uuid(&mut component_stream(7, "harness")));
        assert_ne!(a, uuid(&mut component_stream(7, "driver")));
        assert_ne!(a, uuid(&mut component_stream(8, "harness")));
        assert_eq!(&a[14..15], "4", "version nibble");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "variant nibble: {a}");
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{a}");
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
    }
}

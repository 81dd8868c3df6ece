//! serde_json's compact text, written by hand where a run writes it most (the trace's canonical
//! lines, the bus's frames): the same bytes, without its formatter's per-value cost. Anything
//! that is not plain text or an integer still goes through serde_json itself.

/// Whether serde_json writes `text` as it is (no control character, quote or backslash in it).
/// Eight bytes at a time, the last few too (as a word that overlaps the one before, or for a
/// text under eight bytes, its two ends as one word): every text of every event is looked at,
/// and a byte at a time made the look about 1 % of a run (under callgrind).
pub(crate) fn plain(text: &str) -> bool {
    // The classic word tricks: `(w - ONES * n) & !w & HIGH` is non-zero exactly when some byte
    // of `w` is below `n` (for `n` up to 0x80); a byte equal to `c` is one below 1 in `w ^ ONES * c`.
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |word: u64, n: u64| word.wrapping_sub(ONES * n) & !word & HIGH != 0;
    let clean = |word: u64| {
        !(below(word, 0x20) || below(word ^ (ONES * u64::from(b'"')), 1) || below(word ^ (ONES * u64::from(b'\\')), 1))
    };
    let bytes = text.as_bytes();
    let len = bytes.len();
    let word_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"));
    let half_at = |at: usize| u64::from(u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes")));
    if len >= 8 {
        let mut words = bytes.chunks_exact(8);
        if !words.all(|word| clean(u64::from_le_bytes(word.try_into().expect("eight bytes")))) {
            return false;
        }
        // The last bytes, as the word that ends the text (overlapping the words looked at
        // already, which says nothing new about them): a byte at a time cost more than the words.
        words.remainder().is_empty() || clean(word_at(len - 8))
    } else if len >= 4 {
        // A short text (most hosts, peers and kinds) as one word: its first four bytes and its
        // last four, which overlap when it is shorter than eight.
        clean(half_at(0) | half_at(len - 4) << 32)
    } else {
        bytes.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
    }
}

/// `n` in decimal (after a minus sign when `negative`), as serde_json (itoa) writes an integer.
pub(crate) fn write_decimal(out: &mut Vec<u8>, negative: bool, n: u64) {
    if negative {
        out.push(b'-');
    }
    out.extend_from_slice(decimal(n, &mut [0; 20]));
}

/// The digits of `n`, written at the end of `digits` (20 of them hold any `u64`): the one place
/// the trace's lines and the bus's frames both take an integer's text from.
pub(crate) fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &digits[at..]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-at-a-time look says what a look at each byte says, for every ASCII byte at every
    /// place of texts up to three words long, alone and between bytes above 0x7f (which the
    /// tricks must not take for small ones).
    #[test]
    fn plain_text_is_told_as_byte_by_byte() {
        let bytewise = |t: &[u8]| t.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\');
        for len in 0..=24 {
            for at in 0..len.max(1) {
                for byte in 0..=0x7fu8 {
                    let mut text = vec![b'a'; len];
                    if len > 0 {
                        text[at] = byte;
                    }
                    let text = String::from_utf8(text).unwrap();
                    assert_eq!(plain(&text), bytewise(text.as_bytes()), "{text:?}");
                    let wide = format!("é{text}\u{7f}");
                    assert_eq!(plain(&wide), bytewise(wide.as_bytes()), "{wide:?}");
                }
            }
        }
    }

    /// Integers as serde_json writes them, at the ends of their ranges and at each power of ten.
    #[test]
    fn decimals_are_serde_jsons() {
        let mut values: Vec<i128> = vec![0, 1, -1, i64::MIN as i128, i64::MAX as i128, u64::MAX as i128];
        values.extend((0..20).map(|p| 10i128.pow(p)).flat_map(|v| [v - 1, v, -v]));
        for value in values.into_iter().filter(|v| *v >= i64::MIN as i128) {
            let mut out = Vec::new();
            write_decimal(&mut out, value < 0, value.unsigned_abs() as u64);
            let expected = match i64::try_from(value) {
                Ok(v) => serde_json::to_string(&v).unwrap(),
                Err(_) => serde_json::to_string(&(value as u64)).unwrap(),
            };
            assert_eq!(String::from_utf8(out).unwrap(), expected, "{value}");
        }
    }
}

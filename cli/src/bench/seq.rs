//! Parsing `--seq`: a doubling range `1k..64k` or a comma list `1000,3000`.

use mixer_core::{Error, Result};

fn bad(given: &str, why: &str) -> Error {
    Error::Io(format!(
        "--seq: {why}; expected a range `A..B` (A, 2A, 4A, … up to B, e.g. `1k..64k`) or a comma list \
         (e.g. `1000,3000`), sizes ≥ 1 with optional suffix k = 1024 or m = 1024², given `{given}`"
    ))
}

/// One size: a positive integer with an optional `k` (×1024) or `m` (×1024²) suffix.
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1024usize),
        Some((i, 'm' | 'M')) => (&t[..i], 1024 * 1024),
        _ => (t, 1),
    };
    let n: usize = num.trim().parse().map_err(|_| bad(s, &format!("`{t}` is not a size")))?;
    let v = n.checked_mul(mult).ok_or_else(|| bad(s, "size overflows"))?;
    if v == 0 {
        return Err(bad(s, "sizes must be ≥ 1"));
    }
    Ok(v)
}

/// Sequence lengths from `--seq`: `A..B` gives `A, 2A, 4A, …` while `≤ B` (powers of two
/// when `A` is one: `1k..64k` = 1024, 2048, …, 65536); a comma list gives its sizes, sorted
/// and without repeats.
pub fn parse_seq(s: &str) -> Result<Vec<usize>> {
    let t = s.trim();
    if t.is_empty() {
        return Err(bad(s, "empty"));
    }
    if let Some((a, b)) = t.split_once("..") {
        let b = b.strip_prefix('=').unwrap_or(b);
        let (lo, hi) = (parse_size(a)?, parse_size(b)?);
        if lo > hi {
            return Err(bad(s, &format!("range start {lo} is above its end {hi}")));
        }
        let mut v = vec![lo];
        while let Some(n) = v.last().and_then(|x| x.checked_mul(2)).filter(|&n| n <= hi) {
            v.push(n);
        }
        return Ok(v);
    }
    let mut v = t.split(',').map(parse_size).collect::<Result<Vec<_>>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_double() {
        assert_eq!(parse_seq("1k..64k").unwrap(), vec![1024, 2048, 4096, 8192, 16384, 32768, 65536]);
        assert_eq!(parse_seq("64..128").unwrap(), vec![64, 128]);
        assert_eq!(parse_seq("100..1000").unwrap(), vec![100, 200, 400, 800]);
        assert_eq!(parse_seq("5..5").unwrap(), vec![5]);
        assert_eq!(parse_seq("1k..=2k").unwrap(), vec![1024, 2048]);
    }

    #[test]
    fn lists_sort_and_dedup() {
        assert_eq!(parse_seq("3000,1000").unwrap(), vec![1000, 3000]);
        assert_eq!(parse_seq(" 64, 2k ,64").unwrap(), vec![64, 2048]);
        assert_eq!(parse_seq("1m").unwrap(), vec![1 << 20]);
    }

    #[test]
    fn rejects_garbage_with_the_input() {
        for s in ["", "0", "abc", "4k..1k", "1,,2", "..", "1k..", "-3", "99999999999999999999k"] {
            let e = parse_seq(s).unwrap_err().to_string();
            assert!(e.contains("--seq") && e.contains("expected"), "{s}: {e}");
        }
    }
}

//! Canonical JSON numbers, exact: the canonical text is derived from the decimal digits of
//! the input, never from a float, so two numbers share a canonical form exactly when they
//! are the same decimal value (`1.0` and `1`, `15e-1` and `1.5`), however many digits.
//!
//! The form: zero is `0`; an integer within the i64/u64 range is written in plain digits;
//! anything else as `d[.ddd]e<exp>` with the shortest exact digits (the spelling Rust's
//! `{:e}` gives a float with the same digits, so fingerprints of ordinary numbers did not
//! change when floats went away).

use super::FingerprintError;

/// Exponents beyond this many digits are refused, so the exponent arithmetic cannot overflow.
const MAX_EXPONENT_DIGITS: usize = 15;

/// Appends the canonical form of the JSON number `lexeme` (already checked to match the
/// JSON number grammar) to `out`.
pub(crate) fn write_exact(lexeme: &[u8], out: &mut Vec<u8>) -> Result<(), FingerprintError> {
    let out_of_range = || FingerprintError::Json("number out of range".to_owned());
    let (negative, rest) = match lexeme.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, lexeme),
    };
    let (mantissa, exponent) = match rest.iter().position(|&b| b == b'e' || b == b'E') {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    let (int, frac) = match mantissa.iter().position(|&b| b == b'.') {
        Some(at) => (&mantissa[..at], &mantissa[at + 1..]),
        None => (mantissa, &mantissa[mantissa.len()..]),
    };
    let mut exp: i64 = match exponent {
        None => 0,
        Some(text) => {
            let (sign, digits) = match text.split_first() {
                Some((b'-', d)) => (-1, d),
                Some((b'+', d)) => (1, d),
                _ => (1, text),
            };
            let digits = trim_start_zeros(digits);
            if digits.len() > MAX_EXPONENT_DIGITS {
                return Err(out_of_range());
            }
            sign * digits
                .iter()
                .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'))
        }
    };
    // value = digits(int ++ frac) * 10^(exp - len(frac)); drop the zeros at both ends.
    let frac_len = i64::try_from(frac.len()).map_err(|_| out_of_range())?;
    exp -= frac_len;
    let all: Vec<u8> = int.iter().chain(frac).copied().collect();
    let digits = trim_start_zeros(&all);
    let significant = digits.len() - digits.iter().rev().take_while(|&&d| d == b'0').count();
    if significant == 0 {
        out.push(b'0');
        return Ok(());
    }
    exp += i64::try_from(digits.len() - significant).map_err(|_| out_of_range())?;
    let digits = &digits[..significant];
    let len = i64::try_from(digits.len()).map_err(|_| out_of_range())?;

    if exp >= 0 && len + exp <= 20 && fits_integer(negative, digits, exp) {
        if negative {
            out.push(b'-');
        }
        out.extend_from_slice(digits);
        out.extend(std::iter::repeat_n(b'0', exp as usize));
        return Ok(());
    }
    if negative {
        out.push(b'-');
    }
    out.push(digits[0]);
    if digits.len() > 1 {
        out.push(b'.');
        out.extend_from_slice(&digits[1..]);
    }
    out.push(b'e');
    out.extend_from_slice((exp + len - 1).to_string().as_bytes());
    Ok(())
}

fn trim_start_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|&&d| d == b'0').count();
    &digits[zeros..]
}

/// Whether `digits * 10^exp` (at most 20 digits) lies in i64 (negative) or u64 (positive).
fn fits_integer(negative: bool, digits: &[u8], exp: i64) -> bool {
    let limit: &[u8] = if negative {
        b"9223372036854775808"
    } else {
        b"18446744073709551615"
    };
    let len = digits.len() + exp as usize;
    if len != limit.len() {
        return len < limit.len();
    }
    // Same length: compare digit by digit, the missing tail being zeros.
    let padded = digits
        .iter()
        .copied()
        .chain(std::iter::repeat(b'0'))
        .take(len);
    padded.cmp(limit.iter().copied()) != std::cmp::Ordering::Greater
}

#[cfg(test)]
mod tests {
    fn canon(n: &str) -> String {
        let mut out = Vec::new();
        super::write_exact(n.as_bytes(), &mut out).expect("number");
        String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn one_value_one_spelling() {
        for (input, want) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0e-7", "0"),
            ("1", "1"),
            ("1.0", "1"),
            ("10e-1", "1"),
            ("100", "100"),
            ("1e2", "100"),
            ("1.5", "1.5e0"),
            ("15e-1", "1.5e0"),
            ("0.1", "1e-1"),
            ("2.5e-8", "2.5e-8"),
            ("-123456789012345678", "-123456789012345678"),
            ("-9223372036854775808", "-9223372036854775808"),
            ("-9223372036854775809", "-9.223372036854775809e18"),
            ("18446744073709551615", "18446744073709551615"),
            ("18446744073709551616", "1.8446744073709551616e19"),
            ("1e19", "10000000000000000000"),
            ("1e20", "1e20"),
            ("10000000000000000000001", "1.0000000000000000000001e22"),
            ("9007199254740993.0", "9007199254740993"),
            ("0.30000000000000001", "3.0000000000000001e-1"),
            ("1e400", "1e400"),
            ("1E+0000000000000000000002", "100"),
        ] {
            assert_eq!(canon(input), want, "{input}");
            assert_eq!(canon(want), want, "{want} is a fixed point");
        }
    }

    #[test]
    fn huge_exponents_are_refused() {
        assert!(super::write_exact(b"1e9999999999999999", &mut Vec::new()).is_err());
    }
}

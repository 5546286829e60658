//! Kubernetes resource quantities as integers, the way the kubelet compares them.
//!
//! Admission compares CPU in millicores and everything else in whole units, rounding a
//! fraction up (`resource.Quantity.MilliValue()` / `Value()` do the same), so every
//! quantity is held here as milli-units in an `i128`: no float error, and no overflow for
//! anything a Quantity can spell (at most 2^63-1 units).

use thiserror::Error;

/// A quantity string that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}"
)]
pub struct QuantityError(pub String);

/// Parses a quantity into milli-units, rounding up any finer fraction (0.1m -> 1m).
pub fn parse_milli(text: &str) -> Result<i128, QuantityError> {
    let bad = || QuantityError(text.to_owned());
    let s = text.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    // value = digits * 10^(exp10) * 2^(exp2), digits carrying the fraction as an integer.
    let digits: String = format!("{whole}{frac}");
    let mut mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad())?
    };
    let mut exp10: i32 = -(frac.len() as i32) + 3; // +3: we want milli-units
    let mut exp2: u32 = 0;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .ok_or_else(bad)?;
            let exp: i32 = exp.parse().map_err(|_| bad())?;
            if !(-40..=40).contains(&exp) {
                return Err(bad());
            }
            exp10 += exp;
        }
    }
    mantissa = mantissa.checked_mul(1i128 << exp2).ok_or_else(bad)?;
    let value = if exp10 >= 0 {
        mantissa
            .checked_mul(10i128.checked_pow(exp10 as u32).ok_or_else(bad)?)
            .ok_or_else(bad)?
    } else {
        let div = 10i128.checked_pow((-exp10) as u32).ok_or_else(bad)?;
        // Round away from zero, as Quantity does when it drops precision.
        (mantissa + div - 1) / div
    };
    Ok(if negative { -value } else { value })
}

/// `Quantity.Value()`: whole units, a fraction rounded up.
pub fn milli_to_units(milli: i128) -> i128 {
    if milli >= 0 {
        (milli + 999) / 1000
    } else {
        milli / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_suffix_family() {
        let cases = [
            ("1", 1_000),
            ("500m", 500),
            ("0.5", 500),
            ("2.25", 2_250),
            ("1k", 1_000_000),
            ("1Ki", 1_024_000),
            ("8Gi", 8 * (1i128 << 30) * 1000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("100n", 1),
            ("+3", 3_000),
            ("-2", -2_000),
            (".5", 500),
        ];
        for (text, want) in cases {
            assert_eq!(parse_milli(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_what_the_api_server_rejects() {
        for text in ["", "abc", "1.2.3", "5Q", "1ki", ".", "1e", "--1"] {
            assert!(parse_milli(text).is_err(), "{text:?} should be rejected");
        }
    }

    #[test]
    fn value_rounds_fractions_up() {
        assert_eq!(milli_to_units(1), 1);
        assert_eq!(milli_to_units(1000), 1);
        assert_eq!(milli_to_units(1001), 2);
        assert_eq!(milli_to_units(0), 0);
    }
}

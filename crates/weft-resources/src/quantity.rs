//! Kubernetes quantities (`k8s.io/apimachinery/pkg/api/resource`): `<signedNumber><suffix>`, where
//! the suffix is a decimal SI one (`n u m k M G T P E`), a binary one (`Ki Mi Gi Ti Pi Ei`) or a
//! decimal exponent (`e3`, `E-2`).
//!
//! A quantity is read as an exact decimal (`mantissa × 10^exp10 × 2^exp2`), so nothing is lost
//! before the rounding each use asks for: [`value`] and [`milli_value`] round up, as
//! `Quantity.Value()` and `Quantity.MilliValue()` do; [`whole`] accepts only exact whole counts,
//! as devices need (`2`, `2000m`, `1k`, `1Ki`, `2e0` — not `500m`).

/// Why a quantity cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Nothing but whitespace.
    #[error("empty quantity")]
    Empty,
    /// A sign or suffix without digits.
    #[error("no digits")]
    NoDigits,
    /// `1.2.3`.
    #[error("more than one decimal point")]
    TwoPoints,
    /// More digits than an exact decimal holds.
    #[error("too many digits")]
    TooManyDigits,
    /// A suffix that is neither SI, binary nor an exponent.
    #[error("unknown suffix")]
    UnknownSuffix,
    /// An exponent that is not a (signed) integer, or beyond ±1000.
    #[error("bad exponent")]
    BadExponent,
    /// Below zero where only non-negative amounts make sense.
    #[error("negative quantity")]
    Negative,
    /// Beyond what a u64 holds once scaled.
    #[error("quantity too large")]
    TooLarge,
    /// A fraction where a whole count is needed (`500m` devices).
    #[error("not a whole number")]
    NotWhole,
}

/// A quantity as an exact decimal: `(-1)^negative × mantissa × 10^exp10 × 2^exp2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decimal {
    negative: bool,
    mantissa: u128,
    exp10: i64,
    exp2: u32,
}

/// Reads a quantity.
pub fn parse(s: &str) -> Result<Decimal, QuantityError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let (negative, rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(QuantityError::NoDigits);
    }
    if frac_part.contains('.') {
        return Err(QuantityError::TwoPoints);
    }
    let mut mantissa: u128 = 0;
    for c in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(c - b'0')))
            .ok_or(QuantityError::TooManyDigits)?;
    }
    let frac_digits = i64::try_from(frac_part.len()).map_err(|_| QuantityError::TooManyDigits)?;
    let (exp10, exp2) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        other => {
            let exp = other.strip_prefix(['e', 'E']).ok_or(QuantityError::UnknownSuffix)?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::BadExponent);
            }
            let e: i64 = exp.parse().map_err(|_| QuantityError::BadExponent)?;
            if e.unsigned_abs() > 1000 {
                return Err(QuantityError::BadExponent);
            }
            (e, 0)
        }
    };
    Ok(Decimal { negative, mantissa, exp10: exp10 - frac_digits, exp2 })
}

impl Decimal {
    /// Whether the value is below zero (`-0` is not).
    pub fn is_negative(self) -> bool {
        self.negative && self.mantissa != 0
    }

    /// `ceil(value × 10^shift)` for a non-negative value; `None` beyond u64.
    fn ceil_scaled(self, shift: i64) -> Option<u64> {
        let num = self.mantissa.checked_mul(1u128.checked_shl(self.exp2)?)?;
        if num == 0 {
            return Some(0);
        }
        let e = self.exp10 + shift;
        let v = if e >= 0 {
            let p = 10u128.checked_pow(u32::try_from(e).ok()?)?;
            num.checked_mul(p)?
        } else {
            // 10^39 > u128::MAX >= num: a positive value that small rounds up to one unit.
            match u32::try_from(e.unsigned_abs()).ok().and_then(|p| 10u128.checked_pow(p)) {
                Some(d) => num.div_ceil(d),
                None => 1,
            }
        };
        u64::try_from(v).ok()
    }

    /// The value as an exact whole number, if it is one.
    fn exact(self) -> Result<u64, QuantityError> {
        if self.is_negative() {
            return Err(QuantityError::Negative);
        }
        // Trailing zeros of the mantissa move into the exponent, so `2000m` is exactly 2.
        let (mut mantissa, mut exp10) = (self.mantissa, self.exp10);
        if mantissa == 0 {
            return Ok(0);
        }
        while exp10 < 0 && mantissa % 10 == 0 {
            mantissa /= 10;
            exp10 += 1;
        }
        if exp10 < 0 {
            return Err(QuantityError::NotWhole);
        }
        Decimal { negative: false, mantissa, exp10, exp2: self.exp2 }.ceil_scaled(0).ok_or(QuantityError::TooLarge)
    }
}

fn scaled(s: &str, shift: i64) -> Result<u64, QuantityError> {
    let d = parse(s)?;
    if d.is_negative() {
        return Err(QuantityError::Negative);
    }
    d.ceil_scaled(shift).ok_or(QuantityError::TooLarge)
}

/// The quantity in units, rounded up as `Quantity.Value()` does (`"4Gi"`, `"129e6"`, `"500m"` → 1).
/// Negative quantities are errors.
pub fn value(s: &str) -> Result<u64, QuantityError> {
    scaled(s, 0)
}

/// The quantity in thousandths, rounded up as `Quantity.MilliValue()` does (`"1.5"` → 1500,
/// `"100u"` → 1). Negative quantities are errors.
pub fn milli_value(s: &str) -> Result<u64, QuantityError> {
    scaled(s, 3)
}

/// The quantity as a whole count: `2`, `2000m`, `1k`, `1Ki`, `2e0`, `1.5k`; `500m` is
/// [`QuantityError::NotWhole`], `-1` [`QuantityError::Negative`].
pub fn whole(s: &str) -> Result<u64, QuantityError> {
    // Most device counts are plain digits (`1`, `8`): read those directly.
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|_| QuantityError::TooLarge);
    }
    parse(s)?.exact()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milli_values_round_up() {
        for (q, milli) in [
            ("2", 2000),
            ("500m", 500),
            ("1.5", 1500),
            ("0.1", 100),
            (".5", 500),
            ("1.", 1000),
            ("+2", 2000),
            ("100u", 1),
            ("1n", 1),
            ("1e3", 1_000_000),
            ("2E0", 2000),
            ("0", 0),
            ("-0", 0),
            ("1k", 1_000_000),
            ("1e-400", 1),
        ] {
            assert_eq!(milli_value(q), Ok(milli), "{q}");
        }
    }

    #[test]
    fn values_round_up() {
        for (q, bytes) in [
            ("4Gi", 4u64 << 30),
            ("1G", 1_000_000_000),
            ("128974848", 128_974_848),
            ("129e6", 129_000_000),
            ("129E+6", 129_000_000),
            ("123Mi", 123 << 20),
            ("1.5Gi", 3 << 29),
            ("500m", 1),
            ("1E", 1_000_000_000_000_000_000),
            ("1Ei", 1 << 60),
            ("0.5Ki", 512),
        ] {
            assert_eq!(value(q), Ok(bytes), "{q}");
        }
    }

    #[test]
    fn malformed_quantities_say_what_is_wrong() {
        for (q, why) in [
            ("", QuantityError::Empty),
            ("abc", QuantityError::NoDigits),
            ("1.2.3", QuantityError::TwoPoints),
            ("-1", QuantityError::Negative),
            ("1x", QuantityError::UnknownSuffix),
            ("1e", QuantityError::BadExponent),
            ("1e+", QuantityError::BadExponent),
            ("1ee3", QuantityError::BadExponent),
            ("Gi", QuantityError::NoDigits),
            (".", QuantityError::NoDigits),
            ("1 Gi", QuantityError::UnknownSuffix),
            ("1e99999", QuantityError::BadExponent),
            ("16Ei", QuantityError::TooLarge),
            ("1e30", QuantityError::TooLarge),
            ("99999999999999999999999999999999999999999", QuantityError::TooManyDigits),
        ] {
            assert_eq!(value(q), Err(why), "{q}");
        }
    }

    #[test]
    fn whole_counts_are_exact() {
        for (q, n) in [
            ("2", 2),
            (" 8 ", 8),
            ("2000m", 2),
            ("1k", 1000),
            ("1Ki", 1024),
            ("2e0", 2),
            ("1e2", 100),
            ("1.5k", 1500),
            ("+3", 3),
            ("1Ei", 1 << 60),
        ] {
            assert_eq!(whole(q), Ok(n), "{q}");
        }
        for (q, why) in [
            ("500m", QuantityError::NotWhole),
            ("1.5", QuantityError::NotWhole),
            ("2001m", QuantityError::NotWhole),
            ("1e-1", QuantityError::NotWhole),
            ("16Ei", QuantityError::TooLarge),
            ("99999999999999999999", QuantityError::TooLarge),
            ("-1", QuantityError::Negative),
            ("1e30", QuantityError::TooLarge),
            ("x", QuantityError::NoDigits),
        ] {
            assert_eq!(whole(q), Err(why), "{q}");
        }
        assert_eq!(whole("0"), Ok(0));
        assert_eq!(whole("0.000"), Ok(0));
    }
}

//! Kubernetes resource quantities ("100m", "128Mi", "1e3"). k8s-openapi's
//! `Quantity` is only the string, so this is apimachinery's
//! pkg/api/resource/quantity.go grammar, with its rounding: `Value` and
//! `MilliValue` round up.

/// Why a quantity string was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a quantity (expected e.g. \"100m\", \"1.5\", \"128Mi\", \"1e3\")")]
    Syntax(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// A parsed quantity: `digits * 10^-frac_digits * 10^exp10 * 2^exp2`, kept exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    digits: u128,
    exp10: i32,
    exp2: u32,
}

impl Quantity {
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let syntax = || QuantityError::Syntax(s.to_owned());
        let t = s.trim();
        let (negative, t) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let num_len = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, suffix) = t.split_at(num_len);
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(syntax());
        }
        // Leading zeros carry no precision; more than 38 significant digits
        // would not fit, and no resource needs them.
        let all = format!("{int}{frac}");
        let significant = all.trim_start_matches('0');
        if significant.len() > 38 {
            return Err(QuantityError::TooLarge(s.to_owned()));
        }
        let digits: u128 = if significant.is_empty() {
            0
        } else {
            significant.parse().map_err(|_| syntax())?
        };
        let mut exp10 = -(frac.len() as i32);
        let mut exp2 = 0;
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
            _ => {
                let e = suffix
                    .strip_prefix(['e', 'E'])
                    .filter(|e| !e.is_empty())
                    .ok_or_else(syntax)?;
                let e: i32 = e.parse().map_err(|_| syntax())?;
                if e.abs() > 60 {
                    return Err(QuantityError::TooLarge(s.to_owned()));
                }
                exp10 += e;
            }
        }
        Ok(Self {
            negative,
            digits,
            exp10,
            exp2,
        })
    }

    pub fn is_negative(&self) -> bool {
        self.negative && self.digits != 0
    }

    pub fn is_zero(&self) -> bool {
        self.digits == 0
    }

    /// The value in units of `10^scale`, rounded up (away from zero for
    /// negatives, as Go's `ScaledValue`). `None` when it does not fit an i64.
    pub fn scaled(&self, scale: i32) -> Option<i64> {
        // Zero is zero at any exponent: "0e40" fits, though 10^40 does not.
        if self.digits == 0 {
            return Some(0);
        }
        let mut n = self.digits.checked_mul(1u128.checked_shl(self.exp2)?)?;
        let e = self.exp10 - scale;
        if e >= 0 {
            n = n.checked_mul(10u128.checked_pow(e as u32)?)?;
        } else {
            // A divisor beyond u128 leaves 0 remainder-free only for n == 0;
            // otherwise the value rounds up to 1.
            match 10u128.checked_pow((-e) as u32) {
                Some(d) => n = n.div_ceil(d),
                None => n = u128::from(n != 0),
            }
        }
        let v = i64::try_from(n).ok()?;
        Some(if self.negative { -v } else { v })
    }

    /// Whole units, rounded up ("1.5" → 2, "128Mi" → 134217728).
    pub fn value(&self) -> Option<i64> {
        self.scaled(0)
    }

    /// Thousandths, rounded up ("100m" → 100, "0.5" → 500).
    pub fn milli_value(&self) -> Option<i64> {
        self.scaled(-3)
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(q("100m").milli_value(), Some(100));
        assert_eq!(q("1").milli_value(), Some(1000));
        assert_eq!(q("0.5").milli_value(), Some(500));
        assert_eq!(q(".5").milli_value(), Some(500));
        assert_eq!(q("2.25").milli_value(), Some(2250));
        assert_eq!(q("1e3").value(), Some(1000));
        assert_eq!(q("1E3").value(), Some(1000));
        assert_eq!(q("15e-1").milli_value(), Some(1500));
        // Sub-milli values round up, as Go's MilliValue does.
        assert_eq!(q("100u").milli_value(), Some(1));
        assert_eq!(q("1n").milli_value(), Some(1));
        assert_eq!(q("0.0001").milli_value(), Some(1));
    }

    #[test]
    fn memory_quantities() {
        assert_eq!(q("128Mi").value(), Some(128 * 1024 * 1024));
        assert_eq!(q("1G").value(), Some(1_000_000_000));
        assert_eq!(q("1Gi").value(), Some(1 << 30));
        assert_eq!(q("1.5Gi").value(), Some(3 << 29));
        assert_eq!(q("64k").value(), Some(64_000));
        assert_eq!(q("1Ki").value(), Some(1024));
        assert_eq!(q("1E").value(), Some(1_000_000_000_000_000_000));
        assert_eq!(q("8Ei").value(), None, "does not fit an i64");
        assert_eq!(q("1.5").value(), Some(2));
        assert_eq!(q("0").value(), Some(0));
        // Found by fuzz/ (quantity): the scale overflowed before the zero
        // was looked at, so a zero with a large exponent did not "fit".
        assert_eq!(q("0e42").value(), Some(0));
        assert_eq!(q("0.000e60").milli_value(), Some(0));
        assert_eq!(q("-0Ei").value(), Some(0));
    }

    #[test]
    fn signs() {
        assert!(q("-1").is_negative());
        assert_eq!(q("-100m").milli_value(), Some(-100));
        assert!(!q("-0").is_negative());
        assert!(q("0m").is_zero());
        assert_eq!(q("+2").value(), Some(2));
    }

    #[test]
    fn malformed_quantities_are_refused() {
        for bad in [
            "", "m", "1x", "1.2.3", "1e", "1Mii", "1 Mi", "Mi", "--1", "1e+", "0x10",
        ] {
            assert!(
                matches!(Quantity::parse(bad), Err(QuantityError::Syntax(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Quantity::parse("1e999"),
            Err(QuantityError::TooLarge(_))
        ));
    }
}

//! Number formats shared by the bench's tables and plots.

/// Three significant digits, no exponent for everyday magnitudes (`0.0123`, `1.23`, `123`).
pub fn sig3(x: f64) -> String {
    if !x.is_finite() {
        return "∞".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    let mag = x.abs().log10().floor() as i32;
    if !(-4..6).contains(&mag) {
        return format!("{x:.2e}");
    }
    let decimals = (2 - mag).max(0) as usize;
    format!("{x:.decimals$}")
}

/// Large counts with an SI suffix (`12.3k`, `4.56M`).
pub fn si(x: f64) -> String {
    let (v, s) = if x >= 1e9 {
        (x / 1e9, "G")
    } else if x >= 1e6 {
        (x / 1e6, "M")
    } else if x >= 1e3 {
        (x / 1e3, "k")
    } else {
        (x, "")
    };
    format!("{}{s}", sig3(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
        assert_eq!(sig3(1.23456), "1.23");
        assert_eq!(sig3(123.456), "123");
        assert_eq!(sig3(0.0123456), "0.0123");
        assert_eq!(sig3(1234.6), "1235");
        assert_eq!(si(1.5e6), "1.50M");
        assert_eq!(si(999.0), "999");
    }
}

//! The bench's statistics: medians, ranges and ratios of the numbers the
//! runs printed, formatted as the tables print them (C's `%g`, `%.Nf`).
//!
//! Values stay strings until they are summed up: a median of an odd count
//! is one of the values, printed as the program printed it.

/// How a median of an even count, the mean of the middle two, is printed.
#[derive(Clone, Copy)]
pub enum Even {
    /// C's `%.Ng` (perftest tables: `%.4g`).
    G(usize),
    /// C's `%.Nf` (cmtime: 2 places, QP setup ratios: 3).
    F(usize),
}

/// The values that are plain numbers (digits, an optional fraction, an
/// optional sign), in ascending numeric order, with their numbers.
fn numbers<S: AsRef<str>>(values: &[S]) -> Vec<(f64, &str)> {
    let mut v: Vec<(f64, &str)> = values
        .iter()
        .map(|s| s.as_ref().trim())
        .filter_map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .map(|x| (x, s))
        })
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// The median of the numbers among `values` ("-" if none): the middle one
/// as given, or the mean of the middle two printed as `even` says.
pub fn median<S: AsRef<str>>(values: &[S], even: Even) -> String {
    let v = numbers(values);
    let n = v.len();
    if n == 0 {
        return "-".into();
    }
    if n % 2 == 1 {
        return v[n / 2].1.to_string();
    }
    let mean = (v[n / 2 - 1].0 + v[n / 2].0) / 2.0;
    match even {
        Even::G(p) => fmt_g(mean, p),
        Even::F(p) => format!("{mean:.p$}"),
    }
}

/// "min..max" of the numbers among `values` ("-" if none), each printed
/// as `f` prints it.
pub fn range_with<S: AsRef<str>>(values: &[S], f: impl Fn(f64, &str) -> String) -> String {
    let v = numbers(values);
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{}..{}", f(lo.0, lo.1), f(hi.0, hi.1)),
        _ => "-".into(),
    }
}

/// "min..max" with C's `%.3g` (the perftest-style tables).
pub fn range<S: AsRef<str>>(values: &[S]) -> String {
    range_with(values, |x, _| fmt_g(x, 3))
}

/// `a / b` to three places, "0.000" when `b` is not positive (a per-round
/// ratio of the timed tables).
pub fn ratio3(a: f64, b: f64) -> String {
    format!("{:.3}", if b > 0.0 { a / b } else { 0.0 })
}

/// `a / b` to `places` places, "-" unless both are positive numbers.
pub fn ratio_of(a: &str, b: &str, places: usize) -> String {
    match (num(a), num(b)) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 => format!("{:.places$}", a / b),
        _ => "-".into(),
    }
}

/// `a / b` to two places, "-" unless both are positive numbers (the
/// instruction-count tables).
pub fn ratio(a: &str, b: &str) -> String {
    ratio_of(a, b, 2)
}

/// A value's number, if it is one.
pub fn num(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|x| x.is_finite())
}

/// `total / n` rounded to a whole number (C's `%.0f`), "-" unless both are
/// positive: a count per operation.
pub fn per(total: f64, n: f64) -> String {
    if total > 0.0 && n > 0.0 {
        format!("{:.0}", total / n)
    } else {
        "-".into()
    }
}

/// C's `printf("%.*g", p, x)`: `p` significant digits, trailing zeros
/// dropped, exponent form below 1e-4 or from 10^p on.
pub fn fmt_g(x: f64, p: usize) -> String {
    let p = p.max(1);
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return format!("{x}");
    }
    let e = format!("{:.*e}", p - 1, x);
    let (mant, exp) = e.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    if exp < -4 || exp >= p as i32 {
        let m = trim_zeros(mant);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.abs());
    }
    let places = (p as i32 - 1 - exp).max(0) as usize;
    trim_zeros(&format!("{x:.places$}")).to_string()
}

/// "1.500" -> "1.5", "2.000" -> "2"; a number without a point as it is.
fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn g_is_c_printf() {
        assert_eq!(fmt_g(1.1, 3), "1.1");
        assert_eq!(fmt_g(1.13, 3), "1.13");
        assert_eq!(fmt_g(0.9305, 3), "0.93");
        assert_eq!(fmt_g(1.0, 3), "1");
        assert_eq!(fmt_g(12.455, 4), "12.46");
        assert_eq!(fmt_g(0.0428, 4), "0.0428");
        assert_eq!(fmt_g(123456.0, 4), "1.235e+05");
        assert_eq!(fmt_g(0.00001234, 3), "1.23e-05");
        assert_eq!(fmt_g(5.08, 3), "5.08");
    }

    #[test]
    fn median_keeps_the_middle_value_as_printed() {
        // The first table's C column of a 3-round run (send_bw_64, Mpps).
        assert_eq!(
            median(&["0.042904", "0.041200", "0.043500"], Even::G(4)),
            "0.042904"
        );
        assert_eq!(median(&["12.46", "13.00"], Even::G(4)), "12.73");
        assert_eq!(median(&["1.00", "2.00"], Even::F(2)), "1.50");
        assert_eq!(
            median(&["1.116", "1.2", "1.1", "1.13"], Even::F(3)),
            "1.123"
        );
        assert_eq!(median::<&str>(&[], Even::G(4)), "-");
        assert_eq!(median(&["-", "x", "3"], Even::G(4)), "3");
    }

    #[test]
    fn range_and_ratios() {
        assert_eq!(range(&["1.116", "1.1", "1.13"]), "1.1..1.13");
        assert_eq!(range(&["0.97", "1.0", "0.99"]), "0.97..1");
        assert_eq!(range::<&str>(&[]), "-");
        assert_eq!(
            range_with(&["0.829", "1.161"], |_, s| s.to_string()),
            "0.829..1.161"
        );
        assert_eq!(ratio3(13.91, 12.46), "1.116");
        assert_eq!(ratio3(1.0, 0.0), "0.000");
        assert_eq!(ratio("1079", "686"), "1.57");
        assert_eq!(ratio("-", "686"), "-");
        assert_eq!(ratio("0", "686"), "-");
        assert_eq!(per(2_158_000.0, 2000.0), "1079");
        assert_eq!(per(0.0, 2000.0), "-");
    }
}

//! Plain Markdown tables for terminal and files.

/// Renders a Markdown table with padded columns.
pub fn markdown(headers: &[&str], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let mut w: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c}{}", " ".repeat(w[i].saturating_sub(c.chars().count()))))
            .collect();
        format!("| {} |\n", parts.join(" | "))
    };
    let mut s = line(headers.iter().map(|h| h.to_string()).collect());
    s += &line(w.iter().map(|&k| "-".repeat(k.max(3))).collect());
    for r in rows {
        let mut r = r.clone();
        r.resize(n, String::new());
        s += &line(r);
    }
    s
}

/// Formats an error value compactly (`1.2e-7`), `∞` for infinity.
pub fn sci(x: f64) -> String {
    if x.is_infinite() {
        "∞".into()
    } else if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.1e}")
    }
}

/// One row of a check report (`mixers check`, `mixers check --grad`): the case (mixer, config,
/// backend, form, dtype), the report's own cells, then the result: `FAIL: <error>` when the
/// form failed to run, else `ok` or `FAIL` (outside its tolerance).
pub fn check_row<const N: usize>(
    case: [&str; 5],
    cells: [String; N],
    error: Option<&str>,
    pass: bool,
) -> Vec<String> {
    let result = match (error, pass) {
        (Some(e), _) => format!("FAIL: {e}"),
        (None, true) => "ok".into(),
        (None, false) => "FAIL".into(),
    };
    case.iter().map(|c| c.to_string()).chain(cells).chain([result]).collect()
}

#[cfg(test)]
mod tests {
    use super::check_row;

    #[test]
    fn check_rows_end_in_the_result() {
        let case = ["glr", "{}", "cpu", "fast", "f64"];
        assert_eq!(
            check_row(case, ["37".to_string()], None, true),
            ["glr", "{}", "cpu", "fast", "f64", "37", "ok"]
        );
        assert_eq!(check_row(case, [], None, false).last().unwrap(), "FAIL");
        assert_eq!(check_row(case, [], Some("build: nope"), true).last().unwrap(), "FAIL: build: nope");
    }
}

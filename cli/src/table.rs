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

/// A check report as a Markdown table: the case's columns (mixer, config, backend, form, dtype),
/// precision and `T`, the report's own columns `own`, then the result; `rows` from
/// [`check_row`] with the precision and `T` as its first two cells.
pub fn check_table(own: &[&str], rows: &[Vec<String>]) -> String {
    let case = ["mixer", "config", "backend", "form", "dtype", "precision", "T"];
    let headers: Vec<&str> = case.into_iter().chain(own.iter().copied()).chain(["result"]).collect();
    markdown(&headers, rows)
}

#[cfg(test)]
mod tests {
    use super::{check_row, check_table};

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

    #[test]
    fn check_tables_put_their_own_columns_between_the_case_and_the_result() {
        let row = check_row(
            ["glr", "{}", "cpu", "fast", "f64"],
            ["exact".into(), "8".into(), "1e-9".into()],
            None,
            true,
        );
        let table = check_table(&["rel RMS"], &[row]);
        let head = table.lines().next().unwrap();
        assert!(head.contains("| dtype | precision | T | rel RMS | result |"), "{head}");
        assert!(table.lines().nth(2).unwrap().ends_with("| ok     |"), "{table}");
    }
}

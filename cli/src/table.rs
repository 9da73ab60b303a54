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

//! Plain-text tables and human durations for the commands that print to
//! people (`status`, `dlq list`); `--json` is there for programs.

use std::io::{self, Write};

/// Prints rows under a header, each column padded to its widest cell; the
/// last column is not padded (it holds free text such as an error).
pub(crate) fn print(out: &mut impl Write, header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// `-`, `850ms`, `42s`, `3m05s`, `2h07m`, `3d04h`: short enough for a
/// table cell, precise enough to tell stuck from slow.
pub(crate) fn age(seconds: Option<f64>) -> String {
    let Some(seconds) = seconds.filter(|s| s.is_finite() && *s >= 0.0) else {
        return "-".into();
    };
    if seconds < 1.0 {
        return format!("{}ms", (seconds * 1000.0) as u64);
    }
    let s = seconds as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// Replaces control characters (newlines in an error message) so one entry
/// stays one line, and cuts to `max` characters.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.pop();
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(None), "-");
        assert_eq!(age(Some(0.25)), "250ms");
        assert_eq!(age(Some(42.9)), "42s");
        assert_eq!(age(Some(185.0)), "3m05s");
        assert_eq!(age(Some(7620.0)), "2h07m");
        assert_eq!(age(Some(273_600.0)), "3d04h");
    }

    #[test]
    fn tables_align_and_cells_stay_on_one_line() {
        let mut out = Vec::new();
        let rows = vec![
            vec!["a".to_owned(), "1".to_owned(), "x".to_owned()],
            vec!["long".to_owned(), "22".to_owned(), "y".to_owned()],
        ];
        print(&mut out, &["NAME", "N", "NOTE"], &rows).expect("writes");
        let text = String::from_utf8(out).expect("utf8");
        assert_eq!(text, "NAME  N   NOTE\na     1   x\nlong  22  y\n");
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("abcdef", 4), "abc…");
    }
}

//! The tables of the accounting commands (sacctmgr, sshare, sprio): Slurm's fixed-width
//! columns with a dashed rule under the header, or `|`-separated with `-p`/`-P`.

use crate::format::table::{Align, fit};

/// How tables are printed: Slurm's fixed-width columns or `|`-separated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Fixed,
    /// `-p`: trailing `|`.
    Parsable,
    /// `-P`: no trailing `|`.
    Parsable2,
}

impl Layout {
    /// The layout the `-p`/`-P` flags ask for; `-P` wins when both are given.
    pub fn from_flags(parsable: bool, parsable2: bool) -> Self {
        if parsable2 {
            Self::Parsable2
        } else if parsable {
            Self::Parsable
        } else {
            Self::Fixed
        }
    }
}

/// A column: header, width (fixed layout), alignment.
pub type Column = (String, usize, Align);

/// Renders rows as sacctmgr, sshare and sprio print them: fixed columns with a dashed rule
/// under the header (cells too long end in `+`), or `|`-separated.
///
/// Fixed columns are each followed by a space, the last one too, as sacctmgr and sshare
/// print them; sprio's `Layout::Fixed` lines end at their last column (see [`render_trimmed`]).
pub fn render(cols: &[Column], rows: &[Vec<String>], layout: Layout, header: bool) -> String {
    render_with(cols, rows, layout, header, true)
}

/// As [`render`], fixed lines ending at their last column (sprio's).
pub fn render_trimmed(
    cols: &[Column],
    rows: &[Vec<String>],
    layout: Layout,
    header: bool,
) -> String {
    render_with(cols, rows, layout, header, false)
}

fn render_with(
    cols: &[Column],
    rows: &[Vec<String>],
    layout: Layout,
    header: bool,
    space_after_each: bool,
) -> String {
    let mut out = String::new();
    let line = |cells: &[String], out: &mut String| {
        match layout {
            Layout::Fixed => {
                let parts: Vec<String> = cols
                    .iter()
                    .zip(cells)
                    .map(|((_, w, a), c)| fit(c, Some(*w), *a, true))
                    .collect();
                if space_after_each {
                    for p in &parts {
                        out.push_str(p);
                        out.push(' ');
                    }
                } else {
                    out.push_str(parts.join(" ").trim_end());
                }
            }
            Layout::Parsable | Layout::Parsable2 => {
                out.push_str(&cells.join("|"));
                if layout == Layout::Parsable {
                    out.push('|');
                }
            }
        }
        out.push('\n');
    };
    if header {
        let names: Vec<String> = cols.iter().map(|(n, _, _)| n.clone()).collect();
        line(&names, &mut out);
        if layout == Layout::Fixed {
            let rule: Vec<String> = cols.iter().map(|(_, w, _)| "-".repeat(*w)).collect();
            out.push_str(&rule.join(" "));
            if space_after_each {
                out.push(' ');
            }
            out.push('\n');
        }
    }
    for r in rows {
        line(r, &mut out);
    }
    out
}

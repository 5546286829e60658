//! The column spec grammars every listing command shares: `%[.][#][width]X` (`squeue -o`,
//! `sinfo -o`) and comma lists of names with widths (`squeue -O name:20`, `sacct --format
//! JobName%30`), parsed into a [`Format`] of pieces; and how a format lays out its header,
//! rule and rows. It knows no command's fields: those are [`Field`] tables in the sibling
//! files.

use std::borrow::Cow;

use thiserror::Error;

use crate::format::table::{Align, fit_into};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    #[error("invalid format specification {spec:?}: unknown field {field:?}")]
    UnknownField { spec: String, field: String },
    #[error("invalid format specification {spec:?}: {problem}")]
    Malformed { spec: String, problem: &'static str },
}

/// Widest column a format may ask for: a width is padding, and padding of gigabytes per
/// cell is a mistake, not a layout.
pub const MAX_WIDTH: usize = 1024;

/// A `%20` / `:20` width: a number up to [`MAX_WIDTH`].
fn parse_width(spec: &str, digits: &str) -> Result<usize, FormatError> {
    match digits.parse::<usize>() {
        Ok(w) if w <= MAX_WIDTH => Ok(w),
        Ok(_) => Err(FormatError::Malformed {
            spec: spec.to_string(),
            problem: "a width must be at most 1024",
        }),
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => Err(FormatError::Malformed {
            spec: spec.to_string(),
            problem: "a width must be at most 1024",
        }),
        Err(_) => Err(FormatError::Malformed {
            spec: spec.to_string(),
            problem: "a width must be a number",
        }),
    }
}

/// One piece of a format: literal text, or a field with its width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<F> {
    Text(String),
    Field {
        field: F,
        width: Option<usize>,
        align: Align,
    },
}

/// A parsed format: pieces printed in order, per row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format<F> {
    pub pieces: Vec<Piece<F>>,
    /// sacct marks cut values with `+`; squeue and sinfo cut silently.
    pub trunc_mark: bool,
}

/// Something a column can show about a row of type `R`.
pub trait Field<R>: Copy {
    fn header(self) -> &'static str;
    fn render(self, row: &R, ctx: &RenderCtx) -> String;
    /// [`Field::render`], borrowing text the row already holds: squeue over 100,000 jobs
    /// renders close to a million cells, and a string allocated for each one shows.
    fn cell<'r>(self, row: &'r R, ctx: &RenderCtx) -> Cow<'r, str> {
        Cow::Owned(self.render(row, ctx))
    }
}

/// What rendering needs besides the row.
#[derive(Debug, Clone, Default)]
pub struct RenderCtx {
    pub utc_offset_s: i32,
    /// `sacct --units`: memory sizes in this unit (`K`, `M`, `G`, `T`, `P`).
    pub mem_unit: Option<char>,
    /// sacct's `Cluster`.
    pub cluster: String,
    /// Group names by gid (sacct's `Group`), looked up once per gid before rendering; a
    /// gid missing here prints as its number.
    pub groups: std::collections::HashMap<u32, String>,
}

impl<F: Copy> Format<F> {
    pub fn header<R>(&self) -> String
    where
        F: Field<R>,
    {
        let mut out = String::new();
        // A header too long for its column is cut without the mark values get (sacct's
        // `TimelimitR`).
        self.line_into(&mut out, false, |f| Cow::Borrowed(f.header()));
        out
    }

    pub fn row<R>(&self, row: &R, ctx: &RenderCtx) -> String
    where
        F: Field<R>,
    {
        let mut out = String::with_capacity(128);
        self.row_into(&mut out, row, ctx);
        out
    }

    /// [`Format::row`] appended to `out`, without a string per row or per cell.
    pub fn row_into<R>(&self, out: &mut String, row: &R, ctx: &RenderCtx)
    where
        F: Field<R>,
    {
        self.line_into(out, self.trunc_mark, |f| f.cell(row, ctx));
    }

    /// The fields, in order.
    pub fn fields(&self) -> impl Iterator<Item = F> + '_ {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Field { field, .. } => Some(*field),
            Piece::Text(_) => None,
        })
    }

    /// sacct's dashed line under the header.
    pub fn rule<R>(&self) -> String
    where
        F: Field<R>,
    {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Field { width, field, .. } => {
                    let w = width.unwrap_or_else(|| Field::<R>::header(*field).len());
                    out.push_str(&"-".repeat(w));
                }
            }
        }
        out
    }

    /// Fields joined by `sep` without padding (`sacct -P`, `squeue` JSON-less machine use).
    pub fn delimited<R>(&self, row: Option<&R>, ctx: &RenderCtx, sep: &str) -> String
    where
        F: Field<R>,
    {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Field { field, .. } => Some(match row {
                    Some(r) => field.render(r, ctx),
                    None => Field::<R>::header(*field).to_string(),
                }),
                Piece::Text(_) => None,
            })
            .collect::<Vec<_>>()
            .join(sep)
    }

    fn line_into<'r>(&self, out: &mut String, mark: bool, mut text: impl FnMut(F) -> Cow<'r, str>) {
        // A last field with a width stays padded to it, as Slurm prints it.
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Field {
                    field,
                    width,
                    align,
                } => fit_into(out, &text(*field), *width, *align, mark),
            }
        }
    }
}

/// Parses a `%[.][#][width]X` format; `field_of` maps the letter.
pub fn parse_percent<F>(
    spec: &str,
    field_of: impl Fn(char) -> Option<F>,
) -> Result<Format<F>, FormatError> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.next_if_eq(&'%').is_some() {
            text.push('%');
            continue;
        }
        let align = if chars.next_if_eq(&'.').is_some() {
            Align::Right
        } else {
            Align::Left
        };
        // sinfo's "%#P" (width of the widest value) is treated as its usual width of 9.
        let auto = chars.next_if_eq(&'#').is_some();
        let mut digits = String::new();
        while let Some(d) = chars.next_if(char::is_ascii_digit) {
            digits.push(d);
        }
        let letter = chars.next().ok_or_else(|| FormatError::Malformed {
            spec: spec.to_string(),
            problem: "ends inside a % field",
        })?;
        let field = field_of(letter).ok_or_else(|| FormatError::UnknownField {
            spec: spec.to_string(),
            field: format!("%{letter}"),
        })?;
        let width = if auto {
            Some(9)
        } else if digits.is_empty() {
            None
        } else {
            Some(parse_width(spec, &digits)?)
        };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Field {
            field,
            width,
            align,
        });
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(Format {
        pieces,
        trunc_mark: false,
    })
}

/// Parses a comma list of field names with optional widths. `sep_width` is `:` for
/// `squeue -O name:20` and `%` for `sacct --format JobName%20`; `default_width` and
/// `align_of` give each field's default.
pub fn parse_named<F>(
    spec: &str,
    sep_width: char,
    after_each: &str,
    field_of: impl Fn(&str) -> Option<F>,
    default_width: impl Fn(F) -> usize,
    align_of: impl Fn(F) -> Align,
    trunc_mark: bool,
) -> Result<Format<F>, FormatError>
where
    F: Copy,
{
    let mut pieces = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, width) = match item.split_once(sep_width) {
            Some((n, w)) => (n, Some(w)),
            None => (item, None),
        };
        let field = field_of(name).ok_or_else(|| FormatError::UnknownField {
            spec: spec.to_string(),
            field: name.to_string(),
        })?;
        let (align, width) = match width {
            None => (align_of(field), default_width(field)),
            Some(w) => {
                let (align, w) = match w.strip_prefix('.') {
                    Some(w) => (Align::Right, w),
                    None => (align_of(field), w),
                };
                let w = parse_width(spec, w)?;
                (align, w)
            }
        };
        pieces.push(Piece::Field {
            field,
            width: Some(width),
            align,
        });
        if !after_each.is_empty() {
            pieces.push(Piece::Text(after_each.to_string()));
        }
    }
    if pieces.is_empty() {
        return Err(FormatError::Malformed {
            spec: spec.to_string(),
            problem: "no fields",
        });
    }
    Ok(Format { pieces, trunc_mark })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::columns::squeue::{squeue_format, squeue_named};
    use crate::format::columns::testing::view;
    use tandem_proto::v1::JobState;

    #[test]
    fn percent_specs() {
        let f = squeue_format("%i|%.5j|%10u|%%").unwrap();
        let row = f.row(&view(1, JobState::Running, ""), &RenderCtx::default());
        assert_eq!(row, "1|a-ver|alice     |%");
        assert_eq!(
            squeue_format("%i %W").unwrap_err(),
            FormatError::UnknownField {
                spec: "%i %W".into(),
                field: "%W".into()
            }
        );
        assert!(matches!(
            squeue_format("%.1"),
            Err(FormatError::Malformed { .. })
        ));
    }

    #[test]
    fn named_specs() {
        // Slurm 22.05 `-O jobid:5,name:6`: `JOBIDNAME  `: each field padded to its width
        // (20 when not given), nothing between them.
        let f = squeue_named("JobID:6,name:.8,state").unwrap();
        let row = f.row(&view(1, JobState::Running, ""), &RenderCtx::default());
        assert_eq!(row, "1     a-very-lRUNNING             ");
        assert!(squeue_named("jobid,bogus").is_err());
    }

    #[test]
    fn widths_are_capped() {
        assert!(squeue_format("%.1024i %1024j").is_ok());
        assert!(squeue_named("jobid:1024,name:.1024").is_ok());
        for spec in [
            "%.1025i",
            "%99999999999999i",
            "%999999999999999999999999999i",
        ] {
            let err = squeue_format(spec).unwrap_err().to_string();
            assert!(
                err.contains("a width must be at most 1024"),
                "{spec}: {err}"
            );
        }
        for spec in ["jobid:1025", "name:.99999999999999999999999999"] {
            let err = squeue_named(spec).unwrap_err().to_string();
            assert!(
                err.contains("a width must be at most 1024"),
                "{spec}: {err}"
            );
        }
        let err = squeue_named("jobid:x").unwrap_err().to_string();
        assert!(err.contains("a width must be a number"), "{err}");
    }
}

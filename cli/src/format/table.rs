//! Fixed-width cells as Slurm's commands print them.

/// How a cell is fitted to its width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// Pads or cuts `text` to `width` characters. squeue and sinfo cut silently; sacct marks a cut
/// with a trailing `+` (`trunc_mark`).
pub fn fit(text: &str, width: Option<usize>, align: Align, trunc_mark: bool) -> String {
    let Some(width) = width else {
        return text.to_string();
    };
    let len = text.chars().count();
    if len > width {
        if trunc_mark && width > 0 {
            let mut cut: String = text.chars().take(width - 1).collect();
            cut.push('+');
            return cut;
        }
        return text.chars().take(width).collect();
    }
    let pad = " ".repeat(width - len);
    match align {
        Align::Left => format!("{text}{pad}"),
        Align::Right => format!("{pad}{text}"),
    }
}

/// [`fit`] appending to `out`, without a temporary string.
pub fn fit_into(
    out: &mut String,
    text: &str,
    width: Option<usize>,
    align: Align,
    trunc_mark: bool,
) {
    let Some(width) = width else {
        out.push_str(text);
        return;
    };
    // Most cells are ASCII: byte length is the character count then.
    let len = if text.is_ascii() {
        text.len()
    } else {
        text.chars().count()
    };
    if len > width {
        out.push_str(&fit(text, Some(width), align, trunc_mark));
        return;
    }
    let pad = width - len;
    if align == Align::Right {
        push_spaces(out, pad);
    }
    out.push_str(text);
    if align == Align::Left {
        push_spaces(out, pad);
    }
}

/// Appends `n` spaces a slice at a time rather than one character at a time.
fn push_spaces(out: &mut String, mut n: usize) {
    const SPACES: &str = "                                ";
    while n > 0 {
        let k = n.min(SPACES.len());
        out.push_str(&SPACES[..k]);
        n -= k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_pads_and_cuts() {
        assert_eq!(fit("abc", Some(5), Align::Right, false), "  abc");
        assert_eq!(fit("abc", Some(5), Align::Left, false), "abc  ");
        assert_eq!(fit("abcdef", Some(4), Align::Right, false), "abcd");
        assert_eq!(fit("abcdef", Some(4), Align::Left, true), "abc+");
        assert_eq!(fit("abc", None, Align::Right, false), "abc");
        assert_eq!(fit("", Some(2), Align::Left, false), "  ");
        for (text, width, align, mark) in [
            ("abc", Some(5), Align::Right, false),
            ("abc", Some(5), Align::Left, false),
            ("abcdef", Some(4), Align::Left, true),
            ("héllo", Some(6), Align::Right, false),
            ("x", None, Align::Left, false),
            ("wide", Some(70), Align::Right, false),
            ("wide", Some(33), Align::Left, false),
        ] {
            let mut out = String::from(">");
            fit_into(&mut out, text, width, align, mark);
            assert_eq!(out, format!(">{}", fit(text, width, align, mark)));
        }
    }
}

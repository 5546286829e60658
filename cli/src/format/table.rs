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
    }
}

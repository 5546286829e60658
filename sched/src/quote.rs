//! Quoting user input in error messages: parse errors echo what was typed, and hostile
//! input must not make them huge.

/// Longest stretch of input (in bytes) an error message repeats.
const MAX_QUOTED: usize = 64;

/// `input` as an error message should quote it: whole if short, else its first
/// [`MAX_QUOTED`] bytes (cut at a character boundary) followed by `...`.
pub(crate) fn clipped(input: &str) -> String {
    if input.len() <= MAX_QUOTED {
        return input.to_string();
    }
    let mut end = MAX_QUOTED;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &input[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_quoted_whole() {
        assert_eq!(clipped(""), "");
        let exactly = "x".repeat(MAX_QUOTED);
        assert_eq!(clipped(&exactly), exactly);
    }

    #[test]
    fn long_input_is_cut_on_a_character_boundary() {
        let long = "a".repeat(100);
        assert_eq!(clipped(&long), format!("{}...", "a".repeat(64)));
        // 63 ASCII bytes then a 2-byte character straddling byte 64: the cut moves back.
        let straddling = format!("{}é{}", "b".repeat(63), "c".repeat(10));
        assert_eq!(clipped(&straddling), format!("{}...", "b".repeat(63)));
    }
}

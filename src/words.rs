//! Counts in words for every message: "1 host", "2 hosts", "3 classes".

/// `noun` for `n` of it: singular for exactly one, else its plural ("class" → "classes").
pub fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        noun.to_string()
    } else if noun.ends_with('s') || noun.ends_with('x') || noun.ends_with("ch") {
        format!("{noun}es")
    } else {
        format!("{noun}s")
    }
}

/// `n` and `noun` agreeing with it: "1 step", "0 steps", "2 classes".
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {}", plural(n, noun))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_everything_else_plural() {
        assert_eq!(count(1, "step"), "1 step");
        assert_eq!(count(0, "step"), "0 steps");
        assert_eq!(count(2, "host"), "2 hosts");
        assert_eq!(count(2, "class"), "2 classes");
        assert_eq!(count(1, "class"), "1 class");
        assert_eq!(plural(3, "problem"), "problems");
    }
}

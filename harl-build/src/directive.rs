//! Build-script output: the one place harl prints `cargo:` lines.
//!
//! Cargo reads every line a build script prints to stdout, and a line that starts with `cargo:`
//! is an instruction (`rustc-cfg`, `rustc-link-arg`, `rustc-env`, ...). Text that harl did not
//! write itself (a cache file's content quoted in an error, a path, an environment variable)
//! must therefore never reach stdout with a line break in it: a newline inside a warning would
//! end the warning and start a directive of the file's choosing. Every directive goes through
//! [`Directives`], which escapes control characters (newlines included) in all text that
//! is not one of harl's own literals, so each call prints exactly one line.

use std::fmt::Write as _;
use std::path::Path;

/// Escapes `text` so that it prints as one line of plain characters: control characters
/// (newline, carriage return, tab, escape, NUL, ...), Unicode's line and paragraph separators
/// and invisible format characters (bidi overrides, zero-width) become `\u{..}` escapes, and a
/// backslash becomes `\\`, so that an escape in the input cannot pass for one of ours.
/// Everything else is kept, so paths and messages stay readable.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if needs_escape(c) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Control characters, Unicode's line and paragraph separators, and the invisible format
/// characters that reorder or hide text in a terminal (bidirectional overrides and isolates,
/// zero-width characters, the byte-order mark): a warning must read as what it says.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// Prints cargo build-script directives, or nothing when quiet (outside build scripts and in
/// tests), and keeps the warnings it was given.
#[derive(Debug, Default)]
pub struct Directives {
    quiet: bool,
}

impl Directives {
    /// Prints to stdout unless `quiet`.
    pub fn new(quiet: bool) -> Self {
        Directives { quiet }
    }

    /// `cargo:warning=harl: <message>`, the message escaped.
    pub fn warning(&self, message: &str) {
        self.print("warning", &format!("harl: {}", escape(message)));
    }

    /// `cargo:rerun-if-env-changed=<var>`. Variable names are harl's own or from the user's
    /// build script, but are escaped all the same.
    pub fn rerun_if_env_changed(&self, var: &str) {
        self.print("rerun-if-env-changed", &escape(var));
    }

    /// `cargo:rerun-if-changed=<path>`. A path that cannot be written as one line of UTF-8 is
    /// not watched (cargo could not read it back either); that costs a rebuild, not a wrong one.
    /// Returns whether it printed.
    pub fn rerun_if_changed(&self, path: &Path) -> bool {
        match path.to_str() {
            Some(p) if !p.chars().any(needs_escape) => {
                self.print("rerun-if-changed", p);
                true
            }
            _ => false,
        }
    }

    /// The one `println!` of harl's build-script output. `key` is always a literal of harl's;
    /// `value` has been escaped by the caller.
    fn print(&self, key: &'static str, value: &str) {
        debug_assert!(!value.contains(['\n', '\r']));
        if !self.quiet {
            println!("cargo:{key}={value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_line_break_and_control_character() {
        let hostile = "a\nb\rc\u{0}d\u{1b}[31me\u{2028}f\u{85}g\\u{a}h\ti";
        let e = escape(hostile);
        assert_eq!(
            e,
            "a\\u{a}b\\u{d}c\\u{0}d\\u{1b}[31me\\u{2028}f\\u{85}g\\\\u{a}h\\u{9}i"
        );
        assert!(!e.chars().any(|c| c.is_control()));
    }

    #[test]
    fn bidi_overrides_and_zero_width_characters_are_escaped() {
        assert_eq!(
            escape("a\u{202e}b\u{200b}c\u{2066}d\u{feff}"),
            "a\\u{202e}b\\u{200b}c\\u{2066}d\\u{feff}"
        );
    }

    #[test]
    fn plain_text_is_unchanged() {
        let s = "kernel `dense` (x86_64-avx2): ignoring a record at /tmp/cache é.jsonl:3";
        assert_eq!(escape(s), s);
    }

    #[test]
    fn a_path_with_a_newline_is_not_watched() {
        let d = Directives::new(true);
        assert!(!d.rerun_if_changed(Path::new("/tmp/a\ncargo:rustc-cfg=x")));
        assert!(d.rerun_if_changed(Path::new("/tmp/plain")));
    }
}

//! The crate's only SQL quoting helpers: every identifier or literal it sends goes through them.

use std::fmt;

/// A string that cannot be quoted for SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuoteError;

impl fmt::Display for QuoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("contains a NUL byte (PostgreSQL text cannot hold one)")
    }
}

impl std::error::Error for QuoteError {}

/// `"name"` with every `"` doubled: safe for any name without NUL, whatever it contains.
pub fn quote_ident(name: &str) -> Result<String, QuoteError> {
    if name.contains('\0') {
        return Err(QuoteError);
    }
    Ok(format!("\"{}\"", name.replace('"', "\"\"")))
}

/// `'value'` with every `'` doubled. A value containing `\` is written as
/// `E'...'` with `\` doubled too, so it means the same whatever the server's
/// `standard_conforming_strings` (libpq's PQescapeLiteral does the same).
pub fn quote_literal(value: &str) -> Result<String, QuoteError> {
    if value.contains('\0') {
        return Err(QuoteError);
    }
    let body = value.replace('\'', "''");
    Ok(if body.contains('\\') {
        format!("E'{}'", body.replace('\\', "\\\\"))
    } else {
        format!("'{body}'")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_ident_doubles_double_quotes_and_rejects_nul() {
        assert_eq!(quote_ident("a").unwrap(), "\"a\"");
        assert_eq!(quote_ident("a\"b").unwrap(), "\"a\"\"b\"");
        assert_eq!(quote_ident("x'; drop").unwrap(), "\"x'; drop\"");
        assert_eq!(quote_ident("a\0b"), Err(QuoteError));
    }

    #[test]
    fn quote_literal_doubles_single_quotes_and_escapes_backslashes() {
        assert_eq!(quote_literal("5s").unwrap(), "'5s'");
        assert_eq!(quote_literal("it's").unwrap(), "'it''s'");
        assert_eq!(quote_literal("a\\'b").unwrap(), "E'a\\\\''b'");
        assert_eq!(quote_literal("\0"), Err(QuoteError));
    }
}

//! pgbus-hub core: one PostgreSQL LISTEN connection per host, shared by the
//! workers of a preforking server over a Unix socket. Knows nothing of Ruby.
//!
//! Layout (one job per module):
//! - [`protocol`]: frames (4-byte length + JSON object), encoder and incremental decoder.

pub mod protocol;

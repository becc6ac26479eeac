//! A cut (docs/architecture.md, "The cut"): two LISTEN connections, an old
//! side and a new side, split at one position of PostgreSQL's notification
//! queue by a token K that the new side NOTIFYs on the old side's private
//! channel and on its own in ONE transaction. Both read their copy of K at
//! the same position.
//!
//! [`Cut::new`] is the one place that decides whether a cut may be
//! committed: a peer of our uid asks a hub for one with any strings (the
//! `marker` frame), and must never make it NOTIFY an application's channel.
//! The engine takes only a [`Cut`], so nothing reaches a NOTIFY unchecked.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::MAX_CHANNEL_BYTES;
use crate::conninfo::{quote_ident, quote_literal};

/// Every engine's private channel starts so (`pgbus_hub.handover.<pid>.<random>`):
/// the only channels a cut NOTIFYs.
pub const PRIVATE_CHANNEL_PREFIX: &str = "pgbus_hub.handover.";

/// A cut's token starts so; the handover's own tokens (`<pid>.<random>.<n>`)
/// never do, so an engine tells the two apart on its private channel.
pub const CUT_TOKEN_PREFIX: &str = "move.";

/// The longest token a cut NOTIFYs: ours are at most 5 + 10 + 1 + 16 + 1 + 20
/// = 53 bytes; the bound keeps a peer's from growing the queue's entries.
pub const MAX_CUT_TOKEN_BYTES: usize = 100;

/// Whether `payload`, read on an engine's private channel, is a cut's token
/// (else it is a handover's).
pub fn is_cut_token(payload: &str) -> bool {
    payload.starts_with(CUT_TOKEN_PREFIX)
}

/// A token unique to one cut: `move.<pid>.<random>.<n>`, the random drawn
/// once per process, n counted per process (a forked child has its own pid).
pub fn cut_token() -> String {
    static RANDOM: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let random = RANDOM.get_or_init(|| RandomState::new().build_hasher().finish());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) + 1;
    format!("{CUT_TOKEN_PREFIX}{}.{random:016x}.{n}", std::process::id())
}

/// The other side's private channel and the token K: what a new side
/// commits, with its own private channel, in one transaction.
#[derive(Clone, PartialEq, Eq)]
pub struct Cut {
    channel: String,
    token: String,
    /// The two as they go into the SQL (checked quotable in [`Cut::new`]).
    quoted_channel: String,
    quoted_token: String,
}

impl fmt::Debug for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cut")
            .field("channel", &self.channel)
            .field("token", &self.token)
            .finish()
    }
}

impl Cut {
    /// A cut NOTIFYing `token` on `channel`, the other side's private
    /// channel. Refused unless `channel` is a private channel
    /// ([`PRIVATE_CHANNEL_PREFIX`], a name PostgreSQL does not truncate) and
    /// `token` a cut's ([`CUT_TOKEN_PREFIX`], at most [`MAX_CUT_TOKEN_BYTES`]).
    pub fn new(channel: impl Into<String>, token: impl Into<String>) -> Result<Self, CutError> {
        let (channel, token) = (channel.into(), token.into());
        let refused = |why: &str| Err(CutError::Refused(why.to_owned()));
        if !channel.starts_with(PRIVATE_CHANNEL_PREFIX) || channel.len() > MAX_CHANNEL_BYTES {
            return refused(&format!(
                "channel {channel:?} is not a private channel ({PRIVATE_CHANNEL_PREFIX}*, at most \
                 {MAX_CHANNEL_BYTES} bytes)"
            ));
        }
        if !is_cut_token(&token) || token.len() > MAX_CUT_TOKEN_BYTES {
            return refused(&format!(
                "token {token:?} is not a cut's ({CUT_TOKEN_PREFIX}*, at most {MAX_CUT_TOKEN_BYTES} bytes)"
            ));
        }
        let (Ok(quoted_channel), Ok(quoted_token)) = (quote_ident(&channel), quote_literal(&token))
        else {
            return refused("a NUL byte in the channel or the token");
        };
        Ok(Self {
            channel,
            token,
            quoted_channel,
            quoted_token,
        })
    }

    /// The other side's private channel.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// K.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// `NOTIFY <other side>, 'K';NOTIFY <own>, 'K';`, for a transaction;
    /// `own` is the committing engine's private channel, quoted. The order
    /// within the transaction does not matter: its entries sit together in
    /// the queue, nothing between them.
    pub(super) fn notify_sql(&self, own: &str) -> String {
        format!(
            "NOTIFY {}, {};NOTIFY {own}, {};",
            self.quoted_channel, self.quoted_token, self.quoted_token
        )
    }
}

/// Why a cut was not committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CutError {
    /// Not a private channel or not a cut's token ([`Cut::new`]): never NOTIFYed.
    Refused(String),
    /// The engine has no connection LISTENing its set (connecting,
    /// reconnecting): the cut cannot mark where this side starts. Ask again.
    NotListening,
    /// The engine stopped (or ended) before the cut was committed.
    Stopped,
    /// The server refused the transaction, or the connection broke or did
    /// not answer during it: it may or may not have committed.
    Failed(String),
}

impl fmt::Display for CutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(why) => write!(f, "cut refused: {why}"),
            Self::NotListening => {
                f.write_str("no connection LISTENing: the cut cannot be committed now")
            }
            Self::Stopped => f.write_str("the listener stopped before the cut was committed"),
            Self::Failed(why) => write!(f, "committing the cut failed: {why}"),
        }
    }
}

impl std::error::Error for CutError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_names_a_private_channel_and_a_cut_token_only() {
        let channel = "pgbus_hub.handover.42.00000000000000ff";
        let token = cut_token();
        let cut = Cut::new(channel, token.clone()).unwrap();
        assert_eq!((cut.channel(), cut.token()), (channel, token.as_str()));
        assert_eq!(
            cut.notify_sql("\"own\""),
            format!("NOTIFY \"{channel}\", '{token}';NOTIFY \"own\", '{token}';")
        );
        // An application's channel, a handover's token: refused.
        for (channel, token) in [
            ("pgmq.q_orders.INSERT", token.as_str()),
            ("pgbus_hub.handoverx", token.as_str()),
            (channel, "42.ff.1"),
            (channel, "moved.1"),
        ] {
            assert!(
                matches!(Cut::new(channel, token), Err(CutError::Refused(_))),
                "{channel} {token}"
            );
        }
        // PostgreSQL would truncate the name: another channel.
        let long = format!("{PRIVATE_CHANNEL_PREFIX}{}", "x".repeat(64));
        assert!(Cut::new(long, token.clone()).is_err());
        let max = format!("{CUT_TOKEN_PREFIX}{}", "x".repeat(MAX_CUT_TOKEN_BYTES - 5));
        assert!(Cut::new(channel, max.clone()).is_ok());
        assert!(Cut::new(channel, format!("{max}x")).is_err());
        assert!(Cut::new(channel, "move.\0").is_err());
        assert!(Cut::new(format!("{PRIVATE_CHANNEL_PREFIX}\0"), token).is_err());
        // Quotes are SQL's to escape, not ours to refuse.
        let quoted = Cut::new("pgbus_hub.handover.\"x", "move.'; x").unwrap();
        assert_eq!(
            quoted.notify_sql("o"),
            "NOTIFY \"pgbus_hub.handover.\"\"x\", 'move.''; x';NOTIFY o, 'move.''; x';"
        );
    }

    #[test]
    fn tokens_are_unique_cut_tokens_that_fit() {
        let (a, b) = (cut_token(), cut_token());
        assert_ne!(a, b);
        assert!(is_cut_token(&a) && a.len() <= MAX_CUT_TOKEN_BYTES);
        assert!(a.starts_with(&format!("move.{}.", std::process::id())));
    }
}

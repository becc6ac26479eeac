//! Where the serving connection and the standby stand relative to the
//! standby's alignment markers (docs/architecture.md, "Standby"): pure
//! bookkeeping, no I/O. A chain of markers: the standby's first
//! transaction's, then one per change of the listen set. Each connection
//! counts the entries of its *counted set*, switched when IT reads a marker,
//! so both count the same entries whatever the time they read them: a
//! position (marker, index) names one entry on both.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, VecDeque};
use std::hash::{BuildHasher, Hasher};

/// An alignment marker's token starts so: neither a handover's tokens
/// (`<pid>.<random>.<n>`) nor a cut's (`move.`) do.
pub(super) const TOKEN_PREFIX: &str = "standby.";

/// The most payload bytes the standby holds ahead of the serving
/// connection (the handover's bound). Past it the serving connection lags
/// for a reason of its own (a stalled path, a full socket): it is given up
/// and the standby promoted, which is exact.
pub(super) const HELD_BYTES_LIMIT: usize = 32 << 20;

pub(super) fn is_alignment_token(payload: &str) -> bool {
    payload.starts_with(TOKEN_PREFIX)
}

/// What an entry read on either connection is, for the alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind<'a> {
    /// An alignment marker (of the chain, or a stale one): never delivered.
    Marker(&'a str),
    /// A notification on `channel`, or (`cut`) a cut's marker on the
    /// private channel, which every connection counts.
    Entry { channel: &'a str, cut: bool },
}

/// What a connection does with a marker it read: UNLISTEN the channels the
/// set lost at it (deferred to here: a backend filters at read time, so an
/// earlier UNLISTEN would hide entries before the marker the other
/// connection still counts). The caller leaves out any back in the set.
pub(super) type Unlisten = Vec<String>;

/// What the serving connection does with an entry it read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Serving {
    /// Handled as without a standby; `counted`: call [`Alignment::serving_delivered`] once it was.
    Deliver { counted: bool },
    /// Dropped (a marker; after a promotion, what the lost connection delivered).
    Drop(Unlisten),
}

/// What the standby does with an entry it read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Standby {
    /// Dropped or held (a marker's UNLISTENs to run).
    Taken(Unlisten),
    /// Held past [`HELD_BYTES_LIMIT`]: give the serving connection up.
    Overflow,
}

/// One marker of the chain and the set change it carries.
#[derive(Debug)]
struct Link {
    token: String,
    added: Vec<String>,
    removed: Vec<String>,
}

/// One connection's place in the chain.
#[derive(Debug, Default, Clone)]
struct Side {
    /// The last link it read (None: not the first yet).
    link: Option<usize>,
    /// Counted entries read since that link.
    index: u64,
    counted: BTreeSet<String>,
}

impl Side {
    /// Reads `token`: the next link applies its change. Returns its removed
    /// channels, or None when `token` is not the next link (a stale marker).
    fn read_marker(&mut self, chain: &[Link], token: &str) -> Option<Unlisten> {
        let next = self.link.map_or(0, |link| link + 1);
        let link = chain.get(next).filter(|link| link.token == token)?;
        self.counted.extend(link.added.iter().cloned());
        for channel in &link.removed {
            self.counted.remove(channel);
        }
        self.link = Some(next);
        self.index = 0;
        Some(link.removed.clone())
    }

    fn counts(&self, kind: Kind<'_>) -> bool {
        match kind {
            Kind::Entry { channel, cut } => {
                self.link.is_some() && (cut || self.counted.contains(channel))
            }
            Kind::Marker(_) => false,
        }
    }

    /// Counts one more entry; its position.
    fn count(&mut self) -> Option<(usize, u64)> {
        self.index += 1;
        Some((self.link?, self.index))
    }

    fn position(&self) -> Option<(usize, u64)> {
        Some((self.link?, self.index))
    }
}

#[derive(Debug)]
enum Phase {
    /// No standby aligning or aligned (a stale alignment marker is dropped).
    Idle,
    Aligning {
        chain: Vec<Link>,
        serving: Side,
        standby: Side,
        /// Counted entries the standby read that the serving connection has
        /// not, in order, with their positions.
        held: VecDeque<((usize, u64), String, String)>,
        held_bytes: usize,
    },
    /// The standby serves now and drops what it reads up to `through`, the
    /// lost connection's position; idle once past it with every link read.
    Promoted {
        chain: Vec<Link>,
        side: Side,
        through: (usize, u64),
    },
}

#[derive(Debug)]
pub(super) struct Alignment {
    random: u64,
    counter: u64,
    phase: Phase,
}

impl Alignment {
    pub(super) fn new() -> Self {
        Self {
            random: RandomState::new().build_hasher().finish(),
            counter: 0,
            phase: Phase::Idle,
        }
    }

    fn token(&mut self) -> String {
        self.counter += 1;
        format!(
            "{TOKEN_PREFIX}{}.{:016x}.{}",
            std::process::id(),
            self.random,
            self.counter
        )
    }

    /// A new standby LISTENing `set`: the chain starts with its first
    /// transaction's marker, whose token this returns.
    pub(super) fn begin(&mut self, set: Vec<String>) -> String {
        let token = self.token();
        self.phase = Phase::Aligning {
            chain: vec![Link {
                token: token.clone(),
                added: set,
                removed: Vec::new(),
            }],
            serving: Side::default(),
            standby: Side::default(),
            held: VecDeque::new(),
            held_bytes: 0,
        };
        token
    }

    /// The set changed (the serving connection LISTENs what was added):
    /// the marker the standby commits with its LISTENs of `added`, or None
    /// without a chain.
    pub(super) fn change(&mut self, added: Vec<String>, removed: Vec<String>) -> Option<String> {
        if !matches!(self.phase, Phase::Aligning { .. }) {
            return None;
        }
        let token = self.token();
        if let Phase::Aligning { chain, .. } = &mut self.phase {
            chain.push(Link {
                token: token.clone(),
                added,
                removed,
            });
        }
        Some(token)
    }

    /// The standby is gone (or was never aligned): nothing to align.
    pub(super) fn reset(&mut self) {
        self.phase = Phase::Idle;
    }

    /// The serving connection read the chain's first marker: a loss from
    /// now on is covered.
    pub(super) fn aligned(&self) -> bool {
        matches!(&self.phase, Phase::Aligning { serving, .. } if serving.link.is_some())
    }

    /// A chain whose markers the serving connection has not all read: its
    /// UNLISTENs wait for them.
    pub(super) fn chained(&self) -> bool {
        matches!(self.phase, Phase::Aligning { .. })
    }

    /// Neither aligning nor catching up: a new standby may align.
    pub(super) fn idle(&self) -> bool {
        matches!(self.phase, Phase::Idle)
    }

    /// A promoted connection is still dropping what the lost one delivered
    /// (or has links to read): the set must not change meanwhile.
    pub(super) fn catching_up(&self) -> bool {
        matches!(self.phase, Phase::Promoted { .. })
    }

    /// An entry the serving connection read, before it is handled.
    pub(super) fn serving_read(&mut self, kind: Kind<'_>) -> Serving {
        match &mut self.phase {
            Phase::Idle => match kind {
                Kind::Marker(_) => Serving::Drop(Vec::new()),
                Kind::Entry { .. } => Serving::Deliver { counted: false },
            },
            Phase::Aligning { chain, serving, .. } => match kind {
                Kind::Marker(token) => {
                    Serving::Drop(serving.read_marker(chain, token).unwrap_or_default())
                }
                entry => Serving::Deliver {
                    counted: serving.counts(entry),
                },
            },
            Phase::Promoted {
                chain,
                side,
                through,
            } => {
                let outcome = match kind {
                    Kind::Marker(token) => {
                        Serving::Drop(side.read_marker(chain, token).unwrap_or_default())
                    }
                    entry if side.counts(entry) => match side.count() {
                        Some(position) if position <= *through => Serving::Drop(Vec::new()),
                        _ => Serving::Deliver { counted: false },
                    },
                    // Not counted while catching up: before its first marker
                    // (the lost one's), or on a channel before the marker that
                    // added it (the lost one may have delivered it; its ack
                    // promised nothing before that marker): dropped.
                    Kind::Entry { .. } => Serving::Drop(Vec::new()),
                };
                // Everything the lost one delivered read, and every link.
                let past = side.position().is_some_and(|position| position >= *through);
                if past && side.link == Some(chain.len() - 1) {
                    self.phase = Phase::Idle;
                }
                outcome
            }
        }
    }

    /// The serving connection handled a counted entry: its position moves
    /// on, and what the standby held up to it is dropped.
    pub(super) fn serving_delivered(&mut self) {
        if let Phase::Aligning {
            serving,
            held,
            held_bytes,
            ..
        } = &mut self.phase
        {
            let Some(position) = serving.count() else {
                return;
            };
            while held.front().is_some_and(|(at, ..)| *at <= position) {
                if let Some((_, channel, payload)) = held.pop_front() {
                    *held_bytes -= channel.len() + payload.len();
                }
            }
        }
    }

    /// An entry the standby read (it delivers nothing): dropped before its
    /// first marker and up to the serving connection's position, held after.
    pub(super) fn standby_read(&mut self, kind: Kind<'_>, payload: &str) -> Standby {
        let Phase::Aligning {
            chain,
            serving,
            standby,
            held,
            held_bytes,
        } = &mut self.phase
        else {
            return Standby::Taken(Vec::new());
        };
        let channel = match kind {
            Kind::Marker(token) => {
                return Standby::Taken(standby.read_marker(chain, token).unwrap_or_default())
            }
            Kind::Entry { channel, .. } => channel,
        };
        if !standby.counts(kind) {
            return Standby::Taken(Vec::new());
        }
        let Some(position) = standby.count() else {
            return Standby::Taken(Vec::new());
        };
        if serving.position().is_some_and(|at| position <= at) {
            return Standby::Taken(Vec::new());
        }
        *held_bytes += channel.len() + payload.len();
        held.push_back((position, channel.to_owned(), payload.to_owned()));
        if *held_bytes > HELD_BYTES_LIMIT {
            return Standby::Overflow;
        }
        Standby::Taken(Vec::new())
    }

    /// The serving connection is lost: the standby serves. Returns what it
    /// held (all after the lost connection's position, in order), or None
    /// when not aligned (the lost backend alone had what lay between).
    pub(super) fn promote(&mut self) -> Option<Vec<(String, String)>> {
        if !self.aligned() {
            return None;
        }
        let Phase::Aligning {
            chain,
            serving,
            standby,
            held,
            ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return None;
        };
        let through = serving.position()?;
        let past = standby.position().is_some_and(|at| at >= through);
        if !(past && standby.link == Some(chain.len() - 1)) {
            self.phase = Phase::Promoted {
                chain,
                side: standby,
                through,
            };
        }
        Some(
            held.into_iter()
                .map(|(_, channel, payload)| (channel, payload))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(channel: &str) -> Kind<'_> {
        Kind::Entry {
            channel,
            cut: false,
        }
    }

    fn deliver(alignment: &mut Alignment, channel: &str) -> bool {
        match alignment.serving_read(entry(channel)) {
            Serving::Deliver { counted } => {
                if counted {
                    alignment.serving_delivered();
                }
                true
            }
            Serving::Drop(_) => false,
        }
    }

    fn standby(alignment: &mut Alignment, channel: &str, payload: &str) {
        assert_eq!(
            alignment.standby_read(entry(channel), payload),
            Standby::Taken(vec![])
        );
    }

    fn payloads(held: Vec<(String, String)>) -> Vec<String> {
        held.into_iter().map(|(_, payload)| payload).collect()
    }

    #[test]
    fn the_standby_holds_only_what_the_serving_connection_has_not_read_and_serves_from_there() {
        let mut alignment = Alignment::new();
        let token = alignment.begin(vec!["q".into()]);
        assert!(is_alignment_token(&token));
        // Before its marker the standby drops (the serving connection's).
        standby(&mut alignment, "q", "0");
        alignment.standby_read(Kind::Marker(&token), "");
        for payload in ["1", "2", "3"] {
            standby(&mut alignment, "q", payload);
        }
        assert!(!alignment.aligned());
        assert!(deliver(&mut alignment, "q")); // 0
        assert_eq!(
            alignment.serving_read(Kind::Marker(&token)),
            Serving::Drop(vec![])
        );
        assert!(alignment.aligned());
        assert!(deliver(&mut alignment, "q")); // 1
        let held = alignment.promote().unwrap();
        assert_eq!(payloads(held), ["2", "3"]);
        assert!(alignment.idle());
        assert!(deliver(&mut alignment, "q"));
    }

    #[test]
    fn a_standby_behind_the_lost_connection_drops_up_to_where_it_stopped() {
        let mut alignment = Alignment::new();
        let token = alignment.begin(vec!["q".into()]);
        alignment.serving_read(Kind::Marker(&token));
        for _ in 0..3 {
            assert!(deliver(&mut alignment, "q"));
        }
        alignment.standby_read(Kind::Marker(&token), "");
        standby(&mut alignment, "q", "1");
        assert_eq!(alignment.promote(), Some(vec![]));
        // As the serving connection now: 2 and 3 were delivered, 4 is new.
        assert!(alignment.catching_up());
        assert!(!deliver(&mut alignment, "q"));
        assert!(!deliver(&mut alignment, "q"));
        assert!(alignment.idle());
        assert!(deliver(&mut alignment, "q"));
    }

    #[test]
    fn a_standby_that_had_not_read_its_marker_drops_up_to_it_then_up_to_the_position() {
        let mut alignment = Alignment::new();
        let token = alignment.begin(vec!["q".into()]);
        alignment.serving_read(Kind::Marker(&token));
        assert!(deliver(&mut alignment, "q"));
        assert_eq!(alignment.promote(), Some(vec![]));
        assert!(!deliver(&mut alignment, "q")); // before its marker
        alignment.serving_read(Kind::Marker(&token));
        assert!(!deliver(&mut alignment, "q")); // delivered by the lost one
        assert!(deliver(&mut alignment, "q"));
        // Not counted entries pass as without a standby; stale markers are dropped.
        assert!(deliver(&mut alignment, "other"));
        assert_eq!(
            alignment.serving_read(Kind::Marker("standby.1.2.3")),
            Serving::Drop(vec![])
        );
    }

    #[test]
    fn a_set_change_keeps_the_alignment_both_connections_switching_at_its_marker() {
        let mut alignment = Alignment::new();
        let first = alignment.begin(vec!["a".into(), "gone".into()]);
        alignment.serving_read(Kind::Marker(&first));
        alignment.standby_read(Kind::Marker(&first), "");
        // "b" added (the serving connection LISTENs it first), "gone" removed.
        let second = alignment
            .change(vec!["b".into()], vec!["gone".into()])
            .unwrap();
        assert!(alignment.aligned());
        // Before the marker: "b" is not counted (the standby does not see
        // it), "gone" still is on both.
        assert_eq!(
            alignment.serving_read(entry("b")),
            Serving::Deliver { counted: false }
        );
        assert!(deliver(&mut alignment, "gone")); // (0, 1)
        standby(&mut alignment, "gone", "g1"); // (0, 1): the serving connection's
        standby(&mut alignment, "a", "a1"); // (0, 2): held
                                            // The standby reads the marker first: UNLISTEN "gone" there now.
        assert_eq!(
            alignment.standby_read(Kind::Marker(&second), ""),
            Standby::Taken(vec!["gone".into()])
        );
        standby(&mut alignment, "b", "b1"); // (1, 1): held
        standby(&mut alignment, "gone", "g2"); // not counted any more
                                               // The serving connection is lost before it read a1 or the marker.
        let held = alignment.promote().unwrap();
        assert_eq!(payloads(held), ["a1", "b1"]);
        // The promoted connection has read every link: idle once past (0, 1).
        assert!(alignment.idle());
    }

    #[test]
    fn a_promoted_connection_reads_the_links_it_had_not_and_runs_their_unlistens() {
        let mut alignment = Alignment::new();
        let first = alignment.begin(vec!["a".into(), "gone".into()]);
        alignment.serving_read(Kind::Marker(&first));
        assert!(deliver(&mut alignment, "a")); // (0, 1)
        let second = alignment.change(vec![], vec!["gone".into()]).unwrap();
        assert_eq!(
            alignment.serving_read(Kind::Marker(&second)),
            Serving::Drop(vec!["gone".into()])
        );
        assert!(deliver(&mut alignment, "a")); // (1, 1)
        assert_eq!(alignment.promote(), Some(vec![]));
        // The standby had read nothing: its first marker, (0, 1), the
        // second with its UNLISTEN, (1, 1), then new entries.
        assert!(!deliver(&mut alignment, "a"));
        alignment.serving_read(Kind::Marker(&first));
        assert!(!deliver(&mut alignment, "a"));
        assert_eq!(
            alignment.serving_read(Kind::Marker(&second)),
            Serving::Drop(vec!["gone".into()])
        );
        assert!(alignment.catching_up());
        assert!(!deliver(&mut alignment, "a"));
        assert!(alignment.idle());
        assert!(deliver(&mut alignment, "a"));
    }

    #[test]
    fn not_aligned_is_not_promoted_and_what_is_held_is_bounded() {
        let mut alignment = Alignment::new();
        assert_eq!(alignment.promote(), None);
        assert_eq!(alignment.change(vec![], vec![]), None);
        let token = alignment.begin(vec!["q".into()]);
        alignment.standby_read(Kind::Marker(&token), "");
        assert_eq!(alignment.promote(), None);
        let big = "x".repeat(HELD_BYTES_LIMIT / 2);
        standby(&mut alignment, "q", &big);
        assert_eq!(alignment.standby_read(entry("q"), &big), Standby::Overflow);
        assert_eq!(
            alignment.serving_read(Kind::Marker("standby.0.0.0")),
            Serving::Drop(vec![])
        );
        assert!(!alignment.aligned());
    }
}

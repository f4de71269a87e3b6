//! Where a shard this instance takes opens: [`position::starting_point`] over the row's
//! checkpoint, with what only the subscription knows (is this one of the shards it opens with,
//! has `start` returned yet). Pure, tested without I/O.

use std::collections::{BTreeMap, HashSet};

use super::listing::Tip;
use crate::api::ShardDescription;
use crate::error::KinesisError;
use crate::lease::Lease;
use crate::position::{Checkpoint, KinesisPosition, ShardOrigin, StartingPoint, starting_point};

/// Why a position naming a shard the stream does not list applies to nothing.
pub(crate) const UNLISTED: &str =
    "the stream does not list it (a mistyped id, or a shard past the retention period)";

/// Why a `start_at` naming a finished shard does not replay it.
pub(crate) const FINISHED: &str = "the shard is finished (read to its end): a start does not \
     read it again (the command-line tool's `reset` does)";

/// Why a `start_at` naming a shard this instance does not open at its start does not apply.
pub(crate) const NOT_OPENED: &str = "not opened by this instance at this start (another \
     instance reads it, or a parent of it is not finished yet): wherever it is opened later, it \
     resumes from its checkpoint";

/// The shard a position of one record names, with the setting's name, when it does not
/// apply at the start whose first listing saw `shards` and `rows` and took `opened`: `None`
/// when it applies, or names no shard.
///
/// A `start_at` applies to the named shard when this instance opens it at its start; an
/// `initial_position` applies to the shard's row when it has none yet, so it is said only when
/// the stream does not list the shard (it then applies to nothing, ever).
pub(crate) fn not_applied<'p>(
    setting: &'static str,
    position: &'p KinesisPosition,
    shards: &[ShardDescription],
    rows: &BTreeMap<String, Lease>,
    opened: &HashSet<String>,
) -> Option<(&'p str, &'static str)> {
    let shard = position.shard()?;
    if !shards.iter().any(|s| s.shard_id == shard) {
        return Some((shard, UNLISTED));
    }
    if setting != "start_at" || opened.contains(shard) {
        return None;
    }
    let finished = rows.get(shard).is_some_and(Lease::is_finished);
    Some((shard, if finished { FINISHED } else { NOT_OPENED }))
}

/// The listed shards a `start_at` of every shard (the horizon, a time) reaches back before
/// but does not read again: those whose row says they are finished. A start opens only
/// unfinished shards; their children open at the position. Empty for any other position.
pub(crate) fn finished_not_replayed<'l>(
    start_at: &KinesisPosition,
    shards: &'l [ShardDescription],
    rows: &BTreeMap<String, Lease>,
) -> Vec<&'l str> {
    if !matches!(
        start_at,
        KinesisPosition::Horizon | KinesisPosition::Timestamp(_)
    ) {
        return Vec::new();
    }
    shards
        .iter()
        .filter(|shard| {
            rows.get(&shard.shard_id).is_some_and(|row| {
                row.is_finished() && !super::lineage::is_other_generation(row, shard)
            })
        })
        .map(|shard| shard.shard_id.as_str())
        .collect()
}

/// At most `shown` of `ids`, joined, and how many more there are.
pub(crate) fn some_of(ids: &[&str], shown: usize) -> String {
    let listed = ids[..ids.len().min(shown)].join(", ");
    match ids.len().saturating_sub(shown) {
        0 => listed,
        more => format!("{listed} and {more} more"),
    }
}

/// The refusal of a `start_at` naming a shard the stream does not list, or `None`.
pub(crate) fn unlisted_refusal(
    stream: &str,
    start_at: &KinesisPosition,
    shards: &[ShardDescription],
) -> Option<KinesisError> {
    let shard = start_at.shard()?;
    if shards.iter().any(|s| s.shard_id == shard) {
        return None;
    }
    let mut listed: Vec<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
    listed.sort_unstable();
    let listed = some_of(&listed, 8);
    Some(KinesisError::InvalidConfig {
        setting: "start_at",
        value: format!("{start_at:?}"),
        reason: format!("stream `{stream}` lists no shard {shard} ({UNLISTED}); it lists {listed}"),
    })
}

/// What the subscription knows about its own start.
#[derive(Debug, Clone)]
pub(crate) struct StartContext<'a> {
    /// The position `start_at(..)` names, if any.
    pub(crate) start_at: Option<&'a KinesisPosition>,
    /// The time the subscription started, as an AT_TIMESTAMP (with the clock allowance).
    pub(crate) started: &'a StartingPoint,
    /// `start` has not returned yet: LATEST is asked for right now, so it is exact. Once it
    /// has returned, LATEST would skip what was written since, so the start time stands in.
    pub(crate) starting: bool,
    /// This instance fetched a [`Tip`] for the shard before it created the shard's row.
    pub(crate) fetched_tip: bool,
}

/// Where a taken shard's reader opens, and what to record about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Opening {
    /// The first iterator's position.
    pub(crate) start: StartingPoint,
    /// `start_at(..)` applies, ahead of the row's checkpoint: the shard's ledger starts empty.
    pub(crate) overridden: bool,
    /// Record where the reader begins (a [`Checkpoint::Start`]) once the position is fixed,
    /// so that a takeover after a crash resumes there. Not needed over a sequence number.
    pub(crate) record: bool,
    /// The shard's hash key range, from the listing (for aggregates put against a stale map).
    pub(crate) hash_range: Option<(String, String)>,
    /// The LATEST iterator to open with, fetched before the row was created.
    pub(crate) tip: Option<Tip>,
}

/// Decides where a shard opens. `at_startup` is true for the shards the subscription opens
/// with. `None` for a finished shard.
pub(crate) fn opening(
    shard: &str,
    checkpoint: Option<&Checkpoint>,
    at_startup: bool,
    context: &StartContext<'_>,
) -> Option<Opening> {
    let named = context.start_at.and_then(|p| p.for_shard(shard));
    // A shard nobody has settled a record of begins where the application's first start
    // began (its row's `Initial`), or where a reader of it began (`Start`), even under
    // `start_at(latest())`: another instance that started a moment earlier promised
    // everything written since its own start, and may have handed the shard on since.
    let unread_at_tip = named == Some(StartingPoint::Latest)
        && matches!(
            checkpoint,
            Some(Checkpoint::Initial(_) | Checkpoint::Start(_))
        );
    let overridden = at_startup && named.is_some() && !unread_at_tip;
    let origin = if overridden {
        ShardOrigin::Startup
    } else if checkpoint.is_none() {
        // A row without a checkpoint is always a descendant, read after its parents.
        ShardOrigin::Child
    } else {
        ShardOrigin::Takeover
    };
    let mut start = starting_point(shard, origin, context.start_at, checkpoint)?;
    let own_tip = context.fetched_tip
        && matches!(checkpoint, Some(Checkpoint::Initial(p)) if p == context.started);
    if start == StartingPoint::Latest && !context.starting {
        start = context.started.clone();
    } else if own_tip && at_startup && context.starting {
        // A row this instance created at the tip opens with the LATEST iterator fetched just
        // before the row was created: exact, and earlier than any other instance's `start`
        // could return counting the shard. Another instance's tip, or a row created without
        // one, opens at the start time it records.
        start = StartingPoint::Latest;
    }
    let record = overridden
        || !matches!(
            checkpoint,
            Some(Checkpoint::Sequence(_) | Checkpoint::SubSequence(..))
        );
    Some(Opening {
        start,
        overridden,
        record,
        hash_range: None,
        tip: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STARTED: StartingPoint = StartingPoint::AtTimestamp(1_000);

    fn context(start_at: Option<&KinesisPosition>, starting: bool) -> StartContext<'_> {
        StartContext {
            start_at,
            started: &STARTED,
            starting,
            fetched_tip: true,
        }
    }

    fn at(
        checkpoint: Option<Checkpoint>,
        at_startup: bool,
        context: &StartContext<'_>,
    ) -> Option<StartingPoint> {
        opening("s", checkpoint.as_ref(), at_startup, context).map(|o| o.start)
    }

    fn listed(id: &str) -> ShardDescription {
        ShardDescription {
            shard_id: id.to_owned(),
            parent_shard_id: None,
            adjacent_parent_shard_id: None,
            starting_hash_key: "0".into(),
            ending_hash_key: "1".into(),
            starting_sequence_number: "1".into(),
            ending_sequence_number: None,
        }
    }

    #[test]
    fn a_position_of_one_shard_that_does_not_apply_at_this_start_says_why() {
        let shards = [listed("s0"), listed("s1")];
        let mut rows = BTreeMap::new();
        let mut finished = Lease::new("st", "s1", vec![]);
        finished.checkpoint = Some(Checkpoint::ShardEnd);
        rows.insert("s1".to_owned(), finished);
        let opened: HashSet<String> = ["s0".to_owned()].into();
        let at = |shard: &str| KinesisPosition::sequence(shard, "7");
        let why_over = |rows: &BTreeMap<String, Lease>, setting, position: &KinesisPosition| {
            not_applied(setting, position, &shards, rows, &opened).map(|(_, why)| why)
        };
        let why = |setting, position: &KinesisPosition| why_over(&rows, setting, position);
        assert_eq!(why("start_at", &at("s0")), None, "opened here: applies");
        assert_eq!(why("start_at", &at("s1")), Some(FINISHED));
        assert_eq!(why("start_at", &at("s9")), Some(UNLISTED));
        assert_eq!(why("initial_position", &at("s9")), Some(UNLISTED));
        assert_eq!(why("initial_position", &at("s1")), None);
        assert_eq!(why("start_at", &KinesisPosition::horizon()), None);
        let unread = BTreeMap::new();
        assert_eq!(why_over(&unread, "start_at", &at("s1")), Some(NOT_OPENED));
        let refused = unlisted_refusal("st", &at("s9"), &shards).map(|e| e.to_string());
        assert!(
            refused.as_deref().is_some_and(|e| e.contains("`start_at`")
                && e.contains("s9")
                && e.contains("s0, s1")),
            "{refused:?}"
        );
        assert!(unlisted_refusal("st", &at("s1"), &shards).is_none());
        let many: Vec<ShardDescription> = (0..20).map(|i| listed(&format!("s{i:02}"))).collect();
        let refused = unlisted_refusal("st", &at("x"), &many).unwrap().to_string();
        assert!(refused.ends_with("s07 and 12 more"), "{refused}");
    }

    #[test]
    fn a_replay_of_every_shard_passes_over_the_finished_ones() {
        let mut child = listed("s1");
        child.parent_shard_id = Some("s0".into());
        let shards = [listed("s0"), child];
        let mut rows = BTreeMap::new();
        let mut parent = Lease::new("st", "s0", vec![]);
        parent.checkpoint = Some(Checkpoint::ShardEnd);
        rows.insert("s0".to_owned(), parent.clone());
        rows.insert("s1".to_owned(), Lease::new("st", "s1", vec!["s0".into()]));
        for every in [KinesisPosition::horizon(), KinesisPosition::timestamp(5)] {
            assert_eq!(finished_not_replayed(&every, &shards, &rows), ["s0"]);
        }
        for other in [
            KinesisPosition::latest(),
            KinesisPosition::sequence("s0", "7"),
        ] {
            assert!(finished_not_replayed(&other, &shards, &rows).is_empty());
        }
        // A row of an earlier stream of the same name is not the shard's.
        parent.starting_sequence_number = Some("0".into());
        rows.insert("s0".to_owned(), parent);
        assert!(finished_not_replayed(&KinesisPosition::horizon(), &shards, &rows).is_empty());
        assert_eq!(some_of(&["a", "b", "c"], 2), "a, b and 1 more");
        assert_eq!(some_of(&["a", "b"], 2), "a, b");
    }

    #[test]
    fn the_tip_is_latest_only_while_start_runs() {
        let latest = KinesisPosition::latest();
        let seq = Some(Checkpoint::Sequence("9".into()));
        assert_eq!(
            at(seq.clone(), true, &context(Some(&latest), true)),
            Some(StartingPoint::Latest)
        );
        assert_eq!(
            at(seq, true, &context(Some(&latest), false)),
            Some(STARTED),
            "a startup shard opened after `start` returned begins at the start time"
        );
    }

    #[test]
    fn rows_created_at_a_start_open_where_that_start_was() {
        let own = Some(Checkpoint::Initial(STARTED));
        assert_eq!(
            at(own.clone(), true, &context(None, true)),
            Some(StartingPoint::Latest)
        );
        assert_eq!(at(own, true, &context(None, false)), Some(STARTED));
        // Another instance's start, earlier: its time, at startup too.
        let other = Some(Checkpoint::Initial(StartingPoint::AtTimestamp(500)));
        assert_eq!(
            at(other.clone(), true, &context(None, true)),
            Some(StartingPoint::AtTimestamp(500))
        );
        assert_eq!(
            at(other, false, &context(None, false)),
            Some(StartingPoint::AtTimestamp(500))
        );
    }

    #[test]
    fn a_row_with_this_start_time_but_no_tip_fetched_opens_at_that_time() {
        // Another instance that started in the same millisecond created it: its `start` may
        // have returned already, so LATEST now could skip what it promised.
        let same_time = Some(Checkpoint::Initial(STARTED));
        let ctx = StartContext {
            fetched_tip: false,
            ..context(None, true)
        };
        assert_eq!(at(same_time, true, &ctx), Some(STARTED));
    }

    #[test]
    fn latest_does_not_skip_what_an_earlier_start_of_the_application_promised() {
        let latest = KinesisPosition::latest();
        let earlier = Some(Checkpoint::Initial(StartingPoint::AtTimestamp(500)));
        assert_eq!(
            at(earlier, true, &context(Some(&latest), true)),
            Some(StartingPoint::AtTimestamp(500))
        );
        // Its own rows: exact LATEST while `start` runs.
        let own = Some(Checkpoint::Initial(STARTED));
        assert_eq!(
            at(own, true, &context(Some(&latest), true)),
            Some(StartingPoint::Latest)
        );
    }

    #[test]
    fn latest_does_not_skip_what_a_reader_of_another_instance_began_at() {
        // Another instance took the shard at its start, fixed where its reader began (a
        // `Start`), settled nothing, and handed the shard on while this one was starting.
        let latest = KinesisPosition::latest();
        let positioned = Some(Checkpoint::Start(StartingPoint::AtTimestamp(500)));
        assert_eq!(
            at(positioned.clone(), true, &context(Some(&latest), true)),
            Some(StartingPoint::AtTimestamp(500))
        );
        assert_eq!(
            at(positioned, true, &context(Some(&latest), false)),
            Some(StartingPoint::AtTimestamp(500))
        );
        // Over a settled record, `start_at(latest())` applies at startup, as the spec says.
        let settled = Some(Checkpoint::Sequence("9".into()));
        assert_eq!(
            at(settled, true, &context(Some(&latest), true)),
            Some(StartingPoint::Latest)
        );
    }

    #[test]
    fn checkpoints_and_children_are_followed_outside_startup() {
        let horizon = KinesisPosition::horizon();
        let ctx = context(Some(&horizon), false);
        assert_eq!(
            opening("s", Some(&Checkpoint::Sequence("9".into())), false, &ctx),
            Some(Opening {
                start: StartingPoint::AfterSequence("9".into()),
                overridden: false,
                record: false,
                hash_range: None,
                tip: None,
            })
        );
        assert_eq!(
            opening("s", None, false, &ctx),
            Some(Opening {
                start: StartingPoint::TrimHorizon,
                overridden: false,
                record: true,
                hash_range: None,
                tip: None,
            })
        );
        assert_eq!(at(Some(Checkpoint::ShardEnd), false, &ctx), None);
        // At startup, start_at wins over the checkpoint and the shard is replayed.
        assert_eq!(
            opening("s", Some(&Checkpoint::Sequence("9".into())), true, &ctx),
            Some(Opening {
                start: StartingPoint::TrimHorizon,
                overridden: true,
                record: true,
                hash_range: None,
                tip: None,
            })
        );
    }
}

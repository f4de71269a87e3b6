//! Where a shard this instance takes opens: [`position::starting_point`] over the row's
//! checkpoint, with what only the subscription knows (is this one of the shards it opens with,
//! has `start` returned yet). Pure, tested without I/O.

use super::listing::Tip;
use crate::position::{Checkpoint, KinesisPosition, ShardOrigin, StartingPoint, starting_point};

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

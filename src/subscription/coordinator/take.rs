//! The take job: take a lease, open the shard's reader where [`opening`](super::opening)
//! decided, fix the position with the first iterator, and record where the reader begins.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use super::listing::TipAt;
use super::opening::Opening;
use super::shared::Shared;
use crate::ack::ShardAcks;
use crate::error::KinesisError;
use crate::lease::{Lease, LeaseError};
use crate::position::{Checkpoint, StartingPoint};
use crate::shard::ShardStream;

/// A shard taken and ready to read.
pub(crate) struct Taken {
    pub(crate) lease: Lease,
    pub(crate) reader: ShardStream,
    pub(crate) acks: Arc<ShardAcks>,
    /// When the last write that moved the counter was sent.
    pub(crate) sent: Instant,
    /// The checkpoint the row holds, as this reader's ledger sees it.
    pub(crate) written: Option<Checkpoint>,
    pub(crate) start: StartingPoint,
}

/// How a take went.
pub(crate) enum TakeOutcome {
    Taken(Box<Taken>),
    /// Another instance took it first.
    Lost,
    /// The lease table failed; tried again at a later listing.
    Failed(LeaseError),
    /// The shard cannot be read (the reader refused its settings); the lease went back.
    Unopenable(KinesisError),
}

/// Takes `lease` and opens it as `opening` says.
pub(crate) async fn take(shared: Arc<Shared>, lease: Lease, opening: Opening) -> TakeOutcome {
    let _permit = shared.permits.acquire().await;
    let sent = Instant::now();
    let taken = match shared.store.take(&lease, &shared.config.owner).await {
        Ok(taken) => taken,
        // A take whose outcome is unknown (a timeout, a 5xx, or a retry that found its own
        // write) took the lease when the row names this instance now (see `outcome`).
        Err(e) if super::outcome::maybe_applied(&e) => {
            let owner = shared.config.owner.as_str();
            match super::outcome::still_ours(&shared.store, &lease, owner).await {
                Some(row) if row.counter > lease.counter => row,
                _ if e.is_lost() => return TakeOutcome::Lost,
                _ => return TakeOutcome::Failed(e),
            }
        }
        Err(e) => return TakeOutcome::Failed(e),
    };
    let (opening, ledger_from) = match consult(&shared, &taken, opening).await {
        Ok(consulted) => consulted,
        Err(e) => {
            let _ = shared.store.release(&taken).await;
            return TakeOutcome::Unopenable(e);
        }
    };
    let (acks, mut reader) = match open(&shared, &taken.shard_id, ledger_from.as_ref(), &opening) {
        Ok(opened) => opened,
        Err(e) => {
            let _ = shared.store.release(&taken).await;
            return TakeOutcome::Unopenable(e);
        }
    };
    // Fix the position now, so that nothing written after this listing is missed. A LATEST
    // start is recorded as the time the request was sent.
    let asked = match &opening.tip {
        Some(tip) => {
            match &tip.at {
                TipAt::Iterator(iterator) => reader.open_with(iterator.clone(), tip.asked),
                TipAt::Subscription(events) => reader.open_subscribed(events.take(), tip.asked),
            }
            tip.asked
        }
        None => SystemTime::now(),
    };
    let primed = tokio::time::timeout(shared.config.call_timeout(), reader.prime())
        .await
        .unwrap_or(false);
    let (taken, sent) = if primed && opening.record {
        match record_start(&shared, (taken, sent), &opening.start, asked).await {
            Ok(Some((lease, at))) => (lease, at),
            Ok(None) => return TakeOutcome::Lost,
            Err(outcome) => return outcome,
        }
    } else {
        (taken, sent)
    };
    let written = if opening.overridden && !primed {
        None
    } else {
        taken.checkpoint.clone()
    };
    TakeOutcome::Taken(Box::new(Taken {
        lease: taken,
        reader,
        acks,
        sent,
        written,
        start: opening.start,
    }))
}

/// Asks the application's position source, when there is one, where the taken shard stands.
/// When that is ahead of the row's checkpoint, the shard opens right after it and its ledger
/// starts there; otherwise (and under `start_at` at startup) the opening stands. Returns the
/// opening and the checkpoint the ledger starts from.
async fn consult(
    shared: &Shared,
    taken: &Lease,
    opening: Opening,
) -> Result<(Opening, Option<Checkpoint>), KinesisError> {
    let row = taken.checkpoint.clone();
    let Some(source) = &shared.config.position_source else {
        return Ok((opening, row));
    };
    if opening.overridden {
        return Ok((opening, row));
    }
    let shard = taken.shard_id.as_str();
    let failed = |source: crate::error::ErrorSource| KinesisError::PositionSource {
        stream: shared.stream.to_string(),
        shard: shard.to_owned(),
        source,
    };
    let asked = source.position(&shared.stream, shard);
    let stored = match tokio::time::timeout(shared.config.call_timeout(), asked).await {
        Ok(Ok(stored)) => stored,
        Ok(Err(e)) => return Err(failed(Arc::from(e))),
        Err(_) => {
            let e = std::io::Error::other("no answer within the call timeout");
            return Err(failed(Arc::new(e)));
        }
    };
    let start = match &stored {
        Some(Checkpoint::Sequence(seq)) => StartingPoint::AfterSequence(seq.clone()),
        Some(Checkpoint::SubSequence(seq, sub)) => {
            StartingPoint::AfterSubSequence(seq.clone(), *sub)
        }
        _ => return Ok((opening, row)),
    };
    if !stored.as_ref().is_some_and(|p| p.is_ahead_of(row.as_ref())) {
        return Ok((opening, row));
    }
    tracing::info!(
        shard,
        stored = %stored.as_ref().map(Checkpoint::encode).unwrap_or_default(),
        lease_table = %row.as_ref().map(Checkpoint::encode).unwrap_or_default(),
        "opening right after the position source's position, ahead of the lease table's checkpoint"
    );
    let opening = Opening {
        start,
        record: false,
        tip: None,
        ..opening
    };
    Ok((opening, stored))
}

/// The taken shard's ledger and reader, opened where `opening` says. The ledger starts from
/// `ledger_from` (the row's checkpoint, or the position source's) unless `start_at` goes
/// ahead of it.
fn open(
    shared: &Shared,
    shard: &str,
    ledger_from: Option<&Checkpoint>,
    opening: &Opening,
) -> Result<(Arc<ShardAcks>, ShardStream), KinesisError> {
    let checkpoint_seq = match ledger_from {
        Some(cp @ (Checkpoint::Sequence(_) | Checkpoint::SubSequence(..)))
            if !opening.overridden =>
        {
            Some(cp)
        }
        _ => None,
    };
    let metrics = shared.shard_metrics(shard);
    let span = shared.shard_span(shard);
    let acks = ShardAcks::with_policy(
        shared.stream.clone(),
        Arc::from(shard),
        checkpoint_seq,
        shared.policy.clone(),
        metrics.clone(),
        span.clone(),
    );
    let mut builder = ShardStream::builder(shared.api.clone(), shared.stream.clone(), shard)
        .metrics(metrics)
        .span(span);
    if let Some((starting, ending)) = &opening.hash_range {
        builder = builder.hash_key_range(starting, ending);
    }
    let reader = builder
        .settings(shared.config.read.clone())
        .settled(acks.settled_position())
        .probe(shared.probe.clone())
        .first_reads(shared.first_reads.clone())
        .consumer_arn(shared.config.consumer_arn.clone())
        .open(opening.start.clone())?;
    Ok((acks, reader))
}

/// Records where the reader begins, before it reads anything, so that a takeover after a
/// crash resumes there (never at the tip, which would skip what arrived meanwhile). Takes the
/// row as taken and when that write was sent; returns the row as written last and when that
/// write was sent; `Ok(None)` when the lease was lost
/// meanwhile, `Err` when the table failed (the lease is released).
async fn record_start(
    shared: &Shared,
    (taken, sent): (Lease, Instant),
    start: &StartingPoint,
    asked: SystemTime,
) -> Result<Option<(Lease, Instant)>, TakeOutcome> {
    let begins = Checkpoint::Start(match start {
        StartingPoint::Latest => StartingPoint::since(asked),
        other => other.clone(),
    });
    if taken.checkpoint.as_ref() == Some(&begins) {
        return Ok(Some((taken, sent)));
    }
    let at = Instant::now();
    match shared.store.checkpoint(&taken, &begins).await {
        Ok(lease) => Ok(Some((lease, at))),
        Err(e) => {
            tracing::warn!(shard = %taken.shard_id, error = %e, "could not record the start position; leaving the shard");
            if e.is_lost() {
                return Ok(None);
            }
            let _ = shared.store.release(&taken).await;
            Err(TakeOutcome::Failed(e))
        }
    }
}

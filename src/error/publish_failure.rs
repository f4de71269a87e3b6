//! What a publish that could not write everything reports: [`PublishFailure`].

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::hash::Hash;

use crate::record::{OutgoingRecord, Published};

/// Over the records not written, in order: the first of each key, which the later records of
/// that key are [`behind`](FailedRecord::behind).
pub(crate) struct FirstOfKey<K>(HashMap<K, usize>);

impl<K: Hash + Eq> FirstOfKey<K> {
    pub(crate) fn new() -> Self {
        Self(HashMap::new())
    }

    /// What the record not written at `index`, of `key`, is behind: the first of its key
    /// before it, or `None` when it is that first one.
    pub(crate) fn behind(&mut self, key: K, index: usize) -> Option<usize> {
        match self.0.entry(key) {
            Entry::Occupied(first) => Some(*first.get()),
            Entry::Vacant(first) => {
                first.insert(index);
                None
            }
        }
    }
}

/// How many record positions a failure message lists before it says "and N more".
const LISTED: usize = 10;

/// Why the service refused a record (or the whole call carrying it) the last time it was sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryError {
    /// The service's error code for the entry (`ProvisionedThroughputExceededException`,
    /// `InternalFailure`, `KMSAccessDeniedException`, ...), or for a whole call that failed,
    /// the kind of error: `Throttled`, `ServiceError`, `StreamNotFound`, `AccessDenied`,
    /// `InvalidArgument`, `PublisherStopped` (a collecting publisher's task stopped before it
    /// answered) or `Error`.
    pub code: String,
    /// The service's message (for a whole failed call, the error's text).
    pub message: String,
}

/// A record a publish did not write, handed back with what is known about why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailedRecord {
    /// Its position in the batch given to
    /// [`publish_batch`](crate::publish::Publisher::publish_batch) (0 for `publish`).
    pub index: usize,
    /// The record itself, to publish again.
    pub record: OutgoingRecord,
    /// The service's answer the last time it was sent; `None` if it never was (held back
    /// from the start, or the publish stopped before its turn).
    pub last_error: Option<EntryError>,
    /// The position of the earliest record before it with the same partition key that was
    /// not written either (`None` when it is the first of its key not written). Publishing
    /// this record before that one would store the key's records out of order: publish it
    /// after. A record with `behind` set and no [`last_error`](Self::last_error) was held
    /// back behind it, never sent.
    pub behind: Option<usize>,
    /// It may have been stored already, and publishing it again may store it twice: a call
    /// that carried it failed as a whole in a way retrying can fix (no answer within
    /// [`PUT_CALL_TIMEOUT`](crate::publish::PUT_CALL_TIMEOUT), a dropped connection, a server
    /// error, throttling after the transport's own retries), an answer had no result for it,
    /// or, with aggregation, its aggregate was stored on a shard other than predicted and is
    /// handed back unchecked.
    /// False when every call that carried it was answered with a failure for it, or it was
    /// never sent. A transport's retries inside one call are not seen: a call whose last
    /// attempt failed for good after an earlier attempt went unanswered counts as answered.
    pub maybe_stored: bool,
}

/// The outcome of a publish that ended with records not written, carried by
/// [`KinesisError::PublishFailed`](crate::KinesisError::PublishFailed).
///
/// Records that were written stay written (there is no rollback in Kinesis); their places
/// are in [`published`](Self::published). Every other record is in [`failed`](Self::failed),
/// in batch order: publish those again, in that order, to finish the batch with the key
/// order intact.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishFailure {
    /// The stream name.
    pub stream: String,
    /// How many rounds were sent (see [`RetryPolicy`](crate::publish::RetryPolicy)).
    pub attempts: u32,
    /// Where each record of the batch was stored, in batch order; `None` for the records
    /// in [`failed`](Self::failed).
    pub published: Vec<Option<Published>>,
    /// The records not written, in batch order.
    pub failed: Vec<FailedRecord>,
    /// The code of the last failure seen (an entry's error code, or for a whole failed
    /// call the kind of error, as in [`EntryError::code`]).
    pub last_code: String,
    /// The message of the last failure seen.
    pub last_message: String,
    /// Whether the publish stopped early at a failure that retrying cannot fix (a missing
    /// stream, denied access, a refused argument, a KMS key problem) rather than after its
    /// last round.
    pub stopped_early: bool,
}

impl PublishFailure {
    /// How many records of the batch were written.
    #[must_use]
    pub fn written(&self) -> usize {
        self.published.iter().filter(|p| p.is_some()).count()
    }

    /// How many records the batch held.
    #[must_use]
    pub fn total(&self) -> usize {
        self.published.len()
    }

    /// The records not written, in batch order, ready for another
    /// [`publish_batch`](crate::publish::Publisher::publish_batch).
    #[must_use]
    pub fn into_failed_records(self) -> Vec<OutgoingRecord> {
        self.failed.into_iter().map(|f| f.record).collect()
    }
}

impl fmt::Display for PublishFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attempts = if self.attempts == 1 {
            "1 attempt".to_owned()
        } else {
            format!("{} attempts", self.attempts)
        };
        write!(
            f,
            "publishing to stream `{}` {}: {} of {} records were not written and {} were \
             (written records stay written); the last error was {}: {}. Not written: records ",
            self.stream,
            if self.stopped_early {
                format!("stopped after {attempts} at an error that retrying cannot fix")
            } else {
                format!("gave up after {attempts}")
            },
            self.failed.len(),
            self.total(),
            self.written(),
            self.last_code,
            self.last_message,
        )?;
        for (n, failed) in self.failed.iter().take(LISTED).enumerate() {
            if n > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", failed.index)?;
        }
        if self.failed.len() > LISTED {
            write!(f, " and {} more", self.failed.len() - LISTED)?;
        }
        let maybe = self.failed.iter().filter(|r| r.maybe_stored).count();
        if maybe > 0 {
            write!(
                f,
                " ({maybe} of them went out in a call that was never answered and may have been \
                 stored: publishing them again may store them twice)"
            )?;
        }
        let held = self.failed.iter().filter(|r| r.behind.is_some()).count();
        if held > 0 {
            write!(
                f,
                " ({held} of them come after an earlier unwritten record of their partition \
                 key, and must be published after it to keep the key's order)"
            )?;
        }
        f.write_str(
            ". They are handed back in this error: publish them again in this order once the \
             cause is fixed or the stream has capacity (more shards, or a slower producer)",
        )
    }
}

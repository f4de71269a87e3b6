//! One Kinesis record, as the reader hands it on.
//!
//! [`Record`] is one pointer to its fields (its payload as [`Bytes`], its key and sequence
//! number either moved from the SDK's strings or shared with other records), so a clone of a
//! record allocates nothing and moving one through a pipeline copies 8 bytes: a delivery keeps a
//! clone for its redelivery. The reader moves the SDK's buffers into it without copying the
//! payload; the user records of one aggregate share its sequence number and its key table, and
//! the in-memory transport's records share its stored strings.

use std::cmp::Ordering;
use std::ops::Deref;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

mod outgoing;

pub(crate) use outgoing::quote_key;
pub use outgoing::{OutgoingRecord, Published};

/// A record read from one shard.
#[derive(Clone, PartialEq, Eq)]
pub struct Record(Arc<Fields>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fields {
    data: Bytes,
    partition_key: Text,
    sequence_number: Text,
    shard_id: Arc<str>,
    /// The stream it was read from: set by the shard reader as it hands the record on.
    stream: Option<Arc<str>>,
    approximate_arrival: Option<SystemTime>,
    millis_behind_latest: Option<u64>,
    /// Set on a user record taken out of a KPL aggregate.
    aggregate: Option<InAggregate>,
    /// A user record's explicit hash key, when its producer gave one.
    explicit_hash_key: Option<Arc<str>>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields = &self.0;
        f.debug_struct("Record")
            .field("stream", &fields.stream)
            .field("shard_id", &fields.shard_id)
            .field("sequence_number", &fields.sequence_number)
            .field("sub_sequence_number", &fields.aggregate.map(|a| a.sub))
            .field("partition_key", &fields.partition_key)
            .field("data", &fields.data)
            .field("approximate_arrival", &fields.approximate_arrival)
            .field("millis_behind_latest", &fields.millis_behind_latest)
            .finish_non_exhaustive()
    }
}

/// A string field of a record: the SDK's `String` moved in as it is (no copy, no shrinking),
/// or shared with other records (no allocation).
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Text {
    Owned(String),
    Shared(Arc<str>),
}

impl From<String> for Text {
    fn from(text: String) -> Self {
        Self::Owned(text)
    }
}

impl From<Arc<str>> for Text {
    fn from(text: Arc<str>) -> Self {
        Self::Shared(text)
    }
}

impl Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Self::Owned(text) => text,
            Self::Shared(text) => text,
        }
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// Where a user record sits in the aggregate it was taken out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InAggregate {
    /// Its sub-sequence number: its index in the aggregate.
    pub(crate) sub: u64,
    /// It is the aggregate's last user record.
    pub(crate) last: bool,
}

impl Record {
    /// Builds a record. The reader makes these; tests and in-memory pipelines may too.
    #[must_use]
    pub fn new(
        shard_id: Arc<str>,
        sequence_number: impl Into<String>,
        partition_key: impl Into<String>,
        data: impl Into<Bytes>,
        approximate_arrival: Option<SystemTime>,
    ) -> Self {
        Self::read(
            shard_id,
            Text::Owned(sequence_number.into()),
            Text::Owned(partition_key.into()),
            data.into(),
            approximate_arrival,
            None,
        )
    }

    /// Builds a record as a GetRecords answer gave it, `millis_behind_latest` that answer's
    /// lag, with no reference-count update after the allocation. Its key and sequence number
    /// are moved from the SDK's strings (`String`), or shared with other records (`Arc<str>`:
    /// the in-memory transport's stored strings, no allocation for either).
    pub(crate) fn read(
        shard_id: Arc<str>,
        sequence_number: impl Into<Text>,
        partition_key: impl Into<Text>,
        data: Bytes,
        approximate_arrival: Option<SystemTime>,
        millis_behind_latest: Option<u64>,
    ) -> Self {
        Self(Arc::new(Fields {
            data,
            partition_key: partition_key.into(),
            sequence_number: sequence_number.into(),
            shard_id,
            stream: None,
            approximate_arrival,
            millis_behind_latest,
            aggregate: None,
            explicit_hash_key: None,
        }))
    }

    /// A user record of the aggregate `self`: its own key, hash key, data and place, the
    /// aggregate's sequence number (`sequence_number`, shared by all its user records), shard,
    /// arrival and lag.
    pub(crate) fn user_record(
        &self,
        sequence_number: &Arc<str>,
        partition_key: Arc<str>,
        explicit_hash_key: Option<Arc<str>>,
        data: Bytes,
        place: InAggregate,
    ) -> Self {
        let aggregate = &self.0;
        Self(Arc::new(Fields {
            data,
            partition_key: Text::Shared(partition_key),
            sequence_number: Text::Shared(sequence_number.clone()),
            shard_id: aggregate.shard_id.clone(),
            stream: aggregate.stream.clone(),
            approximate_arrival: aggregate.approximate_arrival,
            millis_behind_latest: aggregate.millis_behind_latest,
            aggregate: Some(place),
            explicit_hash_key,
        }))
    }

    /// Sets how far behind the shard's tip the read that returned this record was.
    #[must_use]
    pub fn with_millis_behind_latest(mut self, millis: Option<u64>) -> Self {
        Arc::make_mut(&mut self.0).millis_behind_latest = millis;
        self
    }

    /// Names the stream the record was read from (the shard reader does this for every
    /// record it hands on).
    #[must_use]
    pub fn with_stream(self, stream: impl Into<Arc<str>>) -> Self {
        self.in_stream(stream.into())
    }

    /// As [`with_stream`](Self::with_stream), without a copy of a shared name: the shard
    /// reader's path, one reference count a record.
    pub(crate) fn in_stream(mut self, stream: Arc<str>) -> Self {
        // The reader's records are fresh, so this writes in place.
        Arc::make_mut(&mut self.0).stream = Some(stream);
        self
    }

    /// The stream the record was read from: what tells the records of a
    /// [`MultiSubscription`](crate::MultiSubscription)'s streams apart. `Some` for every
    /// record a shard reader hands on; `None` for one built by hand without
    /// [`with_stream`](Self::with_stream).
    #[must_use]
    pub fn stream(&self) -> Option<&str> {
        self.0.stream.as_deref()
    }

    /// The payload.
    #[must_use]
    pub fn data(&self) -> &Bytes {
        &self.0.data
    }

    /// Takes the payload out of the record.
    #[must_use]
    pub fn into_data(self) -> Bytes {
        Arc::try_unwrap(self.0).map_or_else(|shared| shared.data.clone(), |fields| fields.data)
    }

    /// The partition key the producer gave.
    #[must_use]
    pub fn partition_key(&self) -> &str {
        &self.0.partition_key
    }

    /// The record's sequence number, unique within its stream and increasing within its shard.
    #[must_use]
    pub fn sequence_number(&self) -> &str {
        &self.0.sequence_number
    }

    /// The id of the shard the record was read from.
    #[must_use]
    pub fn shard_id(&self) -> &str {
        &self.0.shard_id
    }

    /// The shard id as a shared string (no allocation to clone).
    #[must_use]
    pub fn shard_id_shared(&self) -> &Arc<str> {
        &self.0.shard_id
    }

    /// When the service accepted the record, by its own clock.
    #[must_use]
    pub fn approximate_arrival(&self) -> Option<SystemTime> {
        self.0.approximate_arrival
    }

    /// How far behind the tip of its shard the read that returned this record was
    /// (`MillisBehindLatest` of that GetRecords answer).
    #[must_use]
    pub fn millis_behind_latest(&self) -> Option<u64> {
        self.0.millis_behind_latest
    }

    /// For a user record taken out of a KPL aggregate (see
    /// [`ReadSettings::deaggregate`](crate::ReadSettings::deaggregate)), its sub-sequence
    /// number: its place in the aggregate, from 0. The aggregate's sequence number is
    /// [`sequence_number`](Self::sequence_number); together they order every user record of
    /// the shard. `None` for a record that was not aggregated.
    #[must_use]
    pub fn sub_sequence_number(&self) -> Option<u64> {
        self.0.aggregate.map(|a| a.sub)
    }

    /// Makes a user record the last of its aggregate (the user records after it cannot be read).
    pub(crate) fn mark_last_of_aggregate(&mut self) {
        if let Some(place) = &mut Arc::make_mut(&mut self.0).aggregate {
            place.last = true;
        }
    }

    /// True for the last user record of its aggregate, and for a record that was not
    /// aggregated.
    #[must_use]
    pub fn is_last_of_aggregate(&self) -> bool {
        self.0.aggregate.is_none_or(|a| a.last)
    }

    /// The explicit hash key a user record's producer gave it (it then chose the shard
    /// instead of the partition key's MD5). `None` when none was given, and for records read
    /// without de-aggregation (GetRecords does not return it).
    #[must_use]
    pub fn explicit_hash_key(&self) -> Option<&str> {
        self.0.explicit_hash_key.as_deref()
    }
}

/// Compares two sequence numbers of one shard by their numeric value.
///
/// Sequence numbers are decimal strings too long for any integer type; a longer one (without
/// leading zeros) is larger, and equal lengths compare digit by digit.
#[must_use]
pub(crate) fn cmp_sequence(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_numerically() {
        assert_eq!(cmp_sequence("9", "10"), Ordering::Less);
        assert_eq!(cmp_sequence("0010", "10"), Ordering::Equal);
        assert_eq!(
            cmp_sequence(
                "49590338271490256608559692538361571095921575989136588898",
                "49590338271490256608559692538361571095921575989136588899"
            ),
            Ordering::Less
        );
    }
}

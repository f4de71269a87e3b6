//! One Kinesis record, as the reader hands it on.
//!
//! [`Record`] is a place in a shared, reference-counted array of fields (its payload as
//! [`Bytes`], its key and sequence number either moved from the SDK's strings or shared with
//! other records), so a clone of a record allocates nothing and moving one through a pipeline
//! copies 24 bytes: a delivery keeps a clone for its redelivery. The records of one GetRecords
//! answer share their arrays, 64 records to one, instead of an allocation for each record (the
//! allocator was the largest part of the reader's own cost per record); keeping one of them
//! keeps its neighbours' fields too, which [`Record::detach`] undoes. The reader moves the SDK's
//! buffers into it without copying the payload; the user records of one aggregate share its
//! sequence number and its key table, and the in-memory transport's records share its stored
//! strings.

use std::cmp::Ordering;
use std::ops::Deref;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

mod outgoing;

pub(crate) use outgoing::quote_key;
pub use outgoing::{OutgoingRecord, Published};

/// How many records of one read share one allocation: few enough that a record kept alone
/// keeps little else (and that when the group is freed, its records were handed on moments
/// before, so their memory is still in the processor's cache), enough that the allocator's
/// cost is spread over them.
pub(crate) const SHARED: usize = 64;

/// A record read from one shard.
///
/// The records of one read (one GetRecords answer) share their allocations, 64 records to
/// one: a record kept after its neighbours were dropped keeps their fields and payloads in
/// memory too, up to 63 others. A program that keeps a few records for long, in a cache or a
/// window, calls [`detach`](Self::detach) on them first.
#[derive(Clone)]
pub struct Record {
    /// The fields of this record and of the neighbours read with it.
    batch: Arc<[Fields]>,
    /// This record's place in `batch`.
    index: usize,
}

impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl Eq for Record {}

/// What a read answer says of one record, before it joins the answer's other records
/// ([`Record::answer`]).
pub(crate) struct Read {
    pub(crate) shard_id: Arc<str>,
    pub(crate) sequence_number: Text,
    pub(crate) partition_key: Text,
    pub(crate) data: Bytes,
    pub(crate) approximate_arrival: Option<SystemTime>,
    pub(crate) millis_behind_latest: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fields {
    data: Bytes,
    partition_key: Text,
    sequence_number: Text,
    shard_id: Arc<str>,
    /// The stream it was read from: set by the transport as it reads, or by the shard reader
    /// as it hands the record on.
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
        let fields = self.fields();
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

    /// Builds a record alone, with `millis_behind_latest` the lag of the read that returned
    /// it. Its key and sequence number are moved from the SDK's strings (`String`), or shared
    /// with other records (`Arc<str>`: the in-memory transport's stored strings, no allocation
    /// for either).
    pub(crate) fn read(
        shard_id: Arc<str>,
        sequence_number: impl Into<Text>,
        partition_key: impl Into<Text>,
        data: Bytes,
        approximate_arrival: Option<SystemTime>,
        millis_behind_latest: Option<u64>,
    ) -> Self {
        Self::alone(Fields {
            data,
            partition_key: partition_key.into(),
            sequence_number: sequence_number.into(),
            shard_id,
            stream: None,
            approximate_arrival,
            millis_behind_latest,
            aggregate: None,
            explicit_hash_key: None,
        })
    }

    /// The records of one read answer of `stream`, in its order: their fields allocated
    /// [`SHARED`] records at a time (and the stream's name once), not one record at a time.
    pub(crate) fn answer(stream: &str, reads: impl IntoIterator<Item = Read>) -> Vec<Self> {
        let stream: Arc<str> = Arc::from(stream);
        let mut reads = reads.into_iter().map(|read| Fields {
            data: read.data,
            partition_key: read.partition_key,
            sequence_number: read.sequence_number,
            shard_id: read.shard_id,
            stream: Some(stream.clone()),
            approximate_arrival: read.approximate_arrival,
            millis_behind_latest: read.millis_behind_latest,
            aggregate: None,
            explicit_hash_key: None,
        });
        let mut records = Vec::with_capacity(reads.size_hint().0);
        loop {
            let batch: Arc<[Fields]> = reads.by_ref().take(SHARED).collect();
            if batch.is_empty() {
                return records;
            }
            records.extend((0..batch.len()).map(|index| Self {
                batch: batch.clone(),
                index,
            }));
        }
    }

    /// A record with an allocation of its own.
    fn alone(fields: Fields) -> Self {
        Self {
            batch: Arc::new([fields]),
            index: 0,
        }
    }

    /// How many handles share this record's allocation.
    #[cfg(test)]
    pub(crate) fn holders(&self) -> usize {
        Arc::strong_count(&self.batch)
    }

    fn fields(&self) -> &Fields {
        &self.batch[self.index]
    }

    /// This record's fields, to change them: in place when nothing else shares its
    /// allocation, otherwise on a copy of its own first.
    fn fields_mut(&mut self) -> &mut Fields {
        if self.batch.len() != 1 || Arc::get_mut(&mut self.batch).is_none() {
            *self = Self::alone(self.fields().clone());
        }
        let fields = Arc::get_mut(&mut self.batch).expect("a record alone, not shared");
        &mut fields[0]
    }

    /// The same record with an allocation of its own: keeping it no longer keeps the other
    /// records of the read it came with (see [`Record`]). Its key and sequence number are
    /// copied; its payload is not (the payload's buffer is its own already). A record that
    /// shares nothing is returned as it is.
    #[must_use]
    pub fn detach(self) -> Self {
        if self.batch.len() == 1 {
            return self;
        }
        Self::alone(self.fields().clone())
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
        let aggregate = self.fields();
        Self::alone(Fields {
            data,
            partition_key: Text::Shared(partition_key),
            sequence_number: Text::Shared(sequence_number.clone()),
            shard_id: aggregate.shard_id.clone(),
            stream: aggregate.stream.clone(),
            approximate_arrival: aggregate.approximate_arrival,
            millis_behind_latest: aggregate.millis_behind_latest,
            aggregate: Some(place),
            explicit_hash_key,
        })
    }

    /// Sets how far behind the shard's tip the read that returned this record was.
    #[must_use]
    pub fn with_millis_behind_latest(mut self, millis: Option<u64>) -> Self {
        self.fields_mut().millis_behind_latest = millis;
        self
    }

    /// Names the stream the record was read from. The crate's transports name it as they
    /// read, and the shard reader names it on every record a transport left unnamed.
    #[must_use]
    pub fn with_stream(mut self, stream: impl Into<Arc<str>>) -> Self {
        self.fields_mut().stream = Some(stream.into());
        self
    }

    /// Names the stream of a record its transport did not name (the shard reader's path:
    /// the crate's transports name the stream as they read, so this costs one comparison).
    pub(crate) fn in_stream(mut self, stream: &Arc<str>) -> Self {
        if self.fields().stream.is_none() {
            // A record built by hand is alone: this writes in place.
            self.fields_mut().stream = Some(stream.clone());
        }
        self
    }

    /// The stream the record was read from: what tells the records of a
    /// [`MultiSubscription`](crate::MultiSubscription)'s streams apart. `Some` for every
    /// record a shard reader hands on; `None` for one built by hand without
    /// [`with_stream`](Self::with_stream).
    #[must_use]
    pub fn stream(&self) -> Option<&str> {
        self.fields().stream.as_deref()
    }

    /// The payload.
    #[must_use]
    pub fn data(&self) -> &Bytes {
        &self.fields().data
    }

    /// Takes the payload out of the record.
    #[must_use]
    pub fn into_data(mut self) -> Bytes {
        if self.batch.len() == 1
            && let Some(fields) = Arc::get_mut(&mut self.batch)
        {
            return std::mem::take(&mut fields[0].data);
        }
        self.fields().data.clone()
    }

    /// The partition key the producer gave.
    #[must_use]
    pub fn partition_key(&self) -> &str {
        &self.fields().partition_key
    }

    /// The record's sequence number, unique within its stream and increasing within its shard.
    #[must_use]
    pub fn sequence_number(&self) -> &str {
        &self.fields().sequence_number
    }

    /// The id of the shard the record was read from.
    #[must_use]
    pub fn shard_id(&self) -> &str {
        &self.fields().shard_id
    }

    /// The shard id as a shared string (no allocation to clone).
    #[must_use]
    pub fn shard_id_shared(&self) -> &Arc<str> {
        &self.fields().shard_id
    }

    /// When the service accepted the record, by its own clock.
    #[must_use]
    pub fn approximate_arrival(&self) -> Option<SystemTime> {
        self.fields().approximate_arrival
    }

    /// How far behind the tip of its shard the read that returned this record was
    /// (`MillisBehindLatest` of that GetRecords answer).
    #[must_use]
    pub fn millis_behind_latest(&self) -> Option<u64> {
        self.fields().millis_behind_latest
    }

    /// For a user record taken out of a KPL aggregate (see
    /// [`ReadSettings::deaggregate`](crate::ReadSettings::deaggregate)), its sub-sequence
    /// number: its place in the aggregate, from 0. The aggregate's sequence number is
    /// [`sequence_number`](Self::sequence_number); together they order every user record of
    /// the shard. `None` for a record that was not aggregated.
    #[must_use]
    pub fn sub_sequence_number(&self) -> Option<u64> {
        self.fields().aggregate.map(|a| a.sub)
    }

    /// Makes a user record the last of its aggregate (the user records after it cannot be read).
    pub(crate) fn mark_last_of_aggregate(&mut self) {
        if self.fields().aggregate.is_some()
            && let Some(place) = &mut self.fields_mut().aggregate
        {
            place.last = true;
        }
    }

    /// True for the last user record of its aggregate, and for a record that was not
    /// aggregated.
    #[must_use]
    pub fn is_last_of_aggregate(&self) -> bool {
        self.fields().aggregate.is_none_or(|a| a.last)
    }

    /// The explicit hash key a user record's producer gave it (it then chose the shard
    /// instead of the partition key's MD5). `None` when none was given, and for records read
    /// without de-aggregation (GetRecords does not return it).
    #[must_use]
    pub fn explicit_hash_key(&self) -> Option<&str> {
        self.fields().explicit_hash_key.as_deref()
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

    fn answer(stream: &str) -> Vec<Record> {
        let shard: Arc<str> = Arc::from("shardId-0");
        Record::answer(
            stream,
            (0..=SHARED).map(|i| Read {
                shard_id: shard.clone(),
                sequence_number: format!("4{i}").into(),
                partition_key: format!("k{i}").into(),
                data: Bytes::from(format!("d{i}")),
                approximate_arrival: None,
                millis_behind_latest: Some(7),
            }),
        )
    }

    #[test]
    fn the_records_of_one_answer_share_one_allocation_until_detached() {
        let records = answer("orders");
        assert_eq!(records.len(), SHARED + 1);
        assert!(Arc::ptr_eq(&records[0].batch, &records[SHARED - 1].batch));
        assert!(!Arc::ptr_eq(&records[0].batch, &records[SHARED].batch));
        assert_eq!(records[SHARED].sequence_number(), format!("4{SHARED}"));
        assert_eq!(records[1].sequence_number(), "41");
        assert_eq!(records[1].partition_key(), "k1");
        assert_eq!(records[1].stream(), Some("orders"));
        assert_eq!(records[1].millis_behind_latest(), Some(7));
        // Named again with the same stream (the shard stream does this for every record): no
        // copy.
        let named = records[1].clone().in_stream(&Arc::from("orders"));
        assert!(Arc::ptr_eq(&named.batch, &records[0].batch));
        let detached = records[1].clone().detach();
        assert!(!Arc::ptr_eq(&detached.batch, &records[0].batch));
        assert_eq!(detached.batch.len(), 1);
        assert_eq!(detached, records[1]);
        assert_eq!(detached.clone().detach().batch.len(), 1);
    }

    #[test]
    fn changing_a_shared_record_leaves_the_others_of_its_answer_alone() {
        let records = answer("orders");
        let changed = records[0].clone().with_millis_behind_latest(Some(1));
        assert_eq!(changed.millis_behind_latest(), Some(1));
        assert_eq!(records[0].millis_behind_latest(), Some(7));
        let renamed = records[2].clone().with_stream("payments");
        assert_eq!(renamed.stream(), Some("payments"));
        assert_eq!(records[2].stream(), Some("orders"));
        assert_eq!(records[2].clone().into_data(), Bytes::from("d2"));
        assert_eq!(records[2].data(), &Bytes::from("d2"));
        let alone = Record::new(Arc::from("shardId-1"), "5", "k", "x", None);
        assert_eq!(alone.into_data(), Bytes::from("x"));
    }

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

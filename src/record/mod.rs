//! One Kinesis record, as the reader hands it on.
//!
//! [`Record`] is a place in a shared, reference-counted group of records: what the group's
//! records have in common (shard, stream, the read's lag) once, then each record's own fields
//! (its payload as [`Bytes`], its key and sequence number either strings of their own, moved
//! in as the transport decoded them, or shared with other records). A clone of a record
//! allocates nothing and moving one through a pipeline copies 16 bytes: a delivery keeps a
//! clone for its redelivery. The records of one GetRecords answer share their groups, 64
//! records to one, instead of an allocation (and two shared names to count) for each record:
//! the allocator, then the memory each record's fields take, were the largest parts of the
//! reader's own cost per record. Keeping one record keeps its neighbours' fields too, which
//! [`Record::detach`] undoes. A payload is the buffer the transport decoded it into, not
//! copied; the user records of one aggregate share its sequence number and its key table,
//! and the in-memory transport's records share its stored strings.

use std::cmp::Ordering;
use std::ops::Deref;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

mod graveyard;
mod outgoing;

pub(crate) use graveyard::Graveyard;

pub(crate) use outgoing::quote_key;
pub use outgoing::{OutgoingRecord, Published};

/// How many records of one read share one group (two allocations: the group, and their
/// fields in one array): few enough that a record kept alone keeps little else, enough that
/// the allocator's cost is spread over them.
pub(crate) const SHARED: usize = 64;

/// A record read from one shard.
///
/// The records of one read (one GetRecords answer) share their allocations, 64 records to
/// one: a record kept after its neighbours were dropped keeps their fields and payloads in
/// memory too, up to 63 others. A program that keeps a few records for long, in a cache or a
/// window, calls [`detach`](Self::detach) on them first.
#[derive(Clone)]
pub struct Record {
    /// This record and the neighbours read with it.
    group: Arc<Group>,
    /// This record's place in `group`.
    index: usize,
}

impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.group.head == other.group.head && self.fields() == other.fields()
    }
}

impl Eq for Record {}

/// What a read answer says of one record, before it joins the answer's other records
/// ([`Record::answer`]).
#[derive(Debug)]
pub(crate) struct Read {
    pub(crate) sequence_number: Text,
    pub(crate) partition_key: Text,
    pub(crate) data: Bytes,
    pub(crate) approximate_arrival: Option<SystemTime>,
}

/// Records read together: what they share, then each one's own fields.
#[derive(Debug)]
struct Group {
    head: Head,
    records: Members,
    /// Where the records' fields go to be freed when the group is dropped (see
    /// [`Graveyard`]); `None` frees them where the group is dropped.
    grave: Option<Arc<Graveyard>>,
    /// The records' payload bytes (counted for a group with a `grave` only).
    bytes: usize,
}

impl Drop for Group {
    fn drop(&mut self) {
        if let (Some(grave), Members::Many(members)) = (self.grave.take(), &mut self.records) {
            grave.bury(std::mem::take(members), self.bytes);
        }
    }
}

/// What the records of a group have in common: one read of one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    shard_id: Arc<str>,
    /// The stream they were read from: set by the transport as it reads, or by the shard
    /// reader as it hands a record on.
    stream: Option<Arc<str>>,
    millis_behind_latest: Option<u64>,
}

/// The records of a group: one, in the group's own allocation (a record built alone, a user
/// record of an aggregate, a copy), or up to [`SHARED`] of one read.
#[derive(Debug)]
enum Members {
    One(Fields),
    Many(Box<[Fields]>),
}

/// One record's own fields (128 bytes: two cache lines).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fields {
    data: Bytes,
    partition_key: Text,
    sequence_number: Text,
    approximate_arrival: Option<SystemTime>,
    /// Set on a user record taken out of a KPL aggregate.
    aggregate: Option<InAggregate>,
    /// A user record's explicit hash key, when its producer gave one.
    explicit_hash_key: Option<Arc<str>>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (head, fields) = (&self.group.head, self.fields());
        f.debug_struct("Record")
            .field("stream", &head.stream)
            .field("shard_id", &head.shard_id)
            .field("sequence_number", &fields.sequence_number)
            .field("sub_sequence_number", &fields.aggregate.map(|a| a.sub))
            .field("partition_key", &fields.partition_key)
            .field("data", &fields.data)
            .field("approximate_arrival", &fields.approximate_arrival)
            .field("millis_behind_latest", &head.millis_behind_latest)
            .finish_non_exhaustive()
    }
}

/// A string field of a record: a `String` of its own, moved in as the transport decoded it
/// (no copy, no shrinking), or shared with other records (no allocation).
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
    /// it. Its key and sequence number are moved from the transport's strings (`String`), or shared
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
        let head = Head {
            shard_id,
            stream: None,
            millis_behind_latest,
        };
        Self::alone(
            head,
            Fields {
                data,
                partition_key: partition_key.into(),
                sequence_number: sequence_number.into(),
                approximate_arrival,
                aggregate: None,
                explicit_hash_key: None,
            },
        )
    }

    /// The records of one read answer of `shard` of `stream`, in its order, `millis` behind
    /// the shard's tip: grouped [`SHARED`] records at a time, each group with one array of
    /// their fields and one count of the shard's and the stream's names, not an allocation
    /// and two counts for each record. With a `grave`, a group's fields are freed by whoever
    /// clears it once the group is dropped.
    pub(crate) fn answer(
        stream: &str,
        shard_id: &Arc<str>,
        millis_behind_latest: Option<u64>,
        reads: impl IntoIterator<Item = Read>,
        grave: Option<&Arc<Graveyard>>,
    ) -> Vec<Self> {
        let head = Head {
            shard_id: shard_id.clone(),
            stream: Some(Arc::from(stream)),
            millis_behind_latest,
        };
        let mut reads = reads.into_iter().map(|read| Fields {
            data: read.data,
            partition_key: read.partition_key,
            sequence_number: read.sequence_number,
            approximate_arrival: read.approximate_arrival,
            aggregate: None,
            explicit_hash_key: None,
        });
        let mut records = Vec::with_capacity(reads.size_hint().0);
        loop {
            let members: Box<[Fields]> = reads.by_ref().take(SHARED).collect();
            if members.is_empty() {
                return records;
            }
            let len = members.len();
            let bytes = match grave {
                Some(_) => members.iter().map(|f| f.data.len()).sum(),
                None => 0,
            };
            let group = Arc::new(Group {
                head: head.clone(),
                records: Members::Many(members),
                grave: grave.cloned(),
                bytes,
            });
            records.extend((0..len).map(|index| Self {
                group: group.clone(),
                index,
            }));
        }
    }

    /// A record with an allocation of its own.
    fn alone(head: Head, fields: Fields) -> Self {
        Self {
            group: Arc::new(Group {
                head,
                records: Members::One(fields),
                grave: None,
                bytes: 0,
            }),
            index: 0,
        }
    }

    /// The same record with an allocation of its own, its fields copied.
    fn copied(&self) -> Self {
        Self::alone(self.group.head.clone(), self.fields().clone())
    }

    /// True when the record has its group to itself (built alone, or copied out).
    fn is_alone(&self) -> bool {
        matches!(self.group.records, Members::One(_))
    }

    /// How many handles share this record's allocation.
    #[cfg(test)]
    pub(crate) fn holders(&self) -> usize {
        Arc::strong_count(&self.group)
    }

    fn fields(&self) -> &Fields {
        match &self.group.records {
            Members::One(fields) => fields,
            Members::Many(members) => &members[self.index],
        }
    }

    /// This record's group and fields, to change them: in place when nothing else shares its
    /// allocation, otherwise on a copy of its own first.
    fn alone_mut(&mut self) -> (&mut Head, &mut Fields) {
        if !self.is_alone() || Arc::get_mut(&mut self.group).is_none() {
            *self = self.copied();
        }
        let index = self.index;
        let group = Arc::get_mut(&mut self.group).expect("a record alone, not shared");
        match &mut group.records {
            Members::One(fields) => (&mut group.head, fields),
            // Not reached: a record of a group of many is copied out above.
            Members::Many(members) => (&mut group.head, &mut members[index]),
        }
    }

    fn fields_mut(&mut self) -> &mut Fields {
        self.alone_mut().1
    }

    /// The same record with an allocation of its own: keeping it no longer keeps the other
    /// records of the read it came with (see [`Record`]). Its key and sequence number are
    /// copied; its payload is not (the payload's buffer is its own already). A record that
    /// shares nothing is returned as it is.
    #[must_use]
    pub fn detach(self) -> Self {
        if self.is_alone() {
            return self;
        }
        self.copied()
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
        Self::alone(
            self.group.head.clone(),
            Fields {
                data,
                partition_key: Text::Shared(partition_key),
                sequence_number: Text::Shared(sequence_number.clone()),
                approximate_arrival: self.fields().approximate_arrival,
                aggregate: Some(place),
                explicit_hash_key,
            },
        )
    }

    /// Sets how far behind the shard's tip the read that returned this record was.
    #[must_use]
    pub fn with_millis_behind_latest(mut self, millis: Option<u64>) -> Self {
        self.alone_mut().0.millis_behind_latest = millis;
        self
    }

    /// Names the stream the record was read from. The crate's transports name it as they
    /// read, and the shard reader names it on every record a transport left unnamed.
    #[must_use]
    pub fn with_stream(mut self, stream: impl Into<Arc<str>>) -> Self {
        self.alone_mut().0.stream = Some(stream.into());
        self
    }

    /// Names the stream of a record its transport did not name (the shard reader's path:
    /// the crate's transports name the stream as they read, so this costs one comparison).
    pub(crate) fn in_stream(mut self, stream: &Arc<str>) -> Self {
        if self.group.head.stream.is_none() {
            // A record built by hand is alone: this writes in place.
            self.alone_mut().0.stream = Some(stream.clone());
        }
        self
    }

    /// The stream the record was read from: what tells the records of a
    /// [`MultiSubscription`](crate::MultiSubscription)'s streams apart. `Some` for every
    /// record a shard reader hands on; `None` for one built by hand without
    /// [`with_stream`](Self::with_stream).
    #[must_use]
    pub fn stream(&self) -> Option<&str> {
        self.group.head.stream.as_deref()
    }

    /// The payload.
    #[must_use]
    pub fn data(&self) -> &Bytes {
        &self.fields().data
    }

    /// Takes the payload out of the record.
    #[must_use]
    pub fn into_data(mut self) -> Bytes {
        if let Some(Group {
            records: Members::One(fields),
            ..
        }) = Arc::get_mut(&mut self.group)
        {
            return std::mem::take(&mut fields.data);
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
        &self.group.head.shard_id
    }

    /// The shard id as a shared string (no allocation to clone).
    #[must_use]
    pub fn shard_id_shared(&self) -> &Arc<str> {
        &self.group.head.shard_id
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
        self.group.head.millis_behind_latest
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
            &shard,
            Some(7),
            (0..=SHARED).map(|i| Read {
                sequence_number: format!("4{i}").into(),
                partition_key: format!("k{i}").into(),
                data: Bytes::from(format!("d{i}")),
                approximate_arrival: None,
            }),
            None,
        )
    }

    #[test]
    fn the_records_of_one_answer_share_one_allocation_until_detached() {
        let records = answer("orders");
        assert_eq!(records.len(), SHARED + 1);
        assert!(Arc::ptr_eq(&records[0].group, &records[SHARED - 1].group));
        assert!(!Arc::ptr_eq(&records[0].group, &records[SHARED].group));
        assert_eq!(records[SHARED].sequence_number(), format!("4{SHARED}"));
        assert_eq!(records[1].sequence_number(), "41");
        assert_eq!(records[1].partition_key(), "k1");
        assert_eq!(records[1].stream(), Some("orders"));
        assert_eq!(records[1].millis_behind_latest(), Some(7));
        // Named again with the same stream (the shard stream does this for every record): no
        // copy.
        let named = records[1].clone().in_stream(&Arc::from("orders"));
        assert!(Arc::ptr_eq(&named.group, &records[0].group));
        let detached = records[1].clone().detach();
        assert!(!Arc::ptr_eq(&detached.group, &records[0].group));
        assert!(detached.is_alone());
        assert_eq!(detached, records[1]);
        assert!(Arc::ptr_eq(
            &detached.clone().detach().group,
            &detached.group
        ));
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
    fn a_dropped_group_waits_in_its_graveyard_until_cleared() {
        let grave = Arc::new(Graveyard::default());
        let shard: Arc<str> = Arc::from("shardId-0");
        let data = Bytes::from(vec![7u8; 100]);
        let records = Record::answer(
            "orders",
            &shard,
            None,
            (0..SHARED + 1).map(|i| Read {
                sequence_number: i.to_string().into(),
                partition_key: "k".to_owned().into(),
                data: data.clone(),
                approximate_arrival: None,
            }),
            Some(&grave),
        );
        // A record copied out of its group, and one built alone, are freed where dropped.
        drop(records[0].clone().detach());
        drop(Record::new(shard.clone(), "1", "k", "x", None));
        assert_eq!(grave.waiting(), 0);
        let (first, second) = records.split_at(SHARED);
        let (first, second) = (first.to_vec(), second.to_vec());
        drop(records);
        drop(first);
        assert_eq!(
            grave.waiting(),
            1,
            "the first group, all its records dropped"
        );
        // Its payloads are still held: the graveyard frees them only when cleared.
        assert!(!data.is_unique());
        drop(second);
        assert_eq!(grave.waiting(), 2);
        grave.clear();
        assert_eq!(grave.waiting(), 0);
        assert!(data.is_unique());
    }

    #[test]
    fn a_full_graveyard_lets_the_dropper_free() {
        let grave = Arc::new(Graveyard::default());
        let shard: Arc<str> = Arc::from("shardId-0");
        let answer = |n: usize, size: usize| {
            let data = Bytes::from(vec![0u8; size]);
            Record::answer(
                "orders",
                &shard,
                None,
                (0..n).map(|i| Read {
                    sequence_number: i.to_string().into(),
                    partition_key: "k".to_owned().into(),
                    data: data.clone(),
                    approximate_arrival: None,
                }),
                Some(&grave),
            )
        };
        drop(answer(graveyard::ROOM * SHARED, 1));
        assert_eq!(grave.waiting(), graveyard::ROOM);
        drop(answer(SHARED, 1));
        assert_eq!(grave.waiting(), graveyard::ROOM);
        grave.clear();
        // Payloads count too: a group that would pass the bytes held is freed at once.
        let big = graveyard::ROOM_BYTES / SHARED / 2 + 1;
        drop(answer(SHARED, big));
        assert_eq!(grave.waiting(), 1);
        drop(answer(SHARED, big));
        assert_eq!(grave.waiting(), 1);
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

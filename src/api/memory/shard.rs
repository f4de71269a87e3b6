//! One shard: its records, its hash range, its lineage, and reads from a position.
//!
//! A position counts records from the shard's first record ever, so positions (and the
//! iterators holding them) stay valid when old records are trimmed: the shard keeps the
//! position of its oldest kept record as an offset.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::hash::HashRange;
use super::sequence;

/// The most payload one GetRecords answer carries, like the service (10 MiB).
const MAX_READ_BYTES: usize = 10 * 1024 * 1024;

/// The id of shard `number`: `shardId-` and twelve digits.
pub(crate) fn shard_id(number: u64) -> String {
    format!("shardId-{number:012}")
}

/// The number in a shard id, if it is one.
pub(crate) fn shard_number(id: &str) -> Option<u64> {
    let digits = id.strip_prefix("shardId-")?;
    (digits.len() == 12 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn unix_millis(time: SystemTime) -> u64 {
    let millis = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    u64::try_from(millis).unwrap_or(u64::MAX)
}

/// One stored record.
#[derive(Debug, Clone)]
pub(crate) struct StoredRecord {
    /// Its sequence number.
    pub(crate) sequence_number: Arc<str>,
    /// Its partition key.
    pub(crate) partition_key: Arc<str>,
    /// Its payload.
    pub(crate) data: Bytes,
    /// When it was stored, to the millisecond (never decreasing within the shard).
    pub(crate) arrival: SystemTime,
}

/// One shard of a stream.
#[derive(Debug)]
pub(crate) struct ShardState {
    /// Its id.
    pub(crate) id: Arc<str>,
    /// The number in its id.
    pub(crate) number: u64,
    /// The hash keys it takes.
    pub(crate) range: HashRange,
    /// The parent of a split, or the first parent of a merge.
    pub(crate) parent: Option<String>,
    /// The second parent of a merge.
    pub(crate) adjacent_parent: Option<String>,
    /// The numbers of its children, once closed by a split or a merge.
    pub(crate) children: Vec<u64>,
    /// Whether it still takes records.
    pub(crate) open: bool,
    /// When it was closed (split or merged).
    pub(crate) closed_at: Option<SystemTime>,
    /// Closed before the retention period's cut, and every record trimmed: no longer listed
    /// or readable.
    pub(crate) expired: bool,
    /// The position of `records[0]`: how many records were trimmed.
    offset: u64,
    records: VecDeque<StoredRecord>,
    last_arrival: Option<SystemTime>,
}

/// The span of a read: which positions a GetRecords answer covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadSpan {
    /// The first position read.
    pub(crate) from: u64,
    /// The position after the last record read.
    pub(crate) to: u64,
}

impl ShardState {
    /// A new open, empty shard.
    pub(crate) fn new(
        number: u64,
        range: HashRange,
        parent: Option<String>,
        adjacent_parent: Option<String>,
    ) -> Self {
        Self {
            id: shard_id(number).into(),
            number,
            range,
            parent,
            adjacent_parent,
            children: Vec::new(),
            open: true,
            closed_at: None,
            expired: false,
            offset: 0,
            records: VecDeque::new(),
            last_arrival: None,
        }
    }

    /// The position after the newest record (where LATEST points).
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.records.len() as u64
    }

    /// The position of the oldest kept record (where TRIM_HORIZON points).
    pub(crate) fn trim_horizon(&self) -> u64 {
        self.offset
    }

    /// The kept records, oldest first.
    pub(crate) fn records(&self) -> impl Iterator<Item = &StoredRecord> {
        self.records.iter()
    }

    /// Stores a record arriving `now` (millisecond precision, never before the previous one)
    /// and returns its sequence number.
    pub(crate) fn append(
        &mut self,
        stream_number: u64,
        partition_key: String,
        data: Bytes,
        now: SystemTime,
    ) -> String {
        let now = UNIX_EPOCH + Duration::from_millis(unix_millis(now));
        let arrival = self.last_arrival.map_or(now, |last| last.max(now));
        let sequence_number = sequence::encode(stream_number, self.number, self.end());
        self.last_arrival = Some(arrival);
        self.records.push_back(StoredRecord {
            sequence_number: Arc::from(sequence_number.as_str()),
            partition_key: Arc::from(partition_key),
            data,
            arrival,
        });
        sequence_number
    }

    /// The position of the first kept record that arrived at or after `millis` (the end when
    /// there is none).
    pub(crate) fn position_at_timestamp(&self, millis: u64) -> u64 {
        let Some(at) = UNIX_EPOCH.checked_add(Duration::from_millis(millis)) else {
            return self.end();
        };
        self.offset + self.records.partition_point(|r| r.arrival < at) as u64
    }

    /// The records a read from `position` of at most `limit` records returns: it starts at the
    /// trim horizon when `position` is before it, and stops after 10 MiB of data.
    pub(crate) fn read_span(&self, position: u64, limit: usize) -> ReadSpan {
        let from = position.clamp(self.offset, self.end());
        let mut to = from;
        let mut bytes = 0_usize;
        for record in self.records.iter().skip(self.index_of(from)).take(limit) {
            let size = record.data.len() + record.partition_key.len();
            if to > from && bytes + size > MAX_READ_BYTES {
                break;
            }
            bytes += size;
            to += 1;
        }
        ReadSpan { from, to }
    }

    /// The records of a span.
    pub(crate) fn span_records(&self, span: ReadSpan) -> impl Iterator<Item = &StoredRecord> {
        let count = usize::try_from(span.to.saturating_sub(span.from)).unwrap_or(usize::MAX);
        self.records
            .iter()
            .skip(self.index_of(span.from))
            .take(count)
    }

    /// How far behind the tip a read of `span` is, in milliseconds (0 when it reaches the
    /// end, at least 1 otherwise).
    pub(crate) fn millis_behind(&self, span: ReadSpan) -> u64 {
        if span.to == self.end() {
            return 0;
        }
        let last = self
            .record_at(span.to.saturating_sub(1).max(span.from))
            .map_or(0, |r| unix_millis(r.arrival));
        unix_millis(SystemTime::now()).saturating_sub(last).max(1)
    }

    /// The kept record at `position`.
    pub(crate) fn record_at(&self, position: u64) -> Option<&StoredRecord> {
        if position < self.offset {
            return None;
        }
        self.records.get(self.index_of(position))
    }

    fn index_of(&self, position: u64) -> usize {
        usize::try_from(position.saturating_sub(self.offset)).unwrap_or(usize::MAX)
    }

    /// Drops the records that arrived before `older_than`; returns how many. A shard closed
    /// before `older_than` and left with no record expires: it leaves the listing, as a shard
    /// past the retention period does.
    pub(crate) fn trim(&mut self, older_than: SystemTime) -> usize {
        let count = self.records.partition_point(|r| r.arrival < older_than);
        self.records.drain(..count);
        self.offset += count as u64;
        if self.records.is_empty() && self.closed_at.is_some_and(|at| at < older_than) {
            self.expired = true;
        }
        count
    }

    /// The sequence number of the shard's first record (issued or to come).
    pub(crate) fn starting_sequence_number(&self, stream_number: u64) -> String {
        sequence::encode(stream_number, self.number, 0)
    }

    /// The sequence number of the shard's last record, or a synthetic one past every position
    /// when the shard never held a record.
    pub(crate) fn ending_sequence_number(&self, stream_number: u64) -> String {
        let last = self.end().checked_sub(1).unwrap_or(sequence::END_POSITION);
        sequence::encode(stream_number, self.number, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> HashRange {
        HashRange {
            start: 0,
            end: u128::MAX,
        }
    }

    #[test]
    fn ids_round_trip() {
        assert_eq!(shard_id(0), "shardId-000000000000");
        assert_eq!(shard_id(12), "shardId-000000000012");
        assert_eq!(shard_number("shardId-000000000012"), Some(12));
        assert_eq!(shard_number("shardId-12"), None);
        assert_eq!(shard_number("shard-000000000012"), None);
        assert_eq!(shard_number("shardId-00000000001x"), None);
    }

    #[test]
    fn arrivals_never_decrease_and_trim_keeps_positions() {
        let mut shard = ShardState::new(0, full(), None, None);
        let t0 = UNIX_EPOCH + Duration::from_millis(10_000);
        shard.append(1, "a".into(), Bytes::from_static(b"1"), t0);
        // A clock step backwards does not move arrivals backwards.
        shard.append(
            1,
            "a".into(),
            Bytes::from_static(b"2"),
            t0 - Duration::from_secs(5),
        );
        shard.append(
            1,
            "a".into(),
            Bytes::from_static(b"3"),
            t0 + Duration::from_millis(7),
        );
        let arrivals: Vec<SystemTime> = shard.records().map(|r| r.arrival).collect();
        assert_eq!(arrivals, vec![t0, t0, t0 + Duration::from_millis(7)]);
        assert_eq!(shard.position_at_timestamp(10_000), 0);
        assert_eq!(shard.position_at_timestamp(10_001), 2);
        assert_eq!(shard.position_at_timestamp(20_000), 3);
        assert_eq!(shard.position_at_timestamp(u64::MAX), 3);

        assert_eq!(shard.trim(t0 + Duration::from_millis(1)), 2);
        assert_eq!(shard.trim_horizon(), 2);
        assert_eq!(shard.end(), 3);
        assert_eq!(
            shard.record_at(2).map(|r| r.data.clone()),
            Some(Bytes::from_static(b"3"))
        );
        assert!(shard.record_at(1).is_none());
        // A read from before the trim horizon starts at it.
        assert_eq!(shard.read_span(0, 10), ReadSpan { from: 2, to: 3 });
        // Positions keep counting from the shard's first record.
        let seq = shard.append(1, "a".into(), Bytes::new(), t0);
        assert_eq!(sequence::decode(&seq).map(|p| p.position), Some(3));
    }

    #[test]
    fn reads_stop_at_ten_mebibytes() {
        let mut shard = ShardState::new(0, full(), None, None);
        let big = Bytes::from(vec![0_u8; 1024 * 1024]);
        for _ in 0..12 {
            shard.append(1, "k".into(), big.clone(), SystemTime::now());
        }
        assert_eq!(shard.read_span(0, 10_000), ReadSpan { from: 0, to: 9 });
        assert_eq!(shard.read_span(9, 10_000), ReadSpan { from: 9, to: 12 });
        assert_eq!(shard.read_span(0, 2), ReadSpan { from: 0, to: 2 });
        assert_eq!(shard.span_records(ReadSpan { from: 1, to: 3 }).count(), 2);
    }
}

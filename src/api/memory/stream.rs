//! One stream: its shards, routing, resharding, and where iterators start.
//!
//! Shard `n` of a stream is `shardId-` followed by `n` in twelve digits and sits at index `n`
//! of [`StreamState::shards`]: a split or a merge appends its children, so the ids keep
//! counting up and list in creation order.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

use super::hash::{HashRange, even_ranges};
use super::sequence;
use super::shard::{ShardState, shard_id, shard_number};
use crate::api::{ChildShard, ShardDescription};
use crate::position::StartingPoint;

/// Why a stream refused a request (turned into a [`KinesisError`](crate::error::KinesisError) by the
/// caller, which knows the operation and the region).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The shard does not exist.
    ShardNotFound(String),
    /// An argument was refused; the message says which and why.
    Invalid(String),
}

/// The longest stream name the service accepts.
pub(crate) const MAX_STREAM_NAME_LEN: usize = 128;

/// Checks a stream name like the service: 1 to 128 characters of `[a-zA-Z0-9_.-]`.
pub(crate) fn check_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_STREAM_NAME_LEN {
        return Err(format!(
            "StreamName `{name}` must be 1 to {MAX_STREAM_NAME_LEN} characters long (it has {})",
            name.chars().count()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "StreamName `{name}` contains `{bad}`; a stream name is made of letters, digits, \
             `_`, `.` and `-` only"
        ));
    }
    Ok(())
}

/// One stream.
#[derive(Debug)]
pub(crate) struct StreamState {
    /// The stream's number within its store (part of every sequence number).
    pub(crate) number: u64,
    /// Its shards, open and closed; shard `n` at index `n`.
    pub(crate) shards: Vec<ShardState>,
}

impl StreamState {
    /// A stream of `shard_count` open shards splitting the hash key space evenly.
    pub(crate) fn new(number: u64, shard_count: u32) -> Self {
        let shards = even_ranges(shard_count)
            .into_iter()
            .zip(0_u64..)
            .map(|(range, n)| ShardState::new(n, range, None, None))
            .collect();
        Self { number, shards }
    }

    /// How many shards are open.
    pub(crate) fn open_shard_count(&self) -> usize {
        self.shards.iter().filter(|s| s.open).count()
    }

    /// The index of the shard with id `id`.
    pub(crate) fn index_of(&self, id: &str) -> Result<usize, Refusal> {
        shard_number(id)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&i| i < self.shards.len() && !self.shards[i].expired)
            .ok_or_else(|| Refusal::ShardNotFound(id.to_owned()))
    }

    /// The index of the open shard taking hash key `hash`.
    pub(crate) fn route(&self, hash: u128) -> usize {
        // The open shards always cover the whole key space; the fallback is unreachable.
        self.shards
            .iter()
            .position(|s| s.open && s.range.contains(hash))
            .unwrap_or(0)
    }

    /// Stores a record on shard `index`; returns its sequence number.
    pub(crate) fn append(
        &mut self,
        index: usize,
        partition_key: String,
        data: Bytes,
        now: SystemTime,
    ) -> String {
        let number = self.number;
        self.shards[index].append(number, partition_key, data, now)
    }

    /// Where an iterator of shard `index` starting at `start` points.
    pub(crate) fn position_for(&self, index: usize, start: &StartingPoint) -> Result<u64, Refusal> {
        let shard = &self.shards[index];
        match start {
            StartingPoint::TrimHorizon => Ok(shard.trim_horizon()),
            StartingPoint::Latest => Ok(shard.end()),
            StartingPoint::AtTimestamp(millis) => Ok(shard.position_at_timestamp(*millis)),
            StartingPoint::AtSequence(seq) | StartingPoint::AfterSubSequence(seq, _) => {
                self.sequence_position(index, seq)
            }
            StartingPoint::AfterSequence(seq) => self
                .sequence_position(index, seq)
                .map(|p| p.saturating_add(1).min(shard.end())),
        }
    }

    /// The position of the record with sequence number `seq` in shard `index`.
    fn sequence_position(&self, index: usize, seq: &str) -> Result<u64, Refusal> {
        let shard = &self.shards[index];
        let refuse = |why: String| {
            Refusal::Invalid(format!(
                "Invalid StartingSequenceNumber {seq} for shard {}: {why}",
                shard.id
            ))
        };
        let parts = sequence::decode(seq)
            .ok_or_else(|| refuse("it is not a sequence number this stream issued".into()))?;
        if parts.stream != self.number {
            return Err(refuse("it did not come from this stream".into()));
        }
        if parts.shard != shard.number {
            return Err(refuse(format!(
                "it belongs to shard {}, not to this shard",
                shard_id(parts.shard)
            )));
        }
        if parts.position == sequence::END_POSITION && !shard.open {
            // The synthetic ending sequence number of a closed shard that never held a record.
            return Ok(shard.end());
        }
        if parts.position >= shard.end() {
            return Err(refuse(
                "no record with this sequence number was written to the shard".into(),
            ));
        }
        Ok(parts.position)
    }

    /// Closes the open shard `index` and opens two children split at `key`.
    pub(crate) fn split(&mut self, index: usize, key: u128) -> Result<(), Refusal> {
        let parent = &self.shards[index];
        if !parent.open {
            return Err(Refusal::Invalid(format!(
                "shard {} is closed (split or merged already); only open shards can be split",
                parent.id
            )));
        }
        let range = parent.range;
        if key <= range.start || key > range.end {
            return Err(Refusal::Invalid(format!(
                "NewStartingHashKey {key} is not inside the hash key range of shard {} \
                 ({} to {}); it must be greater than the range's start and at most its end",
                parent.id, range.start, range.end
            )));
        }
        let parent_id = parent.id.to_string();
        let low = self.push_child(
            HashRange {
                start: range.start,
                end: key - 1,
            },
            Some(parent_id.clone()),
            None,
        );
        let high = self.push_child(
            HashRange {
                start: key,
                end: range.end,
            },
            Some(parent_id),
            None,
        );
        let parent = &mut self.shards[index];
        parent.open = false;
        parent.closed_at = Some(SystemTime::now());
        parent.children = vec![low, high];
        Ok(())
    }

    /// Closes the open, hash-adjacent shards `first` and `second` and opens one child.
    pub(crate) fn merge(&mut self, first: usize, second: usize) -> Result<(), Refusal> {
        let (a, b) = (&self.shards[first], &self.shards[second]);
        if first == second {
            return Err(Refusal::Invalid(format!(
                "shard {} cannot be merged with itself",
                a.id
            )));
        }
        for shard in [a, b] {
            if !shard.open {
                return Err(Refusal::Invalid(format!(
                    "shard {} is closed (split or merged already); only open shards can be merged",
                    shard.id
                )));
            }
        }
        if !a.range.is_adjacent_to(b.range) {
            return Err(Refusal::Invalid(format!(
                "shards {} and {} are not adjacent: their hash key ranges ({} to {} and {} to {}) \
                 must touch",
                a.id, b.id, a.range.start, a.range.end, b.range.start, b.range.end
            )));
        }
        let range = a.range.union(b.range);
        let (parent, adjacent) = (a.id.to_string(), b.id.to_string());
        let child = self.push_child(range, Some(parent), Some(adjacent));
        for index in [first, second] {
            let shard = &mut self.shards[index];
            shard.open = false;
            shard.closed_at = Some(SystemTime::now());
            shard.children = vec![child];
        }
        Ok(())
    }

    fn push_child(
        &mut self,
        range: HashRange,
        parent: Option<String>,
        adjacent: Option<String>,
    ) -> u64 {
        let number = self.shards.len() as u64;
        self.shards
            .push(ShardState::new(number, range, parent, adjacent));
        number
    }

    /// The indices of the shards ListShards shows: all but those past the retention period.
    pub(crate) fn listed(&self) -> Vec<usize> {
        (0..self.shards.len())
            .filter(|&i| !self.shards[i].expired)
            .collect()
    }

    /// Shard `index` as ListShards describes it.
    pub(crate) fn describe(&self, index: usize) -> ShardDescription {
        let shard = &self.shards[index];
        ShardDescription {
            shard_id: shard.id.to_string(),
            parent_shard_id: shard.parent.clone(),
            adjacent_parent_shard_id: shard.adjacent_parent.clone(),
            starting_hash_key: shard.range.start.to_string(),
            ending_hash_key: shard.range.end.to_string(),
            starting_sequence_number: shard.starting_sequence_number(self.number),
            ending_sequence_number: (!shard.open)
                .then(|| shard.ending_sequence_number(self.number)),
        }
    }

    /// The children of shard `index`, each with all its parents.
    pub(crate) fn child_shards(&self, index: usize) -> Vec<ChildShard> {
        self.shards[index]
            .children
            .iter()
            .filter_map(|&n| self.shards.get(usize::try_from(n).ok()?))
            .map(|child| ChildShard {
                shard_id: child.id.to_string(),
                parent_shards: child
                    .parent
                    .iter()
                    .chain(child.adjacent_parent.iter())
                    .cloned()
                    .collect(),
            })
            .collect()
    }

    /// The shared id of shard `index`.
    pub(crate) fn shard_id(&self, index: usize) -> Arc<str> {
        self.shards[index].id.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names_are_checked_like_the_service() {
        assert!(check_stream_name("orders").is_ok());
        assert!(check_stream_name("a.b-c_D9").is_ok());
        assert!(check_stream_name(&"x".repeat(128)).is_ok());
        assert!(check_stream_name("").is_err());
        assert!(check_stream_name(&"x".repeat(129)).is_err());
        assert!(check_stream_name("has space").is_err());
        assert!(check_stream_name("slash/name").is_err());
        assert!(check_stream_name("ünï").is_err());
    }

    #[test]
    fn split_and_merge_keep_the_key_space_covered() {
        let mut stream = StreamState::new(1, 2);
        let mid = stream.shards[0].range.end / 2;
        stream.split(0, mid).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(stream.shards.len(), 4);
        assert_eq!(stream.open_shard_count(), 3);
        // Shards 2 and 3 are the children of 0; merge 3 with 1.
        stream.merge(3, 1).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(stream.open_shard_count(), 2);
        let mut open: Vec<HashRange> = stream
            .shards
            .iter()
            .filter(|s| s.open)
            .map(|s| s.range)
            .collect();
        open.sort_by_key(|r| r.start);
        assert_eq!(open[0].start, 0);
        assert_eq!(open[0].end + 1, open[1].start);
        assert_eq!(open[1].end, u128::MAX);
        for key in [0, mid - 1, mid, u128::MAX / 2, u128::MAX] {
            let shard = &stream.shards[stream.route(key)];
            assert!(shard.open && shard.range.contains(key));
        }
    }
}

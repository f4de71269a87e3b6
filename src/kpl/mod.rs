//! The KPL aggregation format: many user records packed into one Kinesis record.
//!
//! An aggregate's data is the magic bytes `F3 89 9A C2`, a protobuf `AggregatedRecord` (a
//! table of partition keys, a table of explicit hash keys, and the user records, each naming
//! its keys by index), and the MD5 of that protobuf (16 bytes). The KPL, the Kinesis Agent
//! and AWS's `aws-kinesis-agg` libraries write it; the KCL reads it.
//!
//! How a reader with de-aggregation on treats what it meets, decided against what the KCL
//! does (its `AggregatorUtil`):
//!
//! | record | the KCL | this crate |
//! |---|---|---|
//! | no magic bytes | handed on as it is | the same |
//! | an aggregate | its user records, each with the aggregate's sequence number and a sub-sequence number | the same; a user record's data is a slice of the aggregate's buffer (no copy) |
//! | the magic bytes, but too short, a wrong MD5, or a protobuf that does not decode | handed on as it is, silently | handed on as it is, with a warning naming the shard, the sequence number and what was wrong |
//! | a user record whose key index is out of its table's range | an error logged; that user record and the rest of the aggregate are lost | that user record is an error item naming the shard, sequence and sub-sequence number (settled as skipped); the aggregate's other user records are delivered |
//! | user records whose hash key lies outside the shard's range (the aggregate was put against a stale shard map, as after a split) | the whole aggregate is dropped, because the KPL puts those user records again (to the shard it now predicts); a producer that does not re-put (AWS's `aws-kinesis-agg` libraries, whose docs warn of this data loss) loses them | delivered, with a warning naming the shard, the sequence number and how many are out of range: a record is never lost to a guess about its producer. A KPL producer's re-put copies then arrive a second time from their shard (with other sequence numbers). [`ReadSettings::discard_misplaced_user_records`](crate::ReadSettings::discard_misplaced_user_records) drops them as the KCL does, for KPL-only streams |
//! | an aggregate of no user records | nothing (with an empty message, magic and MD5 only: handed on as a record) | nothing; the checkpoint passes it with the next record |
//! | an aggregate of the full 1 MiB holding tens of thousands of tiny user records | its user records | its user records, in order, each a slice of the one buffer; the subscription's in-flight bound applies to them as to plain records |
//! | an empty partition key in the aggregate's table (the service refuses one on a plain record) | handed on | handed on as it is (`""`); the aggregate's own key, which the service checked, is not substituted |
//!
//! `tests/kpl_bad_input.rs` puts each of these through a de-aggregating subscription on the
//! emulators and checks that the checkpoint passes them all.

pub(crate) mod hash;
mod message;
mod unpack;

pub(crate) use hash::HashRange;

pub use unpack::aggregate;
pub(crate) use unpack::{Unpacked, unpack};

/// The first four bytes of a record aggregated by the Kinesis Producer Library.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];

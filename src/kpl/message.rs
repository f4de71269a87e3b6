//! The protobuf messages of the aggregation format, written by hand (no `protoc` at build
//! time). Field numbers and labels follow the format's `.proto`:
//!
//! ```text
//! message AggregatedRecord {
//!   repeated string partition_key_table     = 1;
//!   repeated string explicit_hash_key_table = 2;
//!   repeated Record records                 = 3;
//! }
//! message Tag    { required string key = 1; optional string value = 2; }
//! message Record {
//!   required uint64 partition_key_index     = 1;
//!   optional uint64 explicit_hash_key_index = 2;
//!   required bytes  data                    = 3;
//!   repeated Tag    tags                    = 4;
//! }
//! ```
//!
//! `data` decodes as [`Bytes`]: decoded from a `Bytes` buffer, it is a slice of the aggregate,
//! not a copy.

use bytes::Bytes;

/// One aggregate: the key tables and the user records that index them.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AggregatedRecord {
    /// The partition keys the user records name by index.
    #[prost(string, repeated, tag = "1")]
    pub(crate) partition_key_table: Vec<String>,
    /// The explicit hash keys the user records name by index.
    #[prost(string, repeated, tag = "2")]
    pub(crate) explicit_hash_key_table: Vec<String>,
    /// The user records, in the order they were added.
    #[prost(message, repeated, tag = "3")]
    pub(crate) records: Vec<UserRecord>,
}

/// A tag the KPL may attach to a user record (carried, not interpreted).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Tag {
    /// The tag's name.
    #[prost(string, required, tag = "1")]
    pub(crate) key: String,
    /// The tag's value.
    #[prost(string, optional, tag = "2")]
    pub(crate) value: Option<String>,
}

/// One user record of an aggregate.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct UserRecord {
    /// Index into the aggregate's partition key table.
    #[prost(uint64, required, tag = "1")]
    pub(crate) partition_key_index: u64,
    /// Index into the aggregate's explicit hash key table, when the record has one.
    #[prost(uint64, optional, tag = "2")]
    pub(crate) explicit_hash_key_index: Option<u64>,
    /// The user record's data.
    #[prost(bytes = "bytes", required, tag = "3")]
    pub(crate) data: Bytes,
    /// Its tags.
    #[prost(message, repeated, tag = "4")]
    pub(crate) tags: Vec<Tag>,
}

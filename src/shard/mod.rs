//! One shard as a `Stream` of records.
//!
//! | item | what it is |
//! |---|---|
//! | [`ShardStreamBuilder`] | builds a [`ShardStream`]: stream, shard, settings, settled position |
//! | [`ShardStream`] | the `Stream<Item = Result<Record, KinesisError>>` of one shard |
//! | [`ReadSettings`] | poll interval, read-rate cap, batch size, failure handling |
//! | [`SettledPosition`] | the settled sequence number an expired iterator is renewed after |
//! | [`ShardEnd`] | what a closed shard reports when it is fully read |
//! | [`KPL_MAGIC`] | the bytes that mark a KPL-aggregated record |

mod deaggregate;
mod reader;
mod settings;
mod stream;

pub(crate) use reader::ReadProbe;
pub use reader::SettledPosition;
pub use settings::{
    DEFAULT_BATCH_SIZE, DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_POLL_INTERVAL,
    MAX_WAIT, ReadSettings, SERVICE_READS_PER_SECOND,
};
pub use stream::{KPL_MAGIC, ShardStream, ShardStreamBuilder};

use crate::api::ChildShard;

/// A closed shard, read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEnd {
    /// The shard that ended.
    pub shard_id: String,
    /// Its children, as the last GetRecords answer named them.
    pub child_shards: Vec<ChildShard>,
    /// The last record this reader read from it, if any.
    pub last_sequence_number: Option<String>,
}

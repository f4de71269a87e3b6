//! A batch subscription's size as the GetRecords limit: the subscription's calls go through
//! [`BatchLimited`], which asks for the batch size once the batch stream has opened.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::api::{
    ApiFuture, GetRecordsOutput, KinesisApi, ListShardsPage, PutRecordsEntry, PutRecordsOutput,
    ShardEvents, SharedKinesis, StreamConsumer, StreamSummary,
};
use crate::position::StartingPoint;

/// The most records one GetRecords call may ask for.
const SERVICE_LIMIT: u32 = 10_000;

/// The limit a subscription's GetRecords calls use; unset (0) until a batch stream opens.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadLimit(Arc<AtomicU32>);

impl ReadLimit {
    /// From now on, GetRecords asks for `records` (at most the service's 10,000).
    pub(crate) fn set(&self, records: usize) {
        let records = u32::try_from(records).unwrap_or(SERVICE_LIMIT);
        self.0
            .store(records.clamp(1, SERVICE_LIMIT), Ordering::Relaxed);
    }

    /// The limit to ask for instead of `asked`.
    fn apply(&self, asked: u32) -> u32 {
        match self.0.load(Ordering::Relaxed) {
            0 => asked,
            set => set,
        }
    }
}

/// An API whose GetRecords calls take their limit from a [`ReadLimit`]; every other call
/// passes through unchanged.
pub(crate) struct BatchLimited {
    inner: SharedKinesis,
    limit: ReadLimit,
}

impl BatchLimited {
    pub(crate) fn new(inner: SharedKinesis, limit: ReadLimit) -> Self {
        Self { inner, limit }
    }
}

impl KinesisApi for BatchLimited {
    fn region(&self) -> &str {
        self.inner.region()
    }

    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
        next_token: Option<String>,
    ) -> ApiFuture<'a, ListShardsPage> {
        self.inner.list_shards(stream, next_token)
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, String> {
        self.inner.get_shard_iterator(stream, shard, start)
    }

    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
    ) -> ApiFuture<'a, GetRecordsOutput> {
        self.inner
            .get_records(stream, shard, iterator, self.limit.apply(limit))
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        self.inner.put_records(stream, entries)
    }

    fn describe_stream_summary<'a>(&'a self, stream: &'a str) -> ApiFuture<'a, StreamSummary> {
        self.inner.describe_stream_summary(stream)
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        self.inner.register_stream_consumer(stream, consumer)
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        self.inner.describe_stream_consumer(stream, consumer)
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, ()> {
        self.inner.deregister_stream_consumer(stream, consumer)
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, ShardEvents> {
        self.inner
            .subscribe_to_shard(stream, consumer_arn, shard, start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_applies_once_set_within_the_services_bounds() {
        let limit = ReadLimit::default();
        assert_eq!(limit.apply(1_000), 1_000);
        limit.set(6);
        assert_eq!(limit.apply(1_000), 6);
        limit.set(50_000);
        assert_eq!(limit.apply(1_000), 10_000);
    }
}

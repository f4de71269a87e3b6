//! A batch subscription's size as the GetRecords limit: the subscription's calls go through
//! a [`KinesisLayer`] that asks for the batch size once the batch stream has opened.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::api::layer::KinesisLayer;
use crate::api::{ApiFuture, GetRecordsOutput, KinesisApi};

/// The most records one GetRecords call may ask for.
const SERVICE_LIMIT: u32 = 10_000;

/// The limit a subscription's GetRecords calls use; unset (0) until a batch stream opens.
/// As a layer, it rewrites each GetRecords call's limit; every other call passes through.
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

impl KinesisLayer for ReadLimit {
    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, GetRecordsOutput> {
        inner.get_records(stream, shard, iterator, self.apply(limit))
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

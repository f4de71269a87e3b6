//! [`Delivery`]: a value together with what settles it.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::tracker::{Settlement, ShardAcks};

/// The right (and duty) to settle one delivered record.
///
/// Settle it with [`ack`](Self::ack) or [`skip`](Self::skip). A token dropped without being
/// settled settles the record as [`Settlement::Dropped`]: the checkpoint may pass it, the
/// shard never stalls on it, and the drop is counted and logged at debug level. This is what
/// makes `filter` work: a record filtered out of a pipeline is settled by being dropped.
/// Anything that must be redelivered has to stay unsettled (keep the token) until it is done.
#[must_use = "a delivery that is dropped without being settled counts as dropped"]
pub struct AckToken {
    acks: Arc<ShardAcks>,
    index: u64,
    settled: bool,
}

impl fmt::Debug for AckToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckToken")
            .field("shard", &self.acks.shard())
            .field("index", &self.index)
            .field("settled", &self.settled)
            .finish()
    }
}

impl AckToken {
    pub(crate) fn new(acks: Arc<ShardAcks>, index: u64) -> Self {
        Self {
            acks,
            index,
            settled: false,
        }
    }

    /// Settles the record as processed.
    pub fn ack(mut self) {
        self.settle(Settlement::Acked);
    }

    /// Settles the record as deliberately not processed.
    pub fn skip(mut self) {
        self.settle(Settlement::Skipped);
    }

    /// Settles the record as `how`.
    pub fn settle_as(mut self, how: Settlement) {
        self.settle(how);
    }

    /// The id of the shard the record came from.
    #[must_use]
    pub fn shard_id(&self) -> &str {
        self.acks.shard()
    }

    /// True when the subscription moved its shard (a seek) after this was handed out:
    /// settling it no longer moves the checkpoint.
    #[must_use]
    pub fn is_stale(&self) -> bool {
        self.acks.is_retired()
    }

    fn settle(&mut self, how: Settlement) {
        if !self.settled {
            self.settled = true;
            self.acks.settle(self.index, how);
        }
    }
}

impl Drop for AckToken {
    fn drop(&mut self) {
        if !self.settled {
            tracing::debug!(
                stream = %self.acks.stream(),
                shard = %self.acks.shard(),
                "delivery dropped without being settled; counted as dropped"
            );
            self.settle(Settlement::Dropped);
        }
    }
}

/// A value delivered from a shard, carrying the token that settles it.
///
/// `Delivery` keeps its token through [`map`](Self::map), `filter` (a filtered-out delivery
/// is settled when dropped) and `.chunks(n)` (a `Vec<Delivery<T>>` settles element by
/// element, or all at once through the [`AckSink`](super::AckSink)).
#[must_use = "a delivery that is dropped without being settled counts as dropped"]
pub struct Delivery<T> {
    value: T,
    token: AckToken,
}

impl<T: fmt::Debug> fmt::Debug for Delivery<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("value", &self.value)
            .field("token", &self.token)
            .finish()
    }
}

impl<T> Delivery<T> {
    /// Pairs a value with its token.
    pub(crate) fn new(value: T, token: AckToken) -> Self {
        Self { value, token }
    }

    /// The delivered value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// Transforms the value, keeping the token.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Delivery<U> {
        Delivery {
            value: f(self.value),
            token: self.token,
        }
    }

    /// Splits the delivery into its value and its token.
    pub fn into_parts(self) -> (T, AckToken) {
        (self.value, self.token)
    }

    /// Settles the delivery as processed and returns the value.
    pub fn ack(self) -> T {
        self.token.ack();
        self.value
    }

    /// Settles the delivery as skipped and returns the value.
    pub fn skip(self) -> T {
        self.token.skip();
        self.value
    }

    /// The id of the shard the value came from.
    #[must_use]
    pub fn shard_id(&self) -> &str {
        self.token.shard_id()
    }

    /// True when the subscription moved its shard (a seek) after this was handed out:
    /// settling it no longer moves the checkpoint.
    #[must_use]
    pub fn is_stale(&self) -> bool {
        self.token.is_stale()
    }
}

impl Delivery<crate::record::Record> {
    /// Sends the record back to be delivered again at once, still unsettled, before any later
    /// record of its shard that has not been handed out yet. The checkpoint does not pass it
    /// meanwhile.
    pub fn retry(self) {
        self.retry_after(std::time::Duration::ZERO);
    }

    /// Decodes the record's data with `decode` (`serde_json::from_slice`, a protobuf
    /// decoder, ...). A failure is [`KinesisError::Decode`](crate::KinesisError::Decode): one
    /// error naming the stream, the shard, the sequence number and the partition key, with the
    /// decoder's error as its source. The delivery is left as it was, unsettled: the caller
    /// decides, usually [`skip`](Self::skip) for a record that will never decode (the shard goes
    /// on and the checkpoint passes it) or [`retry`](Self::retry).
    ///
    /// ```
    /// # async fn demo() -> Result<(), kinesis_dataflow::KinesisError> {
    /// use std::sync::Arc;
    ///
    /// use futures::StreamExt;
    /// use kinesis_dataflow::{
    ///     KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription,
    /// };
    ///
    /// let kinesis = MemoryKinesis::new();
    /// kinesis.add_stream("orders", 1)?;
    /// kinesis.put("orders", "order-1", "{not json")?;
    /// let mut orders = Subscription::builder(
    ///     Arc::new(kinesis),
    ///     Arc::new(MemoryLeaseStore::new()),
    ///     "orders",
    /// )
    /// .start_at(KinesisPosition::horizon())
    /// .start()
    /// .await?;
    ///
    /// let delivery = orders.next().await.expect("a record")?;
    /// match delivery.decode(serde_json::from_slice::<serde_json::Value>) {
    ///     Ok(order) => {
    ///         println!("{order}");
    ///         delivery.ack();
    ///     }
    ///     Err(error) => {
    ///         // record 4900... (partition key `order-1`) of shard `shardId-000000000000` in
    ///         // stream `orders` does not decode: key must be a string at line 1 column 2. ...
    ///         assert!(matches!(
    ///             &error,
    ///             KinesisError::Decode { partition_key, .. } if partition_key == "order-1"
    ///         ));
    ///         eprintln!("{error}");
    ///         delivery.skip();
    ///     }
    /// }
    /// orders.shutdown().await;
    /// # Ok(())
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`KinesisError::Decode`](crate::KinesisError::Decode) when `decode` fails.
    pub fn decode<'a, T, E>(
        &'a self,
        decode: impl FnOnce(&'a [u8]) -> Result<T, E>,
    ) -> Result<T, crate::KinesisError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        decode(self.value.data()).map_err(|e| crate::KinesisError::Decode {
            stream: self.token.acks.stream().to_string(),
            shard: self.value.shard_id().to_owned(),
            sequence_number: self.value.sequence_number().to_owned(),
            partition_key: self.value.partition_key().to_owned(),
            source: std::sync::Arc::new(e),
        })
    }

    /// Like [`retry`](Self::retry), after `delay`. Later records of the shard wait for it.
    pub fn retry_after(self, delay: std::time::Duration) {
        let (record, mut token) = self.into_parts();
        token.settled = true;
        token.acks.requeue(token.index, record, delay);
    }
}

impl<T> Deref for Delivery<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Delivery<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

//! A [`Publisher`] as a dead-letter destination: each dead letter becomes one record of the
//! publisher's stream, its envelope as data, under the original partition key (so a key's
//! dead letters stay in order; see [`DeadLetter::destination_key`]).
//!
//! An envelope that does not fit in a Kinesis record (data near 1 MiB grows by a third in
//! base64) goes without its data, naming the data's size ([`DeadLetter::without_data`]): a
//! write PutRecords can never take would otherwise hold the shard for good.

use futures::future::BoxFuture;

use super::Publisher;
use crate::ack::{DeadLetter, DeadLetters};
use crate::error::KinesisError;

impl DeadLetters for Publisher {
    fn send(&self, letter: DeadLetter) -> BoxFuture<'static, Result<(), KinesisError>> {
        let publisher = self.clone();
        Box::pin(async move {
            let key = letter.destination_key().to_owned();
            match publisher.publish(key.clone(), letter.to_envelope()).await {
                Err(KinesisError::InvalidRecord { reason, .. })
                    if letter.omitted_bytes.is_none() =>
                {
                    tracing::warn!(
                        stream = %letter.stream,
                        shard = %letter.shard,
                        sequence_number = %letter.sequence_number,
                        bytes = letter.data.len(),
                        %reason,
                        "dead letter written without its data: the envelope does not fit in a record"
                    );
                    publisher
                        .publish(key, letter.without_data().to_envelope())
                        .await
                        .map(drop)
                }
                other => other.map(drop),
            }
        })
    }
}

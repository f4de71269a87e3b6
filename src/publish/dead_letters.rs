//! A [`Publisher`] as a dead-letter destination: each dead letter becomes one record of the
//! publisher's stream, its envelope as data, under the original partition key (so a key's
//! dead letters stay in order).

use futures::future::BoxFuture;

use super::Publisher;
use crate::ack::{DeadLetter, DeadLetters};
use crate::error::KinesisError;

impl DeadLetters for Publisher {
    fn send(&self, letter: DeadLetter) -> BoxFuture<'static, Result<(), KinesisError>> {
        let publisher = self.clone();
        Box::pin(async move {
            publisher
                .publish(letter.partition_key.to_string(), letter.to_envelope())
                .await
                .map(drop)
        })
    }
}

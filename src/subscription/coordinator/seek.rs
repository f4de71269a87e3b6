//! Moving a running subscription: the coordinator's side of
//! [`SubscriptionSeeker`](crate::subscription::SubscriptionSeeker).

use std::sync::Arc;
use std::time::SystemTime;

use futures::future::join_all;
use tokio::sync::oneshot;

use super::Coordinator;
use super::keeper::Order;
use super::shared::Shared;
use crate::ack::ShardAcks;
use crate::error::{KinesisError, Operation};
use crate::position::{Checkpoint, KinesisPosition, StartingPoint};
use crate::shard::ShardStream;
use crate::subscription::gate::LeaseGate;
use crate::subscription::seeker::SeekRequest;

impl Coordinator {
    pub(super) async fn on_seek(&mut self, request: SeekRequest) {
        let result = self.seek(request.to).await;
        let _ = request.reply.send(result);
    }

    /// The shards `to` moves: every held shard for a position of every shard (horizon,
    /// latest, a timestamp), one shard for a sequence number.
    fn seek_targets(
        &self,
        to: &KinesisPosition,
    ) -> Result<Vec<(String, StartingPoint)>, KinesisError> {
        if let KinesisPosition::Sequence { shard, .. } = to {
            if !self.held.contains_key(shard) {
                return Err(KinesisError::SeekRefused {
                    stream: self.shared.stream.to_string(),
                    position: format!("{to:?}"),
                    reason: format!(
                        "this subscription does not read shard {shard} (it reads {:?}); \
                         seek to a record of a shard it reads, or to a position of every \
                         shard (horizon, latest, a timestamp)",
                        self.held.keys().collect::<Vec<_>>()
                    ),
                });
            }
            return Ok(to
                .for_shard(shard)
                .map(|start| vec![(shard.clone(), start)])
                .unwrap_or_default());
        }
        Ok(self
            .held
            .keys()
            .filter_map(|shard| to.for_shard(shard).map(|start| (shard.clone(), start)))
            .collect())
    }

    /// Moves the shards `to` names. The new readers fetch their first iterators (side by
    /// side) before anything moves, so a position the service refuses leaves every shard where
    /// it was. Each moved shard starts a fresh ledger: deliveries handed out before the seek no
    /// longer count towards its checkpoint, and what the old reader had buffered is dropped.
    /// Where each new reader begins is recorded in the lease table before the seek returns,
    /// so an instance that takes the shard over after a crash replays from there too.
    async fn seek(&mut self, to: KinesisPosition) -> Result<(), KinesisError> {
        let targets = self.seek_targets(&to)?;
        let asked = SystemTime::now();
        let opened = join_all(
            targets
                .into_iter()
                .map(|(shard, start)| open_at(self.shared.clone(), shard, start)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        let mut recorded = Vec::with_capacity(opened.len());
        for (shard, start, acks, reader) in opened {
            // The shard may have been dropped while the readers opened (a lost lease).
            let Some(held) = self.held.get(&shard) else {
                continue;
            };
            held.gate.revoke();
            held.acks.retire();
            held.acks.close();
            held.acks.durability().failed(KinesisError::Superseded {
                stream: self.shared.stream.to_string(),
                shard: shard.clone(),
            });
            let gate = Arc::new(LeaseGate::successor(&held.gate));
            let begins = Checkpoint::Start(match &start {
                StartingPoint::Latest => StartingPoint::since(asked),
                other => other.clone(),
            });
            let (tell, answer) = oneshot::channel();
            held.keeper.order(Order::Moved {
                acks: acks.clone(),
                gate: gate.clone(),
                begins,
                recorded: tell,
            });
            tracing::info!(shard = %shard, position = ?start, "subscription moved (seek)");
            self.replace_reader(&shard, acks, reader, gate);
            recorded.push((shard, answer));
        }
        for (shard, answer) in recorded {
            if !answer.await.unwrap_or(false) {
                tracing::warn!(shard = %shard, "the seek's position could not be recorded; a takeover before the next checkpoint resumes from the previous one");
            }
        }
        Ok(())
    }
}

/// A new reader of a held shard at `start`, its first iterator fetched.
async fn open_at(
    shared: Arc<Shared>,
    shard: String,
    start: StartingPoint,
) -> Result<(String, StartingPoint, Arc<ShardAcks>, ShardStream), KinesisError> {
    let _permit = shared.permits.acquire().await;
    let metrics = shared.shard_metrics(&shard);
    let span = shared.shard_span(&shard);
    let acks = ShardAcks::with_policy(
        shared.stream.clone(),
        Arc::from(shard.as_str()),
        None,
        shared.policy.clone(),
        metrics.clone(),
        span.clone(),
    );
    let mut reader =
        ShardStream::builder(shared.api.clone(), shared.stream.clone(), shard.as_str())
            .metrics(metrics)
            .span(span)
            .settings(shared.config.read.clone())
            .settled(acks.settled_position())
            .probe(shared.probe.clone())
            .first_reads(shared.first_reads.clone())
            .consumer_arn(shared.config.consumer_arn.clone())
            .open(start.clone())?;
    match tokio::time::timeout(shared.config.call_timeout(), reader.try_prime()).await {
        Ok(Ok(())) => Ok((shard, start, acks, reader)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(KinesisError::Service {
            operation: Operation::GetShardIterator,
            stream: shared.stream.to_string(),
            message: format!(
                "no answer within {:?}; the subscription did not move",
                shared.config.call_timeout()
            ),
            source: None,
        }),
    }
}

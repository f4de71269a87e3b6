//! Moving a running subscription: the coordinator's side of
//! [`SubscriptionSeeker`](crate::subscription::SubscriptionSeeker).

use std::sync::Arc;
use std::time::SystemTime;

use futures::future::join_all;
use tokio::sync::oneshot;

use super::keeper::Order;
use super::shared::Shared;
use super::{Coordinator, Done};
use crate::ack::ShardAcks;
use crate::error::{KinesisError, Operation};
use crate::position::{Checkpoint, KinesisPosition, StartingPoint};
use crate::shard::ShardStream;
use crate::subscription::gate::LeaseGate;
use crate::subscription::seeker::SeekRequest;

/// A new reader of a held shard: the shard, where it starts, its ledger and its stream.
type NewReader = (String, StartingPoint, Arc<ShardAcks>, ShardStream);

/// The readers a seek opened (or why it could not), carried from the job back to the loop.
pub(crate) struct Opened {
    reply: oneshot::Sender<Result<(), KinesisError>>,
    asked: SystemTime,
    readers: Result<Vec<NewReader>, KinesisError>,
}

impl Opened {
    /// Answers the seek with `error` instead of moving anything (the subscription stops).
    pub(crate) fn refuse(self, error: KinesisError) {
        let _ = self.reply.send(Err(error));
    }
}

impl Coordinator {
    /// Starts a seek: its new readers fetch their first iterators in a job beside the loop
    /// (GetShardIterator may be slow, and renewals, reports and pump events must go on
    /// meanwhile); [`on_seek_opened`](Self::on_seek_opened) moves the shards once they are.
    pub(super) fn on_seek(&mut self, request: SeekRequest) {
        let targets = match self.seek_targets(&request.to) {
            Ok(targets) => targets,
            Err(e) => {
                let _ = request.reply.send(Err(e));
                return;
            }
        };
        // A fan-out reader's subscription to a shard moving to the tip ends first (it reads
        // by GetRecords meanwhile): the service allows one per consumer and shard, and the
        // new reader's subscription at LATEST fixes where it begins.
        for (shard, start) in &targets {
            if *start == StartingPoint::Latest
                && let Some(hang_up) = self.shards.held.get(shard).and_then(|h| h.hang_up.as_ref())
            {
                hang_up.suspend();
            }
        }
        let asked = SystemTime::now();
        let shared = self.shared.clone();
        self.inbox.jobs.push(Box::pin(async move {
            let readers = join_all(
                targets
                    .into_iter()
                    .map(|(shard, start)| open_at(shared.clone(), shard, start)),
            )
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>();
            Done::Seek(Box::new(Opened {
                reply: request.reply,
                asked,
                readers,
            }))
        }));
    }

    /// Moves the shards a seek opened readers for, and answers the seek once where each new
    /// reader begins is recorded (in a task of its own: the loop does not wait).
    pub(super) fn on_seek_opened(&mut self, opened: Opened) {
        let Opened {
            reply,
            asked,
            readers,
        } = opened;
        match readers {
            Ok(readers) => {
                let recorded = self.move_readers(readers, asked);
                tokio::spawn(async move {
                    for (shard, answer) in recorded {
                        if !answer.await.unwrap_or(false) {
                            tracing::warn!(shard = %shard, "the seek's position could not be recorded; a takeover before the next checkpoint resumes from the previous one");
                        }
                    }
                    let _ = reply.send(Ok(()));
                });
            }
            Err(e) => {
                // Nothing moved: the readers subscribe again.
                for held in self.shards.held.values() {
                    if let Some(hang_up) = &held.hang_up {
                        hang_up.resume();
                    }
                }
                let _ = reply.send(Err(e));
            }
        }
    }

    /// The shards `to` moves: every held shard for a position of every shard (horizon,
    /// latest, a timestamp), one shard for a sequence number.
    fn seek_targets(
        &self,
        to: &KinesisPosition,
    ) -> Result<Vec<(String, StartingPoint)>, KinesisError> {
        if let Some(shard) = to.shard() {
            if !self.shards.held.contains_key(shard) {
                return Err(KinesisError::SeekRefused {
                    stream: self.shared.stream.to_string(),
                    position: format!("{to:?}"),
                    reason: format!(
                        "this subscription does not read shard {shard} (it reads {:?}); \
                         seek to a record of a shard it reads, or to a position of every \
                         shard (horizon, latest, a timestamp)",
                        self.shards.held.keys().collect::<Vec<_>>()
                    ),
                });
            }
            return Ok(to
                .for_shard(shard)
                .map(|start| vec![(shard.to_owned(), start)])
                .unwrap_or_default());
        }
        Ok(self
            .shards
            .held
            .keys()
            .filter_map(|shard| to.for_shard(shard).map(|start| (shard.clone(), start)))
            .collect())
    }

    /// Moves each shard to its new reader (opened, its first iterator fetched, so a position
    /// the service refused left every shard where it was). Each moved shard starts a fresh
    /// ledger: deliveries handed out before the seek no longer count towards its checkpoint,
    /// and what the old reader had buffered is dropped. A shard no longer held, or whose
    /// keeper has stopped (it finished meanwhile), is not moved: its new reader is dropped
    /// unread. Returns, per moved shard, the answer to whether its new start was recorded.
    fn move_readers(
        &mut self,
        readers: Vec<NewReader>,
        asked: SystemTime,
    ) -> Vec<(String, oneshot::Receiver<bool>)> {
        let mut recorded = Vec::with_capacity(readers.len());
        for (shard, start, acks, reader) in readers {
            // The shard may have been dropped while the readers opened (a lost lease).
            let Some(held) = self.shards.held.get(&shard) else {
                continue;
            };
            let gate = Arc::new(LeaseGate::successor(&held.gate));
            let begins = Checkpoint::Start(match &start {
                StartingPoint::Latest => StartingPoint::since(asked),
                other => other.clone(),
            });
            let (tell, answer) = oneshot::channel();
            let ordered = held.keeper.order(Order::Moved {
                acks: acks.clone(),
                gate: gate.clone(),
                begins,
                recorded: tell,
            });
            if !ordered {
                // The keeper ended (the shard finished and went back): nothing to move.
                continue;
            }
            held.gate.revoke();
            held.acks.retire();
            held.acks.close();
            held.acks.durability().failed(KinesisError::Superseded {
                stream: self.shared.stream.to_string(),
                shard: shard.clone(),
            });
            tracing::info!(shard = %shard, position = ?start, "subscription moved (seek)");
            self.replace_reader(&shard, acks, reader, gate);
            recorded.push((shard, answer));
        }
        recorded
    }
}

/// A new reader of a held shard at `start`, its first iterator fetched.
async fn open_at(
    shared: Arc<Shared>,
    shard: String,
    start: StartingPoint,
) -> Result<NewReader, KinesisError> {
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

//! Moving a running subscription: the coordinator's side of [`Seeker`](crate::Seeker).

use std::sync::Arc;

use super::{Control, Coordinator};
use crate::ack::ShardAcks;
use crate::error::KinesisError;
use crate::position::{KinesisPosition, StartingPoint};
use crate::shard::ShardReader;
use crate::subscription::gate::LeaseGate;

impl Coordinator {
    pub(super) async fn on_control(&mut self, control: Control) {
        match control {
            Control::Seek(to, reply) => {
                let result = self.seek(to).await;
                let _ = reply.send(result);
            }
        }
    }

    /// Moves the held shards `to` names: every held shard for a position of every shard
    /// (horizon, latest, a timestamp), one shard for a sequence number. The new readers fetch
    /// their first iterators before anything moves, so a position the service refuses leaves
    /// every shard where it was. Each moved shard starts a fresh ledger: deliveries handed out
    /// before the seek no longer count towards its checkpoint, and what the old reader had
    /// buffered is dropped.
    async fn seek(&mut self, to: KinesisPosition) -> Result<(), KinesisError> {
        let targets: Vec<(String, StartingPoint)> = match &to {
            KinesisPosition::Sequence { shard, .. } => {
                if !self.held.contains_key(shard) {
                    return Err(KinesisError::SeekRefused {
                        stream: self.stream.to_string(),
                        position: format!("{to:?}"),
                        reason: format!(
                            "this subscription does not read shard {shard} (it reads {:?}); \
                             seek to a record of a shard it reads, or to a position of every \
                             shard (horizon, latest, a timestamp)",
                            self.held.keys().collect::<Vec<_>>()
                        ),
                    });
                }
                to.for_shard(shard)
                    .map(|start| vec![(shard.clone(), start)])
                    .unwrap_or_default()
            }
            _ => self
                .held
                .keys()
                .filter_map(|shard| to.for_shard(shard).map(|start| (shard.clone(), start)))
                .collect(),
        };
        let mut opened = Vec::with_capacity(targets.len());
        for (shard, start) in targets {
            let acks = ShardAcks::new(self.stream.clone(), Arc::from(shard.as_str()), None);
            let mut reader =
                ShardReader::new(self.api.clone(), self.stream.clone(), shard.as_str())
                    .settings(self.config.read.clone())
                    .settled(acks.settled_position())
                    .open(start.clone())?;
            match tokio::time::timeout(self.config.call_timeout(), reader.try_prime()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(KinesisError::Service {
                        operation: crate::error::Operation::GetShardIterator,
                        stream: self.stream.to_string(),
                        message: format!(
                            "no answer within {:?}; the subscription did not move",
                            self.config.call_timeout()
                        ),
                    });
                }
            }
            opened.push((shard, start, acks, reader));
        }
        for (shard, start, acks, reader) in opened {
            // The shard may have been dropped while the readers opened (a lost lease).
            let Some(old) = self.held.remove(&shard) else {
                continue;
            };
            old.gate.revoke();
            old.acks.retire();
            old.finish_watch.abort();
            let gate = Arc::new(LeaseGate::successor(&old.gate));
            tracing::info!(shard = %shard, position = ?start, "subscription moved (seek)");
            self.install(shard, old.lease, acks, reader, gate, old.written);
        }
        Ok(())
    }
}

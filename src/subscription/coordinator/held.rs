//! The shards being read: starting a taken shard (its pump and keeper), tearing one
//! down (written once, in `detach`), and what their pumps and keepers report.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::keeper::{Keeper, KeeperId, Report};
use super::take::Taken;
use super::{Command, Coordinator, Held};
use crate::ack::ShardAcks;
use crate::lease::{Lease, LeaseError};
use crate::position::Checkpoint;
use crate::shard::ShardStream;
use crate::subscription::gate::LeaseGate;
use crate::subscription::pump::{PumpEnd, PumpEvent, ShardPump};

impl Coordinator {
    /// Starts reading a taken shard: its pump goes to the subscription's stream, its keeper
    /// keeps the lease.
    pub(super) fn install(&mut self, shard: String, taken: Taken) {
        let Taken {
            lease,
            reader,
            acks,
            sent,
            written,
            start,
        } = taken;
        if lease.parents.is_empty() {
            tracing::info!(shard = %shard, position = ?start, "lease taken, reading");
        } else {
            tracing::info!(shard = %shard, parents = ?lease.parents, position = ?start, "lease taken; child started after its parents");
        }
        let anchor = (self.shared.config.group.as_ref())
            .map(|group| (group.gate().clone(), self.instance.group_epoch));
        let gate = Arc::new(
            LeaseGate::new(
                sent,
                self.config().give_up_after(),
                self.shared.worker_gate.clone(),
            )
            .anchored(anchor),
        );
        self.start_reading(shard, lease, written, acks, reader, gate);
    }

    pub(super) fn start_reading(
        &mut self,
        shard: String,
        lease: Lease,
        written: Option<Checkpoint>,
        acks: Arc<ShardAcks>,
        reader: ShardStream,
        gate: Arc<LeaseGate>,
    ) {
        let keeper = Keeper::spawn(
            &self.shared,
            lease,
            written,
            acks.clone(),
            gate.clone(),
            self.inbox.reports_tx.clone(),
        );
        let hang_up = reader.hang_up();
        let pump = self.pump(reader, &acks, &gate);
        let held = Held {
            gate,
            acks,
            keeper,
            hang_up,
        };
        self.shards.held.insert(shard.clone(), held);
        self.shared.leases.held(self.shards.held.len());
        let _ = self.outbox.commands.send(Command::Add(shard, pump));
    }

    /// The stream of deliveries of a shard's reader, behind its gate.
    pub(super) fn pump(
        &self,
        reader: ShardStream,
        acks: &Arc<ShardAcks>,
        gate: &Arc<LeaseGate>,
    ) -> Box<ShardPump> {
        Box::new(ShardPump::new(
            reader,
            acks.clone(),
            gate.clone(),
            self.config().max_in_flight,
            self.inbox.events_tx.clone(),
        ))
    }

    /// A seek's new reader of a held shard takes the old one's place in the stream.
    pub(super) fn replace_reader(
        &mut self,
        shard: &str,
        acks: Arc<ShardAcks>,
        reader: ShardStream,
        gate: Arc<LeaseGate>,
    ) {
        let hang_up = reader.hang_up();
        let pump = self.pump(reader, &acks, &gate);
        if let Some(held) = self.shards.held.get_mut(shard) {
            held.gate = gate;
            held.acks = acks;
            // The old reader's subscription ends now, so the new one may begin.
            if let Some(old) = std::mem::replace(&mut held.hang_up, hang_up) {
                old.hang_up();
            }
        }
        let _ = self
            .outbox
            .commands
            .send(Command::Add(shard.to_owned(), pump));
    }

    /// Stops reading a shard and its keeper without writing anything: the lease is (or may
    /// be) another instance's. Whatever waits for a checkpoint of this shard (an ack sink's
    /// close, a durable flush) is told it will not come, naming the lost lease.
    pub(super) fn forget(&mut self, shard: &str) {
        if let Some(held) = self.detach(shard) {
            held.acks.durability().failed(
                LeaseError::Lost {
                    stream: self.shared.stream.to_string(),
                    shard: shard.to_owned(),
                    owner: self.config().owner.clone(),
                }
                .into(),
            );
            held.keeper.forget();
        }
    }

    /// Stops reading a shard: its gate closes and its pump leaves the stream. The one place a
    /// held shard is torn down; the caller decides what becomes of its lease.
    pub(super) fn detach(&mut self, shard: &str) -> Option<Held> {
        let held = self.shards.held.remove(shard)?;
        self.shared.leases.held(self.shards.held.len());
        held.gate.revoke();
        // A fan-out subscription ends before the lease is written again (released), so the
        // next holder can subscribe at once; the reader itself goes when the stream drops it.
        if let Some(hang_up) = &held.hang_up {
            hang_up.hang_up();
        }
        held.acks.close();
        let _ = self.outbox.commands.send(Command::Remove(shard.to_owned()));
        Some(held)
    }

    /// Stops reading a shard and hands its lease back once in-flight deliveries settle (up to
    /// `wait`), with the checkpoint written first.
    pub(super) fn give_back(&mut self, shard: &str, wait: Duration) {
        if let Some(held) = self.detach(shard) {
            let task = held.keeper.release(wait);
            self.shards.releasing.push((shard.to_owned(), task));
        }
    }

    /// Graceful hand-off: in-flight deliveries get the shutdown timeout.
    pub(super) fn hand_off(&mut self, shard: &str) {
        let wait = self.config().shutdown_timeout;
        self.give_back(shard, wait);
    }

    /// True when `gate` is the one of the shard's current reader.
    pub(super) fn is_current(&self, shard: &str, gate: &Arc<LeaseGate>) -> bool {
        self.shards
            .held
            .get(shard)
            .is_some_and(|held| Arc::ptr_eq(&held.gate, gate))
    }

    /// True when `keeper` is the shard's current keeper.
    fn is_current_keeper(&self, shard: &str, keeper: KeeperId) -> bool {
        (self.shards.held.get(shard)).is_some_and(|held| held.keeper.id() == keeper)
    }

    pub(super) fn on_report(&mut self, report: Report) {
        match report {
            Report::Lost(shard, keeper) => {
                if self.is_current_keeper(&shard, keeper) {
                    self.shared.leases.lost();
                    self.forget(&shard);
                    // The table changed under this instance: list it again rather than at
                    // the next safety scan, so a shard nobody reads is found within a listing.
                    self.list_soon();
                }
            }
            Report::Expired(shard, keeper) => {
                if self.is_current_keeper(&shard, keeper) {
                    self.shared.leases.lost();
                    tracing::error!(shard = %shard, "cannot renew the lease; stopped reading before it can expire for others");
                    self.give_back(&shard, Duration::ZERO);
                }
            }
            Report::Finished(shard, keeper) => {
                if self.is_current_keeper(&shard, keeper)
                    && let Some(held) = self.detach(&shard)
                {
                    // SHARD_END covers every record of the shard, also those a seek that
                    // raced the end read again into a ledger the keeper never took over:
                    // whatever waits for them is done.
                    held.acks.durability().written(u64::MAX);
                    held.keeper.forget();
                }
                // Its children may be eligible now, here and for the others.
                self.list_soon();
                self.move_roster();
            }
            Report::Released(shard) => {
                tracing::debug!(shard = %shard, "handed back; the other instances are told");
                self.move_roster();
            }
        }
    }

    pub(super) fn on_pump_end(&mut self, event: PumpEvent) {
        let shard = event.shard.to_string();
        match event.end {
            PumpEnd::ShardEnd(end) => {
                tracing::info!(
                    shard = %shard,
                    children = ?end.child_shards.iter().map(|c| c.shard_id.as_str()).collect::<Vec<_>>(),
                    "shard read to its end; SHARD_END once everything is settled"
                );
            }
            PumpEnd::LeaseExpired(gate) => {
                // That pump is gone for good, even if a late renewal has reopened the gate
                // since: the shard goes back and is taken again from its checkpoint.
                if self.is_current(&shard, &gate) {
                    self.shared.leases.lost();
                    tracing::error!(shard = %shard, "the lease was not renewed in time; stopped reading before it could expire for others");
                    self.give_back(&shard, Duration::ZERO);
                }
            }
            PumpEnd::Stopped { gate, gave_up } => {
                if !self.is_current(&shard, &gate) {
                    return;
                }
                tracing::warn!(shard = %shard, "reader stopped; releasing the lease so the shard is taken again");
                if gave_up {
                    self.instance
                        .health
                        .reader_gave_up(self.shared.probe.count(), Instant::now());
                }
                self.give_back(&shard, Duration::ZERO);
            }
        }
    }
}

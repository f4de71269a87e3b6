//! [`Keeper`]: one task per held shard that alone writes the shard's lease row. It renews the
//! lease on its own schedule, writes the checkpoint at most once per checkpoint interval,
//! writes SHARD_END and releases once the shard is finished, and hands the shard back when
//! asked. Renewals never wait for other work: a slow listing, other shards' takes or
//! checkpoint writes cannot delay them.
//!
//! Every write is conditional on the counter of the previous one, and only this task writes
//! the row while the shard is held, so its writes never race each other.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, interval_at, sleep, sleep_until};

use super::outcome::ReadBack;
use super::shared::{ReleaseTally, Shared};
use crate::ack::ShardAcks;
use crate::error::KinesisError;
use crate::lease::{Lease, LeaseError, SharedLeaseStore};
use crate::position::Checkpoint;
use crate::subscription::gate::LeaseGate;

/// How often a release waiting for in-flight deliveries looks again.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// What a keeper tells the coordinator on its own.
#[derive(Debug)]
pub(crate) enum Report {
    /// Another instance took the lease (a conditional write failed): this keeper has
    /// stopped.
    Lost(Arc<str>, KeeperId),
    /// The lease could not be renewed for two thirds of the lease duration: the shard's
    /// reader stopped at that deadline. This keeper waits to be told what to do.
    Expired(Arc<str>, KeeperId),
    /// The shard is finished: SHARD_END is written and the lease released; this keeper has
    /// stopped.
    Finished(Arc<str>, KeeperId),
    /// The shard was handed back as ordered: checkpoint written, lease released.
    Released(Arc<str>),
}

/// What the coordinator tells a keeper.
pub(crate) enum Order {
    /// Stop: wait up to `wait` for in-flight deliveries (renewing meanwhile), write the
    /// checkpoint, release the lease.
    Release { wait: Duration },
    /// The shard's reader moved (a seek): follow this ledger and gate from now on, and record
    /// where the new reader begins. Answers whether it was recorded.
    Moved {
        acks: Arc<ShardAcks>,
        gate: Arc<LeaseGate>,
        begins: Checkpoint,
        recorded: oneshot::Sender<bool>,
    },
}

/// Timings a keeper works by.
#[derive(Debug, Clone)]
struct Timing {
    renew_every: Duration,
    checkpoint_every: Duration,
}

/// Which keeper a report comes from. A keeper's reader may change under it (a seek gives
/// it a new ledger and gate), so reports name the keeper, not the reader: a report of a
/// keeper that is not the shard's current one is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeeperId(u64);

impl KeeperId {
    fn next() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Self(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// The coordinator's handle on a keeper.
#[derive(Debug)]
pub(crate) struct Keeper {
    id: KeeperId,
    orders: UnboundedSender<Order>,
    task: JoinHandle<()>,
}

impl Keeper {
    /// Starts keeping `lease` (as last written; `gate` times it), whose ledger is `acks` and
    /// whose checkpoint in the row is `written`.
    pub(crate) fn spawn(
        shared: &Shared,
        lease: Lease,
        written: Option<Checkpoint>,
        acks: Arc<ShardAcks>,
        gate: Arc<LeaseGate>,
        reports: UnboundedSender<Report>,
    ) -> Self {
        let (orders, inbox) = unbounded_channel();
        let id = KeeperId::next();
        let task = KeeperTask {
            id,
            shard: acks.shard().clone(),
            store: shared.store.clone(),
            lease,
            written,
            acks,
            gate,
            timing: Timing {
                renew_every: shared.config.renew_interval(),
                checkpoint_every: shared.config.checkpoint_interval,
            },
            permits: shared.permits.clone(),
            tally: shared.releases.clone(),
            leases: shared.leases.clone(),
            reported: crate::ack::AckCounts::default(),
            reports,
            flush_due: false,
            finished: false,
            expired: false,
            last_error: None,
            taken_by: None,
            current_since: Instant::now(),
        };
        Self {
            id,
            orders,
            task: tokio::spawn(task.run(inbox)),
        }
    }

    /// The keeper's identity in its reports.
    pub(crate) fn id(&self) -> KeeperId {
        self.id
    }

    /// Hands the shard back (see [`Order::Release`]); the returned task ends when it is done.
    pub(crate) fn release(self, wait: Duration) -> JoinHandle<()> {
        let _ = self.orders.send(Order::Release { wait });
        self.task
    }

    /// Stops at once without writing anything: the lease is not this instance's any more.
    pub(crate) fn forget(self) {
        self.task.abort();
    }

    /// Sends an order; false when the keeper has stopped.
    pub(crate) fn order(&self, order: Order) -> bool {
        self.orders.send(order).is_ok()
    }
}

struct KeeperTask {
    id: KeeperId,
    shard: Arc<str>,
    store: SharedLeaseStore,
    lease: Lease,
    written: Option<Checkpoint>,
    acks: Arc<ShardAcks>,
    gate: Arc<LeaseGate>,
    timing: Timing,
    permits: Arc<Semaphore>,
    /// Counts how hand-backs went (for the subscription's stop log).
    tally: Arc<ReleaseTally>,
    reports: UnboundedSender<Report>,
    /// A checkpoint write is due (the interval passed, or the shard finished).
    flush_due: bool,
    /// The ledger says the shard is finished.
    finished: bool,
    /// The coordinator was told the lease ran out.
    expired: bool,
    /// The last failure of a write to the row, until a checkpoint write succeeds: why nothing
    /// more is checkpointed when the keeper ends (else it stopped).
    last_error: Option<LeaseError>,
    /// Who holds the lease now, as read back after a write answered lost.
    taken_by: Option<String>,
    /// Counts hand-backs and how long each took.
    leases: crate::telemetry::LeaseMetrics,
    /// The ledger's counts as last reported to the metrics.
    reported: crate::ack::AckCounts,
    /// When the written checkpoint last covered everything settled (the checkpoint age
    /// counts from there).
    current_since: Instant,
}

/// How a write went.
enum Wrote {
    Yes,
    Lost,
    Failed,
}

impl Wrote {
    fn is_lost(&self) -> bool {
        matches!(self, Self::Lost)
    }
}

/// However the keeper ends (its work done, aborted, or a panic in a lease-store call it made),
/// nothing settled afterwards is checkpointed by it: whoever waits for a checkpoint (an ack
/// sink's close, a durable flush) is told so instead of asking for a write for ever. The ends
/// that say it themselves came first, and the first word stays.
impl Drop for KeeperTask {
    fn drop(&mut self) {
        self.no_more_writes();
    }
}

impl KeeperTask {
    async fn run(mut self, mut inbox: UnboundedReceiver<Order>) {
        let now = Instant::now();
        // The first renewal is due a renewal interval after the last write that renewed the
        // lease was sent (the take, or the recorded start), not after this task started: on
        // a slow table the take, the first iterator and the recorded start take a while, and
        // the gate closes two thirds of the lease duration after that write.
        let first_renewal =
            now.checked_sub(self.gate.since_renewed()).unwrap_or(now) + self.timing.renew_every;
        let mut renew = interval_at(first_renewal, self.timing.renew_every);
        let mut checkpoint = interval_at(
            now + self.timing.checkpoint_every,
            self.timing.checkpoint_every,
        );
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        checkpoint.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let deadline = self.gate.deadline();
            let acks = self.acks.clone();
            let stop = tokio::select! {
                biased;
                order = inbox.recv() => self.on_order(order).await,
                _ = renew.tick() => {
                    self.report_ledger();
                    match self.renew().await {
                        Wrote::Lost => self.lost(),
                        // Tried again after half an interval, not a whole one: the gate closes
                        // two renewal intervals after the last success, so a single failure must
                        // not leave the next try at that very moment.
                        Wrote::Failed => {
                            renew.reset_after(self.timing.renew_every / 2);
                            false
                        }
                        Wrote::Yes => false,
                    }
                }
                _ = sleep_until(deadline), if !self.expired => self.check_expiry(),
                // Written at once, then (should that fail) at each checkpoint interval.
                _ = acks.finished(), if !self.finished => {
                    self.finished = true;
                    self.flush_due = true;
                    false
                }
                // An ack sink waits for durability: write now rather than at the interval.
                _ = acks.durability().flush_wanted(), if !self.flush_due => {
                    self.flush_due = true;
                    false
                }
                _ = checkpoint.tick(), if !self.flush_due => {
                    self.flush_due = true;
                    false
                }
                permit = self.permits.clone().acquire_owned(), if self.flush_due => {
                    self.flush_due = false;
                    let wrote = self.flush().await;
                    drop(permit);
                    self.after_flush(wrote).await
                }
            };
            if stop {
                return;
            }
        }
    }

    /// Carries out an order; true once the keeper is done.
    async fn on_order(&mut self, order: Option<Order>) -> bool {
        match order {
            None => {
                self.no_more_writes();
                true
            }
            Some(Order::Release { wait }) => {
                self.release(wait).await;
                true
            }
            Some(Order::Moved {
                acks,
                gate,
                begins,
                recorded,
            }) => {
                // What the old ledger counted is reported; the new one counts from zero.
                self.report_ledger();
                self.reported = crate::ack::AckCounts::default();
                self.acks = acks;
                self.gate = gate;
                self.flush_due = false;
                self.finished = false;
                self.expired = false;
                let wrote = self.write(begins).await;
                let _ = recorded.send(matches!(wrote, Wrote::Yes));
                wrote.is_lost() && self.lost()
            }
        }
    }

    /// Tells the coordinator once the lease ran out without a renewal.
    fn check_expiry(&mut self) -> bool {
        if self.gate.is_expired() {
            self.expired = true;
            self.no_more_writes();
            let _ = self
                .reports
                .send(Report::Expired(self.shard.clone(), self.id));
        }
        false
    }

    /// After a checkpoint write: the end of a lost lease, or of a finished shard.
    async fn after_flush(&mut self, wrote: Wrote) -> bool {
        match wrote {
            Wrote::Lost => self.lost(),
            Wrote::Yes if self.written == Some(Checkpoint::ShardEnd) => {
                self.finish().await;
                true
            }
            _ => false,
        }
    }

    /// Writes the checkpoint when it moved, and tells the ledger's waiters how far it is
    /// durable.
    async fn flush(&mut self) -> Wrote {
        self.report_ledger();
        let Some((checkpoint, covers)) = self.acks.checkpoint_covering() else {
            self.current_since = Instant::now();
            self.acks.metrics().checkpoint(None, Duration::ZERO);
            return Wrote::Yes;
        };
        let (wrote, written) = if self.written.as_ref() == Some(&checkpoint) {
            (Wrote::Yes, None)
        } else {
            let wrote = self.write(checkpoint).await;
            let ok = matches!(wrote, Wrote::Yes);
            (wrote, Some(ok))
        };
        if matches!(wrote, Wrote::Yes) {
            self.acks.durability().written(covers);
            self.current_since = Instant::now();
        }
        let age = self.current_since.elapsed();
        self.acks.metrics().checkpoint(written, age);
        wrote
    }

    /// Writes `checkpoint` into the row.
    async fn write(&mut self, checkpoint: Checkpoint) -> Wrote {
        let mut sent = Instant::now();
        let mut result = self.store.checkpoint(&self.lease, &checkpoint).await;
        if result.as_ref().is_err_and(LeaseError::is_lost) && self.adopt().await {
            sent = Instant::now();
            result = self.store.checkpoint(&self.lease, &checkpoint).await;
        }
        match result {
            Ok(lease) => {
                tracing::debug!(shard = %self.shard, ?checkpoint, "checkpoint written");
                self.lease = lease;
                self.written = Some(checkpoint);
                // What went wrong before is mended: it is no reason for what comes later.
                self.last_error = None;
                self.gate.renewed(sent);
                Wrote::Yes
            }
            Err(e) if e.is_lost() => {
                self.say_lost("before the checkpoint was written");
                Wrote::Lost
            }
            Err(e) => {
                tracing::warn!(shard = %self.shard, error = %e, "checkpoint write failed; retried at the next interval");
                self.last_error = Some(e);
                Wrote::Failed
            }
        }
    }

    async fn renew(&mut self) -> Wrote {
        let mut sent = Instant::now();
        let since = self.gate.since_renewed();
        let mut result = self.store.renew(&self.lease).await;
        if result.as_ref().is_err_and(LeaseError::is_lost) && self.adopt().await {
            sent = Instant::now();
            result = self.store.renew(&self.lease).await;
        }
        match result {
            Ok(lease) => {
                if since > self.timing.renew_every * 3 / 2 {
                    tracing::warn!(shard = %self.shard, late_by = ?since, "lease renewed late");
                }
                self.lease = lease;
                self.gate.renewed(sent);
                Wrote::Yes
            }
            Err(e) if e.is_lost() => {
                self.say_lost("at its renewal");
                Wrote::Lost
            }
            Err(e) => {
                tracing::warn!(shard = %self.shard, error = %e, "lease renewal failed; retrying");
                self.last_error = Some(e);
                Wrote::Failed
            }
        }
    }

    /// After a write answered lost: reads the row back, and when it still names this
    /// instance (an earlier write of this keeper whose answer was lost had been applied, see
    /// [`outcome`](super::outcome)), carries on from the row as it is. True when it does.
    async fn adopt(&mut self) -> bool {
        let Some(owner) = self.lease.owner.clone() else {
            return false;
        };
        match super::outcome::read_back(&self.store, &self.lease, &owner).await {
            ReadBack::Ours(row) => {
                tracing::info!(
                    shard = %self.shard,
                    "a lease write whose outcome was unknown had been applied; carrying on from \
                     the row as written"
                );
                self.lease = row;
                true
            }
            ReadBack::Theirs(owner) => {
                self.taken_by = owner;
                false
            }
            ReadBack::Unknown => false,
        }
    }

    /// Says who took the lease, as read back: a reset by the `kinesis-dataflow` tool, or
    /// another instance.
    fn say_lost(&self, when: &str) {
        match self.taken_by.as_deref() {
            Some(owner) if owner.starts_with(crate::lease::RESET_OWNER_PREFIX) => tracing::warn!(
                shard = %self.shard,
                by = owner,
                "lease taken by a reset (`kinesis-dataflow reset --force`), found {when}; stopped \
                 reading: the shard is read again from the reset position once the tool releases it"
            ),
            Some(owner) => tracing::warn!(
                shard = %self.shard,
                by = owner,
                "lease lost to another instance, found {when}; stopped reading"
            ),
            None => tracing::warn!(
                shard = %self.shard,
                "lease lost (released or taken by another), found {when}; stopped reading"
            ),
        }
    }

    /// Adds what the ledger counted since the last report to the metrics.
    fn report_ledger(&mut self) {
        let now = self.acks.counts();
        self.acks.metrics().ledger(&self.reported, &now);
        self.reported = now;
    }

    /// Tells the coordinator the lease is gone; the keeper is done (true).
    fn lost(&mut self) -> bool {
        self.report_ledger();
        self.acks.durability().failed(self.lost_error().into());
        let _ = self.reports.send(Report::Lost(self.shard.clone(), self.id));
        true
    }

    /// The lease of this shard is another instance's now.
    fn lost_error(&self) -> LeaseError {
        LeaseError::Lost {
            stream: self.lease.stream.clone(),
            shard: self.lease.shard_id.clone(),
            owner: self.lease.owner.clone().unwrap_or_default(),
        }
    }

    /// Nothing settled from now on will be checkpointed by this keeper: the table could not
    /// be written (its last error), or the keeper stopped.
    fn no_more_writes(&self) {
        let error = match &self.last_error {
            Some(e) => KinesisError::NotCheckpointed {
                stream: self.lease.stream.clone(),
                shard: self.lease.shard_id.clone(),
                source: Box::new(e.clone()),
            },
            None => KinesisError::Stopped {
                stream: self.lease.stream.clone(),
            },
        };
        self.acks.durability().failed(error);
    }

    /// SHARD_END is written: the lease goes back, and the coordinator starts the children.
    async fn finish(&mut self) {
        tracing::info!(shard = %self.shard, "shard finished (SHARD_END checkpointed)");
        // Counted like a hand-back: a stop that meets this keeper finished counts it so.
        let released = self.give_back().await;
        self.tally.count(released);
        let _ = self
            .reports
            .send(Report::Finished(self.shard.clone(), self.id));
    }

    /// Waits up to `wait` for in-flight deliveries, renewing meanwhile, then writes the
    /// checkpoint and releases the lease.
    async fn release(&mut self, wait: Duration) {
        let ordered = Instant::now();
        let deadline = ordered + wait;
        while self.acks.in_flight() > 0 && Instant::now() < deadline {
            sleep(SETTLE_POLL).await;
            if self.gate.since_renewed() >= self.timing.renew_every && self.renew().await.is_lost()
            {
                // Whoever waits for the final checkpoint learns it will not come.
                self.acks.durability().failed(self.lost_error().into());
                self.tally.count(false);
                return;
            }
        }
        let in_flight = self.acks.in_flight();
        if in_flight > 0 {
            tracing::warn!(shard = %self.shard, in_flight, "in-flight deliveries not settled in time; they will be redelivered");
        }
        let released = match self.flush().await {
            Wrote::Yes => {
                let released = self.give_back().await;
                if released {
                    self.leases.handed_off(ordered.elapsed());
                    let _ = self.reports.send(Report::Released(self.shard.clone()));
                }
                released
            }
            Wrote::Lost => {
                tracing::warn!(shard = %self.shard, "the lease was lost before the final checkpoint; its unsettled records are read again by the new owner");
                self.acks.durability().failed(self.lost_error().into());
                false
            }
            Wrote::Failed => {
                tracing::warn!(shard = %self.shard, "final checkpoint failed; the lease expires instead of being released");
                false
            }
        };
        self.tally.count(released);
        // Whatever is settled later (after the lease went back) is not this keeper's to write.
        self.no_more_writes();
    }

    /// Releases the lease; true when that worked.
    async fn give_back(&mut self) -> bool {
        let counts = self.acks.counts();
        let mut result = self.store.release(&self.lease).await;
        if result.as_ref().is_err_and(LeaseError::is_lost) && self.adopt().await {
            result = self.store.release(&self.lease).await;
        }
        match result {
            Ok(_) => {
                tracing::info!(
                    shard = %self.shard,
                    acked = counts.acked,
                    skipped = counts.skipped,
                    dropped = counts.dropped,
                    abandoned = counts.abandoned,
                    "lease released"
                );
                true
            }
            Err(e) => {
                tracing::warn!(shard = %self.shard, error = %e, "lease release failed; it expires instead");
                false
            }
        }
    }
}

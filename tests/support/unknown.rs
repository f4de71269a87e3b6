//! Writes whose outcome is unknown, as a lease-store layer: a write of one kind is applied to
//! the table and then answered as if it had not been seen to succeed (a timeout, a 5xx, or the
//! SDK's retry of the applied write failing its own condition), or answered late. The fault
//! class the emulators cannot show: DynamoDB applies a write and the answer is lost on the way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{Lease, LeaseError, LeaseFuture, SharedLeaseStore};
use kinesis_dataflow::position::Checkpoint;

/// The kinds of lease-table write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Taking a shard's lease.
    Take,
    /// Renewing a shard's lease.
    Renew,
    /// Writing a shard's checkpoint (a sequence number, or where a reader began).
    Checkpoint,
    /// Writing SHARD_END.
    ShardEnd,
    /// Releasing a shard's lease.
    Release,
    /// Creating, renewing or taking an instance's worker row.
    WorkerRow,
    /// Deleting an instance's worker row.
    WorkerDelete,
    /// Moving the roster row.
    RosterMove,
}

impl Write {
    /// Every kind, for a matrix.
    pub const ALL: [Write; 8] = [
        Write::Take,
        Write::Renew,
        Write::Checkpoint,
        Write::ShardEnd,
        Write::Release,
        Write::WorkerRow,
        Write::WorkerDelete,
        Write::RosterMove,
    ];

    /// The kind of `call`, `None` for a read (or a write of no kind here).
    pub fn of(call: &LeaseCall<'_>) -> Option<Write> {
        let worker = |lease: &Lease| lease.shard_id.starts_with("worker:");
        let roster = |lease: &Lease| lease.shard_id == "worker:";
        Some(match call {
            LeaseCall::Take { lease, .. } if roster(lease) => Write::RosterMove,
            LeaseCall::Create { lease } if roster(lease) => Write::RosterMove,
            LeaseCall::Take { lease, .. }
            | LeaseCall::Renew { lease }
            | LeaseCall::Create { lease }
                if worker(lease) =>
            {
                Write::WorkerRow
            }
            LeaseCall::Delete { lease } if worker(lease) => Write::WorkerDelete,
            LeaseCall::Take { .. } => Write::Take,
            LeaseCall::Renew { .. } => Write::Renew,
            LeaseCall::Checkpoint { checkpoint, .. } => match checkpoint {
                Checkpoint::ShardEnd => Write::ShardEnd,
                _ => Write::Checkpoint,
            },
            LeaseCall::Release { lease } if !worker(lease) => Write::Release,
            _ => return None,
        })
    }
}

/// Applied takes of each shard's lease, by shard id (shared by the instances' layers).
pub type Takes = Arc<Mutex<BTreeMap<String, u64>>>;

/// How an applied write is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// No answer within the client's time limit.
    Timeout,
    /// A 5xx: the service says it failed, but it had applied the write.
    ServerError,
    /// The SDK retried after a lost answer; the retry failed its condition (the first try
    /// had moved the counter), so the caller sees a lost lease.
    RetriedLost,
    /// Success, this long after the write was applied.
    Late(Duration),
}

impl Answer {
    /// Every answer, for a matrix (late by `late`).
    pub fn all(late: Duration) -> [Answer; 4] {
        [
            Answer::Timeout,
            Answer::ServerError,
            Answer::RetriedLost,
            Answer::Late(late),
        ]
    }
}

/// Applies every `every`-th write of kind `write`, then answers it with `answer`.
#[derive(Debug)]
pub struct Unknown {
    write: Write,
    answer: Answer,
    every: u64,
    seen: AtomicU64,
    injected: AtomicU64,
    /// Applied takes of each shard's lease (answered well or not), to count holder changes.
    takes: Takes,
}

impl Unknown {
    /// The layer; `takes` counts every applied take of a shard's lease, by shard.
    pub fn new(write: Write, answer: Answer, every: u64, takes: Takes) -> Self {
        Self {
            write,
            answer,
            every: every.max(1),
            seen: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            takes,
        }
    }

    /// How many answers were lost or late so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// `inner` seen through a new layer.
    pub fn store(self: &Arc<Self>, inner: SharedLeaseStore) -> SharedLeaseStore {
        Arc::new(LayeredStore::new(inner, self.clone()))
    }
}

impl LeaseLayer for Unknown {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let kind = Write::of(&call);
        let hit = kind == Some(self.write)
            && (self.seen.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(self.every);
        let row = match call {
            LeaseCall::Take { lease, .. }
            | LeaseCall::Renew { lease }
            | LeaseCall::Checkpoint { lease, .. }
            | LeaseCall::Release { lease }
            | LeaseCall::Delete { lease }
            | LeaseCall::Create { lease } => Some((lease.stream.clone(), lease.shard_id.clone())),
            _ => None,
        };
        let (stream, shard) = row.unwrap_or_default();
        let take = kind == Some(Write::Take);
        let owner = match call {
            LeaseCall::Take { owner, .. } => owner.to_owned(),
            _ => String::new(),
        };
        let operation = call.operation();
        Box::pin(async move {
            let result = next.await;
            if take && result.is_ok() {
                *self.takes.lock().unwrap().entry(shard.clone()).or_default() += 1;
            }
            if !hit || result.is_err() {
                return result;
            }
            self.injected.fetch_add(1, Ordering::SeqCst);
            match self.answer {
                Answer::Late(by) => {
                    tokio::time::sleep(by).await;
                    result
                }
                Answer::Timeout => Err(LeaseError::Unavailable {
                    table: "(unknown outcome)".into(),
                    operation,
                    message: "no answer within the call timeout (the write was applied)".into(),
                    source: None,
                }),
                Answer::ServerError => Err(LeaseError::Unavailable {
                    table: "(unknown outcome)".into(),
                    operation,
                    message: "500 InternalServerError (the write was applied)".into(),
                    source: None,
                }),
                Answer::RetriedLost => Err(LeaseError::Lost {
                    stream,
                    shard,
                    owner,
                }),
            }
        })
    }
}

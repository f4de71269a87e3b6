//! The in-process mode (feature `testing`): `TestApp::start(service(KinesisBroker::new()))`
//! runs the production broker on the in-memory transport, with no server.
//!
//! [`KinesisBroker`](super::KinesisBroker) implements the framework's `InProcess` transition
//! and [`ConnectedKinesis`](super::ConnectedKinesis) its `TestableBroker` view. What runs in
//! process is the production pipeline: the same subscriber, publisher, message, core
//! subscription, leases and checkpoints, over a [`MemoryKinesis`] and a
//! [`MemoryLeaseStore`](crate::MemoryLeaseStore) that every clone of the broker shares (the
//! framework's suites reconnect "to the same broker" that way). The settings are the broker's
//! and the descriptors' own, with two differences, each a gap the live tests cover:
//!
//! * **One shard per stream.** A stream created in process has one shard whatever
//!   `create_if_missing(n)` says, so every record is ordered against every other (the spec's
//!   rule for a TestApp test). Shard distribution and per-key order across shards are covered
//!   by the live tests on kinesis-local (`tests/broker_live.rs`, `tests/subscription_local.rs`).
//! * **Leases never expire.** A test moves a paused clock in jumps (`TestApp::advance`), and a
//!   jump longer than two thirds of the lease duration would look like a frozen process that
//!   must stop reading. In process the lease duration is a day (the longest the core
//!   allows), so only a jump of more than 16 hours can. Expiry,
//!   takeover and fencing are covered by `tests/subscription_memory.rs` and
//!   `tests/subscription_local.rs`.
//!
//! The harness counts deliveries through a coordinator: a record stored while a subscription
//! of its stream is open is counted before the publish (or `inject`) that stored it returns,
//! and released once when its delivery is dropped, whatever settled it. A KPL aggregate counts
//! as its user records for a subscription that de-aggregates (each is a delivery of its own)
//! and as nothing for one that does not (it skips the aggregate); the publish log lists its
//! user records, each as the message it carries. A requeue counts it
//! again before `nack` returns; a delayed one when its timer falls due (the record then waits
//! for that moment, as it does on a running clock).

#[cfg(feature = "testing")]
mod imp;

use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use crate::api::MemoryKinesis;

#[cfg(feature = "testing")]
pub(crate) use imp::{Accounting, Counted, World};

/// Never built without the `testing` feature: a delivery the harness counts.
#[cfg(not(feature = "testing"))]
#[derive(Debug)]
pub(crate) enum Counted {}

/// What a delivery is, for the harness.
pub(crate) enum Taken {
    /// Not counted.
    Uncounted,
    /// Counted; released when dropped.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Counted(Counted),
    /// A delayed redelivery whose time has not come.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Park,
}

/// What a connection holds for the in-process test harness: the in-memory transport (to
/// inject records into) and, connected in process, the delivery accounting. Without the
/// `testing` feature it holds nothing and every call is a no-op, so the broker's files need no
/// `cfg`.
#[derive(Debug, Default)]
pub(crate) struct Harness {
    /// The in-memory transport, when the connection is on it.
    #[cfg(feature = "testing")]
    pub(crate) memory: Option<MemoryKinesis>,
    /// The delivery accounting, when connected in process.
    #[cfg(feature = "testing")]
    pub(crate) accounting: Option<Arc<Accounting>>,
}

impl Harness {
    /// A connection's harness, on the in-memory transport `memory` (if it is).
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    pub(crate) fn on(memory: Option<MemoryKinesis>) -> Self {
        Self {
            #[cfg(feature = "testing")]
            memory,
            #[cfg(feature = "testing")]
            accounting: None,
        }
    }

    /// True when connected in process.
    pub(crate) fn in_process(&self) -> bool {
        #[cfg(feature = "testing")]
        return self.accounting.is_some();
        #[cfg(not(feature = "testing"))]
        false
    }

    /// A subscription of `stream` opened; `deaggregate`: it hands out the user records of KPL
    /// aggregates one by one.
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    pub(crate) fn opened(&self, stream: &str, deaggregate: bool) {
        #[cfg(feature = "testing")]
        if let Some(accounting) = &self.accounting {
            accounting.opened(stream, deaggregate);
        }
    }

    /// A subscription of `stream` closed.
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    pub(crate) fn closed(&self, stream: &str) {
        #[cfg(feature = "testing")]
        if let Some(accounting) = &self.accounting {
            accounting.closed(stream);
        }
    }

    /// A delivery is about to be handed out: counted, or parked until its time.
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    pub(crate) fn take(&self, stream: &str, shard: &Arc<str>, seq: &str, waker: &Waker) -> Taken {
        #[cfg(feature = "testing")]
        if let Some(accounting) = &self.accounting {
            return accounting.take(stream, shard, seq, waker);
        }
        Taken::Uncounted
    }

    /// A delivery was sent back for redelivery after `delay` (`None`: the backoff).
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    pub(crate) fn requeued(
        &self,
        stream: &str,
        shard: &Arc<str>,
        seq: &str,
        delay: Option<Duration>,
    ) {
        #[cfg(feature = "testing")]
        if let Some(accounting) = &self.accounting {
            match delay {
                None => accounting.requeued(stream, shard, seq),
                Some(delay) => accounting.requeue_after(stream, shard, seq, delay),
            }
        }
    }
}

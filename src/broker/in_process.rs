//! The in-process mode (feature `testing`): `TestApp::start(service(KinesisBroker::new()))`
//! runs the production broker on the in-memory transport, with no server.
//!
//! [`KinesisBroker`](super::KinesisBroker) implements the framework's `InProcess` transition
//! and [`ConnectedKinesis`](super::ConnectedKinesis) its `TestableBroker` view. What runs in
//! process is the production pipeline: the same subscriber, publisher, message, core
//! subscription, leases and checkpoints, over a [`MemoryKinesis`](crate::MemoryKinesis) and a
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
//! and released once when its delivery is dropped, whatever settled it. A requeue counts it
//! again before `nack` returns; a delayed one when its timer falls due (the record then waits
//! for that moment, as it does on a running clock).

#[cfg(feature = "testing")]
mod imp;

#[cfg(feature = "testing")]
pub(crate) use imp::{Accounting, Counted, Taken, World};

#[cfg(not(feature = "testing"))]
mod disabled {
    //! Without the `testing` feature nothing is counted; the types exist so the call sites
    //! need no `cfg`.

    use std::sync::Arc;
    use std::task::Waker;
    use std::time::Duration;

    /// Never built without the feature.
    #[derive(Debug)]
    pub(crate) enum Accounting {}

    /// Never built without the feature.
    #[derive(Debug)]
    pub(crate) enum Counted {}

    /// What a delivery is, for the harness.
    #[allow(dead_code)]
    pub(crate) enum Taken {
        /// Not counted.
        Uncounted,
        /// Counted; released when dropped.
        Counted(Counted),
        /// A delayed redelivery whose time has not come.
        Park,
    }

    impl Accounting {
        pub(crate) fn take(&self, _: &str, _: &Arc<str>, _: &str, _: &Waker) -> Taken {
            match *self {}
        }
        pub(crate) fn requeued(&self, _: &str, _: &Arc<str>, _: &str) {
            match *self {}
        }
        pub(crate) fn requeue_after(&self, _: &str, _: &Arc<str>, _: &str, _: Duration) {
            match *self {}
        }
        pub(crate) fn opened(&self, _: &str) {
            match *self {}
        }
        pub(crate) fn closed(&self, _: &str) {
            match *self {}
        }
    }
}

#[cfg(not(feature = "testing"))]
pub(crate) use disabled::{Accounting, Counted, Taken};

//! A lease store as one instance sees it, which the test can cut off from the table while
//! other instances still reach it: the fault of an instance partitioned from DynamoDB. A
//! lease-store layer (`kinesis_dataflow::lease::layer`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseError, LeaseFuture, SharedLeaseStore};

/// The switch and the count behind a [`CutOff`] view.
#[derive(Debug, Default)]
pub struct Switch {
    /// While set, every call fails as if the store could not be reached.
    pub down: AtomicBool,
    /// Checkpoint writes this instance got through.
    pub checkpoints: AtomicU64,
}

impl LeaseLayer for Switch {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                return Err(LeaseError::Unavailable {
                    table: "(cut off)".into(),
                    operation: call.operation(),
                    message: "connection refused".into(),
                    source: None,
                });
            }
            let result = next.await;
            if matches!(call, LeaseCall::Checkpoint { .. }) && result.is_ok() {
                self.checkpoints.fetch_add(1, Ordering::SeqCst);
            }
            result
        })
    }
}

/// One instance's view of the lease store, which can be cut off while others still reach it.
#[derive(Debug, Clone)]
pub struct CutOff {
    view: Arc<LayeredStore<Arc<Switch>>>,
    /// The switch: `down` and the checkpoint count.
    pub switch: Arc<Switch>,
}

impl CutOff {
    /// A view of `inner` that can be cut off.
    pub fn new(inner: SharedLeaseStore) -> Self {
        let switch = Arc::new(Switch::default());
        Self {
            view: Arc::new(LayeredStore::new(inner, switch.clone())),
            switch,
        }
    }

    /// The view, as the instance's lease store.
    pub fn store(&self) -> SharedLeaseStore {
        self.view.clone()
    }

    /// Cuts the instance off (`true`) or reconnects it.
    pub fn set_down(&self, down: bool) {
        self.switch.down.store(down, Ordering::SeqCst);
    }

    /// Checkpoint writes this instance got through.
    pub fn checkpoints(&self) -> u64 {
        self.switch.checkpoints.load(Ordering::SeqCst)
    }
}

//! A lease store as one instance sees it, which the test can cut off from the table while
//! other instances still reach it: the fault of an instance partitioned from DynamoDB.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kinesis_dataflow::lease::LeaseFuture;
use kinesis_dataflow::{Checkpoint, Lease, LeaseError, LeaseStore, Operation, SharedLeaseStore};

/// One instance's view of the lease store, which can be cut off while others still reach it.
#[derive(Clone)]
pub struct CutOff {
    inner: SharedLeaseStore,
    /// While set, every call fails as if the store could not be reached.
    pub down: Arc<AtomicBool>,
    /// Checkpoint writes this instance got through.
    pub checkpoints: Arc<AtomicU64>,
}

impl std::fmt::Debug for CutOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CutOff")
            .field("down", &self.down)
            .finish_non_exhaustive()
    }
}

impl CutOff {
    /// A view of `inner` that can be cut off.
    pub fn new(inner: SharedLeaseStore) -> Self {
        Self {
            inner,
            down: Arc::default(),
            checkpoints: Arc::default(),
        }
    }

    fn check(&self, operation: &'static str) -> Result<(), LeaseError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(LeaseError::Unavailable {
                table: "(cut off)".into(),
                operation: match operation {
                    "prepare" => Operation::DescribeTable,
                    "list" => Operation::Scan,
                    "create" => Operation::PutItem,
                    "delete" => Operation::DeleteItem,
                    _ => Operation::UpdateItem,
                },
                message: "connection refused".into(),
                source: None,
            });
        }
        Ok(())
    }
}

impl LeaseStore for CutOff {
    fn prepare(&self) -> LeaseFuture<'_, ()> {
        Box::pin(async move {
            self.check("prepare")?;
            self.inner.prepare().await
        })
    }
    fn list<'a>(&'a self, stream: &'a str) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(async move {
            self.check("list")?;
            self.inner.list(stream).await
        })
    }
    fn create<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, bool> {
        Box::pin(async move {
            self.check("create")?;
            self.inner.create(lease).await
        })
    }
    fn take<'a>(&'a self, lease: &'a Lease, owner: &'a str) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.check("take")?;
            self.inner.take(lease, owner).await
        })
    }
    fn renew<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.check("renew")?;
            self.inner.renew(lease).await
        })
    }
    fn checkpoint<'a>(
        &'a self,
        lease: &'a Lease,
        checkpoint: &'a Checkpoint,
    ) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.check("checkpoint")?;
            let written = self.inner.checkpoint(lease, checkpoint).await?;
            self.checkpoints.fetch_add(1, Ordering::SeqCst);
            Ok(written)
        })
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.check("release")?;
            self.inner.release(lease).await
        })
    }
    fn delete<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, ()> {
        Box::pin(async move {
            self.check("delete")?;
            self.inner.delete(lease).await
        })
    }
}

//! A lease store whose calls give up after a time, so that a hung connection cannot stall
//! renewals, the give-up rule, hand-offs or shutdown.

use std::future::Future;
use std::time::Duration;

use crate::error::Operation;
use crate::lease::{Lease, LeaseError, LeaseFuture, LeaseStore, SharedLeaseStore};
use crate::position::Checkpoint;

pub(crate) struct BoundedStore {
    inner: SharedLeaseStore,
    limit: Duration,
}

impl BoundedStore {
    pub(crate) fn new(inner: SharedLeaseStore, limit: Duration) -> Self {
        Self { inner, limit }
    }

    fn bound<'a, T: Send + 'a>(
        &'a self,
        operation: Operation,
        call: impl Future<Output = Result<T, LeaseError>> + Send + 'a,
    ) -> LeaseFuture<'a, T> {
        Box::pin(async move {
            tokio::time::timeout(self.limit, call)
                .await
                .unwrap_or_else(|_| {
                    Err(LeaseError::Unavailable {
                        table: "(lease store)".to_owned(),
                        operation,
                        message: format!("no answer within {:?}", self.limit),
                        source: None,
                    })
                })
        })
    }
}

impl LeaseStore for BoundedStore {
    fn prepare(&self) -> LeaseFuture<'_, ()> {
        // Creating a table may take a while; it happens once, before anything is read.
        self.inner.prepare()
    }

    fn list<'a>(&'a self, stream: &'a str) -> LeaseFuture<'a, Vec<Lease>> {
        self.bound(Operation::Scan, self.inner.list(stream))
    }

    fn create<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, bool> {
        self.bound(Operation::PutItem, self.inner.create(lease))
    }

    fn take<'a>(&'a self, lease: &'a Lease, owner: &'a str) -> LeaseFuture<'a, Lease> {
        self.bound(Operation::UpdateItem, self.inner.take(lease, owner))
    }

    fn renew<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        self.bound(Operation::UpdateItem, self.inner.renew(lease))
    }

    fn checkpoint<'a>(
        &'a self,
        lease: &'a Lease,
        checkpoint: &'a Checkpoint,
    ) -> LeaseFuture<'a, Lease> {
        self.bound(
            Operation::UpdateItem,
            self.inner.checkpoint(lease, checkpoint),
        )
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        self.bound(Operation::UpdateItem, self.inner.release(lease))
    }

    fn delete<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, ()> {
        self.bound(Operation::DeleteItem, self.inner.delete(lease))
    }
}

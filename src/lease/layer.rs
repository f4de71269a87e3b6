//! Layers over the lease store: the same shape as [`crate::api::layer`]. A [`LeaseLayer`] sees
//! each call ([`LeaseCall`]) and the wrapped store's answer before anyone awaits it;
//! [`LayeredStore`] puts one in front of any [`LeaseStore`]. The subscription bounds every
//! call with one (a time limit); tests cut stores off and benchmarks count calls with others.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kinesis_dataflow::lease::LeaseError> {
//! use std::sync::Arc;
//! use kinesis_dataflow::MemoryLeaseStore;
//! use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
//! use kinesis_dataflow::lease::{LeaseError, LeaseFuture, LeaseStore};
//!
//! /// Refuses every write: a read-only view of the table.
//! struct ReadOnly;
//!
//! impl LeaseLayer for ReadOnly {
//!     fn around<'a, T: Send + 'a>(&'a self, call: LeaseCall<'a>, next: LeaseFuture<'a, T>) -> LeaseFuture<'a, T> {
//!         if matches!(call, LeaseCall::List { .. } | LeaseCall::Prepare) {
//!             return next;
//!         }
//!         Box::pin(async move {
//!             Err(LeaseError::Invalid {
//!                 table: "(read-only)".into(),
//!                 operation: call.operation(),
//!                 message: "this view only reads".into(),
//!                 source: None,
//!             })
//!         })
//!     }
//! }
//!
//! let store = LayeredStore::new(Arc::new(MemoryLeaseStore::new()), ReadOnly);
//! assert!(store.list("orders").await?.is_empty());
//! assert!(store.create(&kinesis_dataflow::lease::Lease::new("orders", "s0", vec![])).await.is_err());
//! # Ok(()) }
//! ```

use std::fmt;

use super::{Lease, LeaseFuture, LeaseStore, SharedLeaseStore};
use crate::error::Operation;
use crate::position::Checkpoint;

/// One call of the lease store, with its arguments, as a layer sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum LeaseCall<'a> {
    /// [`LeaseStore::prepare`].
    Prepare,
    /// [`LeaseStore::list`].
    #[non_exhaustive]
    List {
        /// The stream.
        stream: &'a str,
        /// The call the store makes for it ([`LeaseStore::list_operation`]): a Query, or a
        /// Scan of a single-key DynamoDB table.
        operation: Operation,
    },
    /// [`LeaseStore::get`].
    Get {
        /// The stream.
        stream: &'a str,
        /// The ids of the rows read.
        ids: &'a [String],
    },
    /// [`LeaseStore::create`].
    Create {
        /// The row.
        lease: &'a Lease,
    },
    /// [`LeaseStore::take`].
    Take {
        /// The row as the caller saw it.
        lease: &'a Lease,
        /// Who takes it.
        owner: &'a str,
    },
    /// [`LeaseStore::renew`].
    Renew {
        /// The held row.
        lease: &'a Lease,
    },
    /// [`LeaseStore::checkpoint`].
    Checkpoint {
        /// The held row.
        lease: &'a Lease,
        /// What is written.
        checkpoint: &'a Checkpoint,
    },
    /// [`LeaseStore::release`].
    Release {
        /// The held row.
        lease: &'a Lease,
    },
    /// [`LeaseStore::delete`].
    Delete {
        /// The row as the caller saw it.
        lease: &'a Lease,
    },
    /// [`LeaseStore::replace`].
    Replace {
        /// The row as the caller saw it.
        old: &'a Lease,
        /// The row put in its place.
        new: &'a Lease,
    },
}

impl LeaseCall<'_> {
    /// The DynamoDB call the operation makes on [`DynamoLeaseStore`](super::DynamoLeaseStore)
    /// (for errors and IAM actions).
    #[must_use]
    pub fn operation(&self) -> Operation {
        match self {
            Self::Prepare => Operation::DescribeTable,
            Self::List { operation, .. } => *operation,
            Self::Get { .. } => Operation::BatchGetItem,
            Self::Create { .. } | Self::Replace { .. } => Operation::PutItem,
            Self::Delete { .. } => Operation::DeleteItem,
            Self::Take { .. }
            | Self::Renew { .. }
            | Self::Checkpoint { .. }
            | Self::Release { .. } => Operation::UpdateItem,
        }
    }

    /// The store operation's own name (`take`, `checkpoint`, ...).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Prepare => "prepare",
            Self::List { .. } => "list",
            Self::Get { .. } => "get",
            Self::Create { .. } => "create",
            Self::Take { .. } => "take",
            Self::Renew { .. } => "renew",
            Self::Checkpoint { .. } => "checkpoint",
            Self::Release { .. } => "release",
            Self::Delete { .. } => "delete",
            Self::Replace { .. } => "replace",
        }
    }
}

/// Wraps every call of a [`LeaseStore`] (see [`LayeredStore`]).
pub trait LeaseLayer: Send + Sync + 'static {
    /// Wraps one call. `next` is the wrapped store's answer, not started yet: return it as
    /// it is, wrapped, or return something else instead.
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T>;
}

/// A shared layer is a layer: the test or the caller keeps a handle on its state.
impl<L: LeaseLayer> LeaseLayer for std::sync::Arc<L> {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        L::around(self, call, next)
    }
}

/// A [`LeaseStore`] whose every call goes through a [`LeaseLayer`].
pub struct LayeredStore<L> {
    inner: SharedLeaseStore,
    layer: L,
}

impl<L> fmt::Debug for LayeredStore<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayeredStore").finish_non_exhaustive()
    }
}

impl<L: LeaseLayer> LayeredStore<L> {
    /// `inner` behind `layer`.
    pub fn new(inner: SharedLeaseStore, layer: L) -> Self {
        Self { inner, layer }
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }

    /// The store behind the layer.
    pub fn inner(&self) -> &SharedLeaseStore {
        &self.inner
    }
}

impl<L: LeaseLayer> LeaseStore for LayeredStore<L> {
    fn prepare(&self) -> LeaseFuture<'_, ()> {
        self.layer.around(LeaseCall::Prepare, self.inner.prepare())
    }

    fn list<'a>(&'a self, stream: &'a str) -> LeaseFuture<'a, Vec<Lease>> {
        let call = LeaseCall::List {
            stream,
            operation: self.inner.list_operation(),
        };
        self.layer.around(call, self.inner.list(stream))
    }

    fn list_operation(&self) -> Operation {
        self.inner.list_operation()
    }

    fn get<'a>(&'a self, stream: &'a str, ids: &'a [String]) -> LeaseFuture<'a, Vec<Lease>> {
        self.layer
            .around(LeaseCall::Get { stream, ids }, self.inner.get(stream, ids))
    }

    fn create<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, bool> {
        self.layer
            .around(LeaseCall::Create { lease }, self.inner.create(lease))
    }

    fn take<'a>(&'a self, lease: &'a Lease, owner: &'a str) -> LeaseFuture<'a, Lease> {
        self.layer.around(
            LeaseCall::Take { lease, owner },
            self.inner.take(lease, owner),
        )
    }

    fn renew<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        self.layer
            .around(LeaseCall::Renew { lease }, self.inner.renew(lease))
    }

    fn checkpoint<'a>(
        &'a self,
        lease: &'a Lease,
        checkpoint: &'a Checkpoint,
    ) -> LeaseFuture<'a, Lease> {
        let call = LeaseCall::Checkpoint { lease, checkpoint };
        self.layer
            .around(call, self.inner.checkpoint(lease, checkpoint))
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        self.layer
            .around(LeaseCall::Release { lease }, self.inner.release(lease))
    }

    fn delete<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, ()> {
        self.layer
            .around(LeaseCall::Delete { lease }, self.inner.delete(lease))
    }

    fn replace<'a>(&'a self, old: &'a Lease, new: &'a Lease) -> LeaseFuture<'a, Lease> {
        self.layer.around(
            LeaseCall::Replace { old, new },
            self.inner.replace(old, new),
        )
    }
}

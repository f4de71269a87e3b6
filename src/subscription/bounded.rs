//! [`CallTimeout`]: a lease-store layer whose calls give up after a time, so that a hung
//! connection cannot stall renewals, the give-up rule, hand-offs or shutdown; and whose calls
//! all fail once the subscription was aborted, so an aborted subscription writes nothing more,
//! as a crashed process would not (its keepers and jobs may still be running a moment).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::lease::layer::{LeaseCall, LeaseLayer};
use crate::lease::{LeaseError, LeaseFuture};

/// Bounds every lease-store call but `prepare` (creating a table may take a while; it happens
/// once, before anything is read).
#[derive(Debug, Clone)]
pub(crate) struct CallTimeout {
    /// The longest a call may take.
    pub(crate) limit: Duration,
    /// Set by [`Subscription::abort`](super::Subscription::abort): every call fails at once.
    pub(crate) aborted: Arc<AtomicBool>,
}

impl LeaseLayer for CallTimeout {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let operation = call.operation();
        if self.aborted.load(Ordering::Acquire) {
            return Box::pin(async move {
                Err(LeaseError::Unavailable {
                    table: "(lease store)".to_owned(),
                    operation,
                    message: "the subscription was aborted: it writes nothing more".to_owned(),
                    source: None,
                })
            });
        }
        if matches!(call, LeaseCall::Prepare) {
            return next;
        }
        let limit = self.limit;
        Box::pin(async move {
            tokio::time::timeout(limit, next).await.unwrap_or_else(|_| {
                Err(LeaseError::Unavailable {
                    table: "(lease store)".to_owned(),
                    operation,
                    message: format!("no answer within {limit:?}"),
                    source: None,
                })
            })
        })
    }
}

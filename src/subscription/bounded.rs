//! [`CallTimeout`]: a lease-store layer whose calls give up after a time, so that a hung
//! connection cannot stall renewals, the give-up rule, hand-offs or shutdown.

use std::time::Duration;

use crate::lease::layer::{LeaseCall, LeaseLayer};
use crate::lease::{LeaseError, LeaseFuture};

/// Bounds every lease-store call but `prepare` (creating a table may take a while; it happens
/// once, before anything is read).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallTimeout(pub(crate) Duration);

impl LeaseLayer for CallTimeout {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if matches!(call, LeaseCall::Prepare) {
            return next;
        }
        let limit = self.0;
        let operation = call.operation();
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

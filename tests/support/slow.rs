//! Lease-table layers that make one instance's calls slow, for tests of instances that are
//! alive but late.

use std::time::Duration;

use kinesis_dataflow::lease::LeaseFuture;
use kinesis_dataflow::lease::layer::{LeaseCall, LeaseLayer};

/// Every lease-table call of one instance takes this long.
pub struct Slow(pub Duration);

impl LeaseLayer for Slow {
    fn around<'a, T: Send + 'a>(
        &'a self,
        _call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        late(self.0, next)
    }
}

/// Every single-row read (`get`, the watch's) of one instance takes this long; the rest
/// answers at once.
pub struct SlowGets(pub Duration);

impl LeaseLayer for SlowGets {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if matches!(call, LeaseCall::Get { .. }) {
            late(self.0, next)
        } else {
            next
        }
    }
}

fn late<'a, T: Send + 'a>(wait: Duration, next: LeaseFuture<'a, T>) -> LeaseFuture<'a, T> {
    Box::pin(async move {
        tokio::time::sleep(wait).await;
        next.await
    })
}

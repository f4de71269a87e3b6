//! The clock a subscription judges lease expiry by.

use std::fmt;

use tokio::time::Instant;

/// A monotonic clock. Lease expiry is judged only by differences on the observer's own
/// clock, so two hosts whose clocks disagree (by any amount) cannot steal each other's live
/// leases. The seam exists so tests can prove exactly that.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The tokio clock (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

//! Stopping on the signals a service gets: SIGINT (Ctrl-C in a terminal) and SIGTERM (what
//! Kubernetes, ECS, systemd and `docker stop` send). [`shutdown_signal`] is the future;
//! [`ShutdownHandle::stop_on_signal`] wires it to a subscription, so its stream ends once the
//! stop is complete and `main` can simply return.

use std::fmt;

use tokio::task::AbortHandle;

use super::ShutdownHandle;

/// Which signal asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopSignal {
    /// SIGINT: Ctrl-C in a terminal.
    Interrupt,
    /// SIGTERM: a supervisor's stop (Kubernetes, ECS, systemd). Only on Unix.
    Terminate,
}

impl fmt::Display for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
        })
    }
}

/// Resolves at the first SIGINT or SIGTERM (on other platforms than Unix, at the first
/// Ctrl-C), and says which came.
///
/// # Errors
///
/// The signal handlers could not be installed (the operating system refused them).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let signal = kinesis_dataflow::shutdown_signal().await?;
/// eprintln!("{signal}: stopping");
/// # Ok(()) }
/// ```
pub async fn shutdown_signal() -> std::io::Result<StopSignal> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::select! {
            _ = interrupt.recv() => Ok(StopSignal::Interrupt),
            _ = terminate.recv() => Ok(StopSignal::Terminate),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await?;
        Ok(StopSignal::Interrupt)
    }
}

impl ShutdownHandle {
    /// Starts a graceful stop at the first SIGINT or SIGTERM (see [`shutdown_signal`]): the
    /// one line a service needs. The subscription's stream then ends once the stop is
    /// complete (final checkpoints written, leases released, worker row deleted), so the
    /// pipeline's end is the program's end. The signal is logged at info. The handlers are
    /// installed before this returns, so a signal that comes right after is not missed.
    ///
    /// Returns the handle of the task waiting for the signal: abort it to stop waiting (it
    /// may be ignored).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
    /// use std::sync::Arc;
    /// use futures::StreamExt;
    /// use kinesis_dataflow::{AckSink, MemoryKinesis, MemoryLeaseStore, Subscription};
    ///
    /// let kinesis = MemoryKinesis::new();
    /// kinesis.add_stream("orders", 1)?;
    /// let orders = Subscription::builder(Arc::new(kinesis), Arc::new(MemoryLeaseStore::new()), "orders")
    ///     .start()
    ///     .await?;
    /// let waiting = orders.shutdown_handle().stop_on_signal();
    /// # let stop = orders.shutdown_handle();
    /// # tokio::spawn(async move { stop.shutdown().await });
    /// // Runs until SIGINT or SIGTERM, and returns once the stop is complete.
    /// orders.filter_map(|item| async move { item.ok() }).map(Ok).forward(AckSink::new()).await?;
    /// # waiting.abort();
    /// # Ok(()) }
    /// ```
    pub fn stop_on_signal(&self) -> AbortHandle {
        let handle = self.clone();
        #[cfg(unix)]
        let handlers = {
            use tokio::signal::unix::{SignalKind, signal};
            signal(SignalKind::interrupt()).and_then(|i| Ok((i, signal(SignalKind::terminate())?)))
        };
        tokio::spawn(async move {
            #[cfg(unix)]
            let received = match handlers {
                Ok((mut interrupt, mut terminate)) => tokio::select! {
                    _ = interrupt.recv() => Ok(StopSignal::Interrupt),
                    _ = terminate.recv() => Ok(StopSignal::Terminate),
                },
                Err(e) => Err(e),
            };
            #[cfg(not(unix))]
            let received = shutdown_signal().await;
            match received {
                Ok(signal) => {
                    tracing::info!(%signal, "stop requested by a signal; stopping gracefully");
                    handle.request();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGINT and SIGTERM: stop the subscription another way");
                }
            }
        })
        .abort_handle()
    }
}

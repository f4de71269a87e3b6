//! Stopping on the signals a service gets: SIGINT (Ctrl-C in a terminal) and SIGTERM (what
//! Kubernetes, ECS, systemd and `docker stop` send). [`shutdown_signal`] is the future;
//! [`ShutdownHandle::stop_on_signal`] wires it to a subscription, so its stream ends once the
//! stop is complete and `main` can simply return.
//!
//! The signals belong to the process, not to one subscription: on Unix one watcher thread
//! (`kinesis-dataflow-signals`, started by the first listener, whatever runtime it runs on)
//! receives both and decides with every listener of the process, under one lock. The first signal starts the graceful stop
//! of every listening subscription (and resolves every pending [`shutdown_signal`]); a second
//! one while any of those subscriptions is still stopping ends the process with the signal's
//! default action; with nothing listening (every listening subscription ended) a signal gets
//! its default action too, as it would without the library. The default action is emulated
//! by `signal-hook`'s `emulate_default_handler`: the process ends killed by the signal, which
//! is what its supervisor or shell sees.

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
/// On Unix it shares the process's signal watcher with [`ShutdownHandle::stop_on_signal`]
/// (whose rules it follows): while the future is pending (polled at least once), the first
/// signal resolves it instead of ending the process, and starts the graceful stop of the
/// subscriptions listening, if any. Once it has resolved or was dropped, it listens no more,
/// so after the first signal the program does its own stop, and a second SIGINT or SIGTERM
/// ends the process at once with the signal's default action. A new `shutdown_signal`
/// awaited after the first signal waits for the next one instead (the program decides on it),
/// unless subscriptions are still stopping because of the first: then it resolves at once,
/// with that signal.
///
/// Keep one future for the whole run: between a dropped future and the next one (a `select!`
/// in a loop that makes a new one each turn), nothing listens and a signal ends the process.
/// The library's watcher decides for SIGINT and SIGTERM from the first call on, for the life
/// of the process; a program that handles these signals itself (`tokio::signal`) should stop
/// its subscriptions with [`ShutdownHandle::shutdown`] from its own handler, and not use this
/// or [`ShutdownHandle::stop_on_signal`].
///
/// # Errors
///
/// The signal handlers could not be installed (the operating system refused them), or the
/// watcher thread could not be started.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let signal = kinesis_dataflow::shutdown_signal().await?;
/// eprintln!("{signal}: stopping (a second signal ends the process at once)");
/// # Ok(()) }
/// ```
pub async fn shutdown_signal() -> std::io::Result<StopSignal> {
    #[cfg(unix)]
    {
        let (_listening, told) = watcher::listen_once()?;
        told.await
            .map_err(|_| std::io::Error::other("the signal watcher ended"))
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
    /// pipeline's end is the program's end. The handlers are installed before this returns,
    /// so a signal that comes right after is not missed.
    ///
    /// The signals are the process's, so on Unix every call (for any number of subscriptions
    /// and [`MultiSubscription`](super::MultiSubscription)s, from any runtime) shares one
    /// watcher thread, and the rules are:
    ///
    /// - **The first** SIGINT or SIGTERM starts the graceful stop of every subscription
    ///   listening, logged at info. A subscription that starts listening while that stop is
    ///   under way stops at once.
    /// - **A second** SIGINT or SIGTERM while any of them is still stopping ends the process
    ///   at once, with the signal's default action (its parent sees it killed by the signal),
    ///   logged at warn as a graceful stop that was not finished: what was not checkpointed is
    ///   read again after the restart, and the leases not released expire for the other
    ///   instances. That is what a second Ctrl-C, or a supervisor's second SIGTERM, asks for.
    /// - **Once every listening subscription has ended** (its stop complete, or aborted), a
    ///   signal gets its default action: the process terminates as it would without the
    ///   library, even if the program goes on with other work, so its supervisor need not
    ///   wait for SIGKILL.
    ///
    /// The watcher decides for SIGINT and SIGTERM for the rest of the process from the first
    /// call on. A program that handles these signals itself (`tokio::signal`) should call
    /// [`ShutdownHandle::shutdown`] from its own handler instead. On other platforms than Unix,
    /// only the first Ctrl-C is acted on: it starts the graceful stop.
    ///
    /// Returns the handle of the task that waits for the subscription's end, to stop listening
    /// then: abort it to stop listening for this subscription (it may be ignored).
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
        {
            let listening = watcher::listen(self);
            tokio::spawn(async move {
                match listening {
                    Ok(listening) => {
                        handle.ended().await;
                        drop(listening);
                    }
                    Err(e) => cannot_listen(&e),
                }
            })
            .abort_handle()
        }
        #[cfg(not(unix))]
        {
            tokio::spawn(async move {
                match shutdown_signal().await {
                    Ok(signal) => {
                        tracing::info!(%signal, "stop requested by a signal; stopping gracefully");
                        handle.request();
                    }
                    Err(e) => cannot_listen(&e),
                }
            })
            .abort_handle()
        }
    }

    /// Resolves once the subscription has ended: its stop complete, or its task gone.
    #[cfg(unix)]
    async fn ended(&self) {
        let mut done = self.done.clone();
        let _ = done.wait_for(|done| *done).await;
    }
}

fn cannot_listen(e: &std::io::Error) {
    tracing::warn!(error = %e, "cannot listen for SIGINT and SIGTERM: stop the subscription another way");
}

/// The process's one signal watcher and its listeners.
#[cfg(unix)]
mod watcher {
    use std::collections::BTreeMap;
    use std::ffi::c_int;
    use std::io;
    use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

    use signal_hook::consts::{SIGINT, SIGTERM};
    use tokio::sync::oneshot;

    use super::{ShutdownHandle, StopSignal};

    /// Everything listening in the process.
    struct Listeners {
        last_id: u64,
        /// The subscriptions of `stop_on_signal`, until they ended.
        subscriptions: BTreeMap<u64, ShutdownHandle>,
        /// The pending `shutdown_signal` futures.
        futures: BTreeMap<u64, oneshot::Sender<StopSignal>>,
        /// The signal whose graceful stop is under way: set only while a subscription listens.
        stopping: Option<StopSignal>,
    }

    impl Listeners {
        /// Forgets the subscriptions that ended (their waiting task may not have run yet),
        /// and the stop once none is left.
        fn settle(&mut self) {
            self.subscriptions.retain(|_, handle| !handle.is_stopped());
            if self.subscriptions.is_empty() {
                self.stopping = None;
            }
        }

        fn next_id(&mut self) -> u64 {
            self.last_id += 1;
            self.last_id
        }
    }

    static LISTENERS: Mutex<Listeners> = Mutex::new(Listeners {
        last_id: 0,
        subscriptions: BTreeMap::new(),
        futures: BTreeMap::new(),
        stopping: None,
    });

    /// The watcher thread, started once: or why it could not be.
    static WATCHER: OnceLock<Result<(), (io::ErrorKind, String)>> = OnceLock::new();

    fn listeners() -> MutexGuard<'static, Listeners> {
        LISTENERS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A listener's place in the process: dropped, it listens no more.
    pub(super) struct Listening(u64);

    impl Drop for Listening {
        fn drop(&mut self) {
            let mut listeners = listeners();
            listeners.subscriptions.remove(&self.0);
            listeners.futures.remove(&self.0);
            listeners.settle();
        }
    }

    /// Listens for the subscription of `handle` until the place returned is dropped. One that
    /// comes while a signal's stop is under way is stopped at once.
    pub(super) fn listen(handle: &ShutdownHandle) -> io::Result<Listening> {
        watch()?;
        let (id, stopping) = {
            let mut listeners = listeners();
            listeners.settle();
            let id = listeners.next_id();
            listeners.subscriptions.insert(id, handle.clone());
            (id, listeners.stopping)
        };
        if let Some(signal) = stopping {
            tracing::info!(
                %signal,
                "stop requested by a signal before this subscription listened; stopping gracefully"
            );
            handle.request();
        }
        Ok(Listening(id))
    }

    /// A pending `shutdown_signal`: told the next signal, or at once the signal whose stop
    /// is under way.
    pub(super) fn listen_once() -> io::Result<(Listening, oneshot::Receiver<StopSignal>)> {
        watch()?;
        let (tell, told) = oneshot::channel();
        let mut listeners = listeners();
        listeners.settle();
        let id = listeners.next_id();
        match listeners.stopping {
            Some(signal) => {
                let _ = tell.send(signal);
            }
            None => {
                listeners.futures.insert(id, tell);
            }
        }
        Ok((Listening(id), told))
    }

    /// Starts the watcher thread, once for the process.
    fn watch() -> io::Result<()> {
        WATCHER
            .get_or_init(|| start().map_err(|e| (e.kind(), e.to_string())))
            .clone()
            .map_err(|(kind, message)| io::Error::new(kind, message))
    }

    fn start() -> io::Result<()> {
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
        std::thread::Builder::new()
            .name("kinesis-dataflow-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    on_signal(signal);
                }
            })?;
        Ok(())
    }

    fn on_signal(number: c_int) {
        let signal = if number == SIGINT {
            StopSignal::Interrupt
        } else {
            StopSignal::Terminate
        };
        let mut listeners = listeners();
        listeners.settle();
        if let Some(first) = listeners.stopping {
            let stopping = listeners.subscriptions.len();
            drop(listeners);
            tracing::warn!(
                %signal,
                first = %first,
                subscriptions = stopping,
                "a second signal while stopping: the process ends now; the graceful stop was not finished"
            );
            terminate(number);
        }
        if listeners.subscriptions.is_empty() && listeners.futures.is_empty() {
            drop(listeners);
            terminate(number);
        }
        let subscriptions: Vec<ShutdownHandle> =
            listeners.subscriptions.values().cloned().collect();
        let futures = std::mem::take(&mut listeners.futures);
        if !subscriptions.is_empty() {
            listeners.stopping = Some(signal);
        }
        drop(listeners);
        tracing::info!(
            %signal,
            subscriptions = subscriptions.len(),
            waiting = futures.len(),
            "stop requested by a signal; stopping gracefully (a second signal ends the process at once)"
        );
        for handle in subscriptions {
            handle.request();
        }
        for tell in futures.into_values() {
            let _ = tell.send(signal);
        }
    }

    /// The signal's default action, as if no handler had been installed: for SIGINT and
    /// SIGTERM, the process ends, killed by the signal.
    fn terminate(number: c_int) -> ! {
        let _ = signal_hook::low_level::emulate_default_handler(number);
        // Not reached for SIGINT and SIGTERM (the emulation aborts when raising fails): the
        // shell's convention for a process ended by a signal.
        std::process::exit(128 + number)
    }
}

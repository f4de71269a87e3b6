//! SIGINT and SIGTERM through `ShutdownHandle::stop_on_signal`, in a real process: the child
//! is this test binary run again for one test (with `SIGNALS_CHILD` set), reading the
//! in-memory transport; the parent signals it with `kill` and reads its output and its log.
//!
//! - A second signal while the graceful stop is still under way ends the process at once,
//!   by the signal (a supervisor's second SIGTERM, a second Ctrl-C).
//! - Once every listening subscription has ended, a signal gets its default action: a process
//!   that goes on with other work is terminated by it, as it would be without the library.
//! - With two subscriptions, one ended and one running, the signal stops the running one
//!   gracefully, and the process lives until that stop is complete.
//! - A subscription that starts listening while a signal's stop is under way stops at once.
//! - A pending `shutdown_signal` is told the first signal; once it resolved, nothing listens
//!   and the next signal ends the process.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::{
    Delivery, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Record, Subscription,
    SubscriptionBuilder, shutdown_signal,
};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::signal::unix::SignalKind;
use tokio::sync::mpsc;

/// Set in the child's environment: the test runs its child's part.
const CHILD: &str = "SIGNALS_CHILD";
/// A hang guard for each step of the parent, and for each read of the child.
const PATIENCE: Duration = Duration::from_secs(20);
/// Longer than any wait of the parent: what the child does "for ever".
const FOREVER: Duration = Duration::from_secs(300);
/// Logged at the first signal (the graceful stop begins).
const STOPPING: &str = "stop requested by a signal";
/// Logged when a second signal ends the process before the stop was complete.
const UNFINISHED: &str = "graceful stop was not finished";

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

// The child's part.

/// The child logs at info to stderr, where the parent reads it.
fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .init();
}

/// A transport whose every stream holds one record, and a lease store.
fn memory(streams: &[&str]) -> (SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    for stream in streams {
        memory.add_stream(stream, 1).unwrap();
        memory.put(stream, "key", format!("{stream}:0")).unwrap();
    }
    (Arc::new(memory), MemoryLeaseStore::new())
}

fn builder(
    api: &SharedKinesis,
    store: &MemoryLeaseStore,
    stream: &str,
    owner: &str,
) -> SubscriptionBuilder {
    support::reading::fast(api, Arc::new(store.clone()), stream, owner)
        .initial_position(KinesisPosition::horizon())
}

async fn next(sub: &mut Subscription) -> Delivery<Record> {
    loop {
        match tokio::time::timeout(PATIENCE, sub.next()).await {
            Ok(Some(Ok(d))) => return d,
            Ok(Some(Err(e))) => eprintln!("read error (retried): {e}"),
            other => panic!("expected a delivery, got {other:?}"),
        }
    }
}

/// Starts the subscription `builder` makes, stopping it on SIGINT or SIGTERM.
async fn listening(builder: SubscriptionBuilder) -> Subscription {
    let sub = builder.start().await.unwrap();
    sub.shutdown_handle().stop_on_signal();
    sub
}

/// Goes on with other work "for ever", then says it is still alive: the parent expects a
/// signal to end the process before.
async fn live_on() -> ! {
    tokio::time::sleep(FOREVER).await;
    println!("child: still alive");
    std::process::exit(0)
}

/// Reads `sub` until its stream ends (the stop is complete), bounded.
async fn until_ended(sub: &mut Subscription) {
    tokio::time::timeout(FOREVER, async { while sub.next().await.is_some() {} })
        .await
        .expect("the stream ends");
}

/// Holds a record it never settles, so the stop waits for the whole (long) shutdown timeout.
async fn child_with_a_slow_stop() -> ! {
    log_to_stderr();
    let (api, store) = memory(&["orders"]);
    let mut orders =
        listening(builder(&api, &store, "orders", "slow").shutdown_timeout(FOREVER)).await;
    let held = next(&mut orders).await;
    println!("child: holding a record");
    until_ended(&mut orders).await;
    drop(held);
    println!("child: the stop completed");
    std::process::exit(0)
}

/// Its subscription ends; the program goes on with other work.
async fn child_that_lives_on() -> ! {
    log_to_stderr();
    let (api, store) = memory(&["orders"]);
    let mut orders = listening(builder(&api, &store, "orders", "lives-on")).await;
    next(&mut orders).await.ack();
    orders.shutdown().await;
    println!("child: the subscription ended; other work goes on");
    live_on().await
}

/// Two subscriptions listening: the first ends on its own, the second holds a record (its stop
/// waits out a one-second shutdown timeout); the program goes on once both ended.
async fn child_with_two_subscriptions() -> ! {
    log_to_stderr();
    let (api, store) = memory(&["first", "second"]);
    let mut first = listening(builder(&api, &store, "first", "one")).await;
    let mut second =
        listening(builder(&api, &store, "second", "two").shutdown_timeout(Duration::from_secs(1)))
            .await;
    next(&mut first).await.ack();
    first.shutdown().await;
    println!("child: the first subscription ended");
    let held = next(&mut second).await;
    println!("child: the second holds a record");
    until_ended(&mut second).await;
    // Returns at once: the stop is complete.
    second.shutdown().await;
    drop(held);
    // What the stop leaves: no shard lease owned, no worker row.
    let left = (store.list("second").await.unwrap().into_iter())
        .filter(|row| {
            let owned = row.shard_id.starts_with("shardId-") && row.owner.as_deref() == Some("two");
            owned || row.shard_id == "worker:two"
        })
        .count();
    println!("child: the second stopped gracefully, rows left: {left}");
    live_on().await
}

/// A subscription stopping slowly because of a signal (it holds a record), and one that
/// starts listening only after that signal came (told by `shutdown_signal`).
async fn child_that_listens_late() -> ! {
    log_to_stderr();
    let (api, store) = memory(&["first", "late"]);
    let mut first =
        listening(builder(&api, &store, "first", "one").shutdown_timeout(FOREVER)).await;
    let held = next(&mut first).await;
    let mut told = std::pin::pin!(shutdown_signal());
    assert!(futures::poll!(&mut told).is_pending());
    println!("child: holding a record, listening");
    let signal = told.await.unwrap();
    println!("child: told {signal}");
    let mut late = listening(builder(&api, &store, "late", "late")).await;
    until_ended(&mut late).await;
    println!("child: the late subscription stopped");
    tokio::time::sleep(FOREVER).await;
    drop(held);
    std::process::exit(0)
}

/// Waits for a signal with `shutdown_signal`, then goes on with other work.
async fn child_with_the_bare_future() -> ! {
    log_to_stderr();
    let mut told = std::pin::pin!(shutdown_signal());
    assert!(futures::poll!(&mut told).is_pending());
    println!("child: listening");
    let signal = told.await.unwrap();
    println!("child: told {signal}; stopping on its own");
    live_on().await
}

// The parent's part.

/// The child process, its stdout and stderr lines in one channel.
struct Child {
    process: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

fn forward(from: impl AsyncRead + Unpin + Send + 'static, to: mpsc::UnboundedSender<String>) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(from).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = to.send(line);
        }
    });
}

impl Child {
    /// Runs this test binary again, for the test `test` alone, as the child.
    fn start(test: &str) -> Self {
        let mut process = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture"])
            .env(CHILD, "1")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the child starts");
        let (tx, lines) = mpsc::unbounded_channel();
        forward(process.stdout.take().unwrap(), tx.clone());
        forward(process.stderr.take().unwrap(), tx);
        Self {
            process,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads the child's lines until one contains `text`.
    async fn expect(&mut self, text: &str) {
        let found = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = self.lines.recv().await {
                eprintln!("  child | {line}");
                let hit = line.contains(text);
                self.seen.push(line);
                if hit {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            found == Ok(true),
            "the child said {text:?} ({}): {:#?}",
            if found.is_err() {
                "timed out"
            } else {
                "it ended first"
            },
            self.seen
        );
    }

    /// Sends `signal` (`TERM`, `INT`) with `kill`.
    fn signal(&self, signal: &str) {
        let pid = self.process.id().expect("running").to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the child to exit, then reads what it said last.
    async fn exit(&mut self, after: &str) -> ExitStatus {
        let Ok(status) = tokio::time::timeout(PATIENCE, self.process.wait()).await else {
            panic!("the child did not exit after {after}: {:#?}", self.seen);
        };
        while let Ok(Some(line)) = tokio::time::timeout(PATIENCE, self.lines.recv()).await {
            eprintln!("  child | {line}");
            self.seen.push(line);
        }
        status.unwrap()
    }

    /// Waits for the child to exit after `after`, and asserts that the signal `signal` ended
    /// it (`how` says so in the failure message).
    async fn exit_by(&mut self, after: &str, signal: i32, how: &str) {
        let status = self.exit(after).await;
        assert_eq!(
            status.signal(),
            Some(signal),
            "{how}: {status}; {:#?}",
            self.seen
        );
    }

    /// Sends SIGTERM and asserts that it terminated the child as it would without the
    /// library: at once, with no stop under way.
    async fn terminated_by_sigterm(&mut self, after: &str) {
        self.signal("TERM");
        self.exit_by(after, terminate(), "terminated by SIGTERM")
            .await;
        assert!(!self.said("child: still alive"));
        assert!(!self.said(UNFINISHED), "no stop was under way");
    }

    fn said(&self, text: &str) -> bool {
        self.seen.iter().any(|line| line.contains(text))
    }
}

fn terminate() -> i32 {
    SignalKind::terminate().as_raw_value()
}

fn interrupt() -> i32 {
    SignalKind::interrupt().as_raw_value()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_while_the_stop_is_under_way_ends_the_process() {
    if is_child() {
        child_with_a_slow_stop().await;
    }
    let mut child = Child::start("a_second_signal_while_the_stop_is_under_way_ends_the_process");
    child.expect("child: holding a record").await;
    child.signal("TERM");
    // The graceful stop began: it waits for the held record, for longer than this test.
    child.expect(STOPPING).await;
    child.signal("INT");
    child
        .exit_by(
            "the second signal",
            interrupt(),
            "ended by the second signal",
        )
        .await;
    assert!(
        child.said(UNFINISHED),
        "logged that the stop was not finished"
    );
    assert!(!child.said("child: the stop completed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_subscription_ended_a_signal_terminates_the_process() {
    if is_child() {
        child_that_lives_on().await;
    }
    let mut child = Child::start("once_the_subscription_ended_a_signal_terminates_the_process");
    child
        .expect("child: the subscription ended; other work goes on")
        .await;
    child.terminated_by_sigterm("SIGTERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_subscription_ended_a_signal_stops_the_other_gracefully_then_the_next_ends_the_process()
 {
    if is_child() {
        child_with_two_subscriptions().await;
    }
    let mut child = Child::start(
        "with_one_subscription_ended_a_signal_stops_the_other_gracefully_then_the_next_ends_the_process",
    );
    child.expect("child: the first subscription ended").await;
    child.expect("child: the second holds a record").await;
    child.signal("TERM");
    // The ended subscription does not let the signal end the process: the running one stops
    // gracefully (its held record waits out its shutdown timeout), and the process lives on.
    child
        .expect("child: the second stopped gracefully, rows left: 0")
        .await;
    // Both ended: the next signal terminates the process as it would without the library.
    child
        .terminated_by_sigterm("the SIGTERM after both ended")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_that_listens_while_a_signal_stop_is_under_way_stops_at_once() {
    if is_child() {
        child_that_listens_late().await;
    }
    let mut child =
        Child::start("a_subscription_that_listens_while_a_signal_stop_is_under_way_stops_at_once");
    child.expect("child: holding a record, listening").await;
    child.signal("TERM");
    child.expect("child: told SIGTERM").await;
    // The process was asked to stop: a subscription listening from now on stops at once.
    child.expect("child: the late subscription stopped").await;
    // The first one still waits for its held record: a second signal ends the process.
    child.signal("TERM");
    child
        .exit_by(
            "the second signal",
            terminate(),
            "ended by the second signal",
        )
        .await;
    assert!(child.said(UNFINISHED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_signal_is_told_the_first_signal_and_the_next_ends_the_process() {
    if is_child() {
        child_with_the_bare_future().await;
    }
    let mut child =
        Child::start("shutdown_signal_is_told_the_first_signal_and_the_next_ends_the_process");
    child.expect("child: listening").await;
    child.signal("INT");
    child
        .expect("child: told SIGINT; stopping on its own")
        .await;
    child.signal("INT");
    child
        .exit_by(
            "the second SIGINT",
            interrupt(),
            "ended by the second SIGINT",
        )
        .await;
    assert!(!child.said("child: still alive"));
}

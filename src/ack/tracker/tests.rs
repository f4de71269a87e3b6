use super::*;

fn acks() -> Arc<ShardAcks> {
    ShardAcks::new("s".into(), "shardId-0".into(), None)
}

#[test]
fn the_checkpoint_never_passes_an_unsettled_record() {
    let acks = acks();
    let ids: Vec<u64> = (1..=5).map(|i| acks.register(&i.to_string())).collect();
    acks.settle(ids[2], Settlement::Acked);
    acks.settle(ids[1], Settlement::Acked);
    assert_eq!(acks.checkpoint(), None, "record 1 is still in flight");
    acks.settle(ids[0], Settlement::Acked);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("3".into())));
    acks.settle(ids[4], Settlement::Skipped);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("3".into())));
    acks.settle(ids[3], Settlement::Dropped);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("5".into())));
    assert_eq!(acks.settled_position().get().as_deref(), Some("5"));
    let long = "9".repeat(100);
    let b = acks.register(&long);
    acks.settle(b, Settlement::Acked);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence(long)));
    let counts = acks.counts();
    assert_eq!(
        (
            counts.acked,
            counts.skipped,
            counts.dropped,
            counts.in_flight
        ),
        (4, 1, 1, 0)
    );
}

#[test]
fn a_checkpoint_lets_go_of_the_record_it_ends_on() {
    let acks = acks();
    let record = record("7");
    let index = acks.register_delivery(&record);
    let kept = record.clone();
    drop(record);
    acks.settle(index, Settlement::Acked);
    // The ledger holds the record the settled prefix ends on, beside `kept`.
    assert_eq!(kept.holders(), 2);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("7".into())));
    assert_eq!(kept.holders(), 1);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("7".into())));
}

#[test]
fn an_abandoned_delivery_holds_the_checkpoint_back_for_good() {
    let acks = acks();
    let ids: Vec<u64> = (1..=3).map(|i| acks.register(&i.to_string())).collect();
    acks.settle(ids[0], Settlement::Acked);
    acks.settle(ids[1], Settlement::Abandoned);
    acks.settle(ids[2], Settlement::Acked);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("1".into())));
    assert_eq!(acks.in_flight(), 0, "nothing left to wait for");
    acks.mark_ended();
    assert!(
        !acks.is_finished(),
        "the shard is not finished: record 2 is read again"
    );
    assert_eq!(acks.counts().abandoned, 1);
}

#[test]
fn shard_end_waits_for_the_last_settlement() {
    let acks = acks();
    let a = acks.register("1");
    acks.mark_ended();
    assert!(!acks.is_finished());
    assert_eq!(acks.checkpoint(), None);
    acks.settle(a, Settlement::Acked);
    assert!(acks.is_finished());
    assert_eq!(acks.checkpoint(), Some(Checkpoint::ShardEnd));
}

fn record(seq: &str) -> Record {
    Record::new("shardId-0".into(), seq, "k", &b"x"[..], None)
}

fn timed(within: Duration, max_attempts: Option<u32>) -> Arc<ShardAcks> {
    let letters: Arc<dyn super::super::dead_letter::DeadLetters> =
        Arc::new(super::super::dead_letter::dead_letters_fn(|_| async {
            Ok(())
        }));
    ShardAcks::with_policy(
        "s".into(),
        "shardId-0".into(),
        None,
        AckPolicy {
            settle_within: Some(within),
            max_attempts,
            dead_letters: Some(letters),
            ..AckPolicy::default()
        },
        ShardMetrics::default(),
        tracing::Span::none(),
    )
}

fn poll(acks: &ShardAcks) -> RetryPoll {
    acks.next_retry(futures::task::noop_waker_ref())
}

/// Counts its wakes.
#[derive(Default)]
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_record_sent_back_ahead_of_a_waiting_one_wakes_the_reader() {
    let acks = acks();
    let third = acks.register_delivery(&record("3"));
    let fifth = acks.register_delivery(&record("5"));
    let back = |delay| SendBack {
        delay,
        attempts: 1,
        ..SendBack::default()
    };
    acks.requeue(fifth, record("5"), back(Duration::from_secs(30)));
    let wakes = Arc::new(Wakes::default());
    let waker = Waker::from(wakes.clone());
    assert!(matches!(acks.next_retry(&waker), RetryPoll::Waiting(_)));
    // The reader now sleeps until record 5's delay is over; record 3, sent back with no
    // delay, goes ahead of it and must not wait for that.
    acks.requeue(third, record("3"), back(Duration::ZERO));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the reader was woken");
    assert!(matches!(acks.next_retry(&waker), RetryPoll::Ready(i, _, 2) if i == third));
}

#[tokio::test(start_paused = true)]
async fn a_delivery_past_its_deadline_is_taken_back_and_its_late_settlement_ignored() {
    let acks = timed(Duration::from_secs(30), None);
    let first = acks.register_delivery(&record("1"));
    let second = acks.register_delivery(&record("2"));
    acks.settle_attempt(second, 1, Settlement::Acked);
    let RetryPoll::Nothing(Some(at)) = poll(&acks) else {
        panic!("the first delivery's deadline is next");
    };
    assert_eq!(at, Instant::now() + Duration::from_secs(30));
    tokio::time::advance(Duration::from_secs(31)).await;
    let RetryPoll::Ready(index, again, attempt) = poll(&acks) else {
        panic!("taken back and delivered again");
    };
    assert_eq!((index, again.sequence_number(), attempt), (first, "1", 2));
    acks.settle_attempt(first, 1, Settlement::Acked);
    assert_eq!(
        acks.checkpoint(),
        None,
        "the timed-out delivery settles nothing"
    );
    acks.requeue(
        first,
        record("1"),
        SendBack {
            attempts: 1,
            ..SendBack::default()
        },
    );
    assert!(
        matches!(poll(&acks), RetryPoll::Nothing(Some(_))),
        "nor sends it back"
    );
    acks.settle_attempt(first, 2, Settlement::Acked);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("2".into())));
    assert!(
        matches!(poll(&acks), RetryPoll::Nothing(None)),
        "no deadline left"
    );
    assert_eq!(acks.counts().timed_out, 1);
}

#[tokio::test(start_paused = true)]
async fn a_delivery_timing_out_on_its_last_attempt_is_dead_lettered() {
    let acks = timed(Duration::from_secs(5), Some(2));
    let only = acks.register_delivery(&record("1"));
    tokio::time::advance(Duration::from_secs(6)).await;
    assert!(matches!(poll(&acks), RetryPoll::Ready(i, _, 2) if i == only));
    tokio::time::advance(Duration::from_secs(6)).await;
    let RetryPoll::DeadLetter(index, letter, _) = poll(&acks) else {
        panic!("dead-lettered after its second attempt timed out");
    };
    assert_eq!((index, letter.attempts), (only, 2));
    assert_eq!(letter.last_error.as_deref(), Some("not settled within 5s"));
}

#[tokio::test(start_paused = true)]
async fn settled_deliveries_leave_no_deadline_behind() {
    let acks = timed(Duration::from_secs(5), None);
    for i in 1..=3 {
        let index = acks.register_delivery(&record(&i.to_string()));
        acks.settle_attempt(index, 1, Settlement::Acked);
    }
    assert!(matches!(poll(&acks), RetryPoll::Nothing(None)));
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(matches!(poll(&acks), RetryPoll::Nothing(None)));
    assert_eq!(acks.counts().timed_out, 0);
}

#[test]
fn a_checkpoint_inside_an_aggregate_names_the_last_settled_user_record() {
    let acks = ShardAcks::new(
        "s".into(),
        "shardId-0".into(),
        Some(&Checkpoint::SubSequence("7".into(), 0)),
    );
    assert_eq!(
        acks.checkpoint(),
        Some(Checkpoint::SubSequence("7".into(), 0))
    );
    let data =
        crate::kpl::aggregate([("a", None, &b"1"[..]), ("a", None, b"2"), ("a", None, b"3")]);
    let aggregate = Record::new("shardId-0".into(), "9", "k", data, None);
    let crate::kpl::Unpacked::Users(users) = crate::kpl::unpack(&aggregate) else {
        panic!("an aggregate");
    };
    let ids: Vec<u64> = users
        .iter()
        .map(|u| acks.register_delivery(u.as_ref().unwrap()))
        .collect();
    acks.settle(ids[0], Settlement::Acked);
    acks.settle(ids[1], Settlement::Acked);
    assert_eq!(
        acks.checkpoint(),
        Some(Checkpoint::SubSequence("9".into(), 1))
    );
    assert_eq!(
        acks.settled_position().get(),
        None,
        "the renewal point stays at the last whole record"
    );
    acks.settle(ids[2], Settlement::Acked);
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("9".into())));
    assert_eq!(acks.settled_position().get().as_deref(), Some("9"));
}

#[test]
fn settling_twice_or_unknown_indexes_is_harmless() {
    let acks = ShardAcks::new(
        "s".into(),
        "x".into(),
        Some(&Checkpoint::Sequence("7".into())),
    );
    assert_eq!(acks.checkpoint(), Some(Checkpoint::Sequence("7".into())));
    let a = acks.register("8");
    acks.settle(a, Settlement::Acked);
    acks.settle(a, Settlement::Skipped);
    acks.settle(99, Settlement::Acked);
    assert_eq!(acks.counts().acked, 1);
    assert_eq!(acks.counts().skipped, 0);
}

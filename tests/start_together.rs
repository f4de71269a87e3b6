//! Instances that start together keep the promise of the first one to return: nothing written
//! after it returned is missed, even on the shards an instance still starting holds and opens
//! at the tip (in-memory transport and lease store; the slow first iterators come from a layer).

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::layer::{ApiCall, KinesisLayer, Layered};
use kinesis_dataflow::api::{ApiFuture, SharedKinesis};
use kinesis_dataflow::{KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription};

const STREAM: &str = "orders";

/// Holds every GetShardIterator back for a while.
struct SlowIterators(Duration);

impl KinesisLayer for SlowIterators {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: ApiCall<'a>,
        next: ApiFuture<'a, T>,
    ) -> ApiFuture<'a, T> {
        if matches!(call, ApiCall::GetShardIterator { .. }) {
            let delay = self.0;
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                next.await
            })
        } else {
            next
        }
    }
}

async fn start(
    api: SharedKinesis,
    store: &MemoryLeaseStore,
    owner: &str,
    position: Option<&KinesisPosition>,
) -> Subscription {
    let mut builder = support::reading::fast(&api, Arc::new(store.clone()), STREAM, owner);
    if let Some(position) = position {
        builder = builder.start_at(position.clone());
    }
    builder.start().await.unwrap()
}

/// Instance `b` starts first, and its first iterators are slow; `a` starts while `b` is still
/// starting and returns first. Everything written once `a` returned reaches one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_after_the_first_start_returned_reach_an_instance_still_starting() {
    for position in [None, Some(KinesisPosition::latest())] {
        let memory = MemoryKinesis::new();
        memory.add_stream(STREAM, 4).unwrap();
        support::reading::write_tagged(&memory, STREAM, "before", 0, 8, 8);
        let store = MemoryLeaseStore::new();
        let direct: SharedKinesis = Arc::new(memory.clone());
        let slow: SharedKinesis = Arc::new(Layered::new(
            Arc::new(memory.clone()),
            SlowIterators(Duration::from_millis(250)),
        ));
        let b = {
            let (store, position) = (store.clone(), position.clone());
            tokio::spawn(async move { start(slow, &store, "b", position.as_ref()).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let a = start(direct, &store, "a", position.as_ref()).await;
        // `a` returned: from here on nothing may be missed.
        let expected: BTreeSet<String> =
            support::reading::write_tagged(&memory, STREAM, "after", 0, 40, 40)
                .into_iter()
                .collect();
        let b = b.await.unwrap();
        let mut both = futures::stream::select(a, b);
        let mut seen = BTreeSet::new();
        let read = tokio::time::timeout(Duration::from_secs(20), async {
            while !expected.is_subset(&seen) {
                match both.next().await {
                    Some(Ok(d)) => {
                        seen.insert(String::from_utf8_lossy(d.data()).into_owned());
                        d.ack();
                    }
                    Some(Err(e)) => eprintln!("{e}"),
                    None => break,
                }
            }
        })
        .await;
        let missing: Vec<&String> = expected.difference(&seen).collect();
        assert!(
            read.is_ok() && missing.is_empty(),
            "under {position:?}: {} of {} records written after the first start returned never \
             came: {missing:?}",
            missing.len(),
            expected.len()
        );
    }
}

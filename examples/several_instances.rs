// Several instances of one application sharing a stream's shards through the lease table.
//
// Instance A starts alone on a four-shard stream and takes every shard. Instance B starts with
// the same application name, so the same lease table: each instance records itself there, A
// sees it holds more than its share and hands two shards off gracefully (it stops reading
// them, waits for their deliveries in flight, checkpoints, releases), and B takes them at its
// next listing, resuming from those checkpoints. Then A stops gracefully: its checkpoints are
// flushed and its leases released, and B takes its shards too. Shipments are published the
// whole time; at the end every one of them has been handled, each customer's in order.
//
// The lease holders are printed as they change, read from the lease table itself.
//
// The brokers come from the standard AWS environment, so this runs against AWS, LocalStack,
// or kinesis-local + dynalite:
//
// ```sh
// AWS_REGION=us-east-1 AWS_ENDPOINT_URL_KINESIS=http://localhost:4567 \
// AWS_ENDPOINT_URL_DYNAMODB=http://localhost:4568 AWS_ACCESS_KEY_ID=test \
// AWS_SECRET_ACCESS_KEY=test cargo run --example several_instances
// ```
//
// or on the in-memory transport (one in-memory Kinesis and one in-memory lease table that both
// instances share):
//
// ```sh
// cargo run --example several_instances -- --in-memory
// ```
//
// The two instances run in one process here to keep the example self-contained; two processes
// (or hosts) share the shards the same way, each with its own `owner` id.

use std::collections::BTreeMap;
use std::fmt;
use std::future::{Future, ready};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kinesis_dataflow::broker::ConnectedKinesis;
use kinesis_dataflow::broker::prelude::*;
use kinesis_dataflow::lease::{LeaseStore, SharedLeaseStore};
use kinesis_dataflow::{DynamoLeaseStore, MemoryLeaseStore};
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};
use serde::Deserialize;

/// The stream `main` uses.
pub const STREAM: &str = "fleet-shipments";
/// How many shards the stream is created with when missing.
pub const SHARDS: u32 = 4;
/// The application name both instances share: it names their lease table.
pub const APPLICATION: &str = "fleet";
/// The owner id instance A holds its leases as.
pub const INSTANCE_A: &str = "instance-a";
/// The owner id instance B holds its leases as.
pub const INSTANCE_B: &str = "instance-b";
/// The customers the producer publishes for, one partition key each.
pub const CUSTOMERS: [&str; 8] = [
    "ada", "barbara", "dennis", "edsger", "grace", "ken", "linus", "margaret",
];

/// Any error of the run.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A shipment to send: the customer is the partition key.
#[derive(Debug, Clone, Deserialize)]
pub struct Shipment {
    /// Who it goes to.
    pub customer: String,
    /// The customer's running number, from 0.
    pub seq: u64,
}

/// One shipment handled by one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The owner id of the instance that handled it.
    pub instance: String,
    /// The shard it was read from.
    pub shard: String,
    /// Who it goes to.
    pub customer: String,
    /// The customer's running number.
    pub seq: u64,
}

/// What the handlers of both instances saw, in handling order.
pub type HandledLog = Arc<Mutex<Vec<Handled>>>;

/// Ships one shipment on one instance, noting the instance and the shard in the log.
struct Ship {
    instance: String,
    log: HandledLog,
}

impl Handle<Shipment, (), (), KinesisContext> for Ship {
    fn handle(
        &self,
        shipment: &Shipment,
        _outs: &(),
        ctx: &mut Context<'_, KinesisContext>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let shard = ctx.context(ShardId);
        tracing::info!(
            instance = %self.instance,
            shard,
            shipment.customer,
            shipment.seq,
            "shipped"
        );
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Handled {
                instance: self.instance.clone(),
                shard: shard.to_owned(),
                customer: shipment.customer.clone(),
                seq: shipment.seq,
            });
        ready(Ok(()))
    }
}

/// The subscription both instances mount: stream `name`, created with [`SHARDS`] shards when
/// missing, listed every second so that a hand-off or a release is picked up quickly.
pub fn shipments(name: &str) -> KinesisStream {
    KinesisStream::new(name)
        .create_if_missing(SHARDS)
        .poll_interval(Duration::from_millis(200))
        .list_interval(Duration::from_secs(1))
}

/// One instance: an app reading `stream` through `broker`, holding its leases as `owner`, and
/// noting what it handles in `log`.
pub fn instance(
    broker: KinesisBroker,
    owner: &str,
    stream: KinesisStream,
    log: HandledLog,
) -> RustStream {
    let ship = Ship {
        instance: owner.to_owned(),
        log,
    };
    RustStream::new(AppInfo::new("fleet", "0.1.0")).with_broker(broker.owner(owner), |b| {
        b.include(subscriber(stream, ship).build());
    })
}

/// Who holds which shard, as the lease table says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holdings {
    /// The shards each owner holds.
    pub by_owner: BTreeMap<String, Vec<String>>,
    /// The shards nobody holds.
    pub unowned: Vec<String>,
}

impl Holdings {
    /// Reads the lease rows of `shards` of `stream` from `leases`.
    pub async fn read(
        leases: &dyn LeaseStore,
        stream: &str,
        shards: &[String],
    ) -> Result<Self, BoxError> {
        let mut holdings = Self::default();
        let rows = leases.list(stream).await?;
        for shard in shards {
            match rows
                .iter()
                .find(|row| &row.shard_id == shard)
                .and_then(|row| row.owner.clone())
            {
                Some(owner) => holdings
                    .by_owner
                    .entry(owner)
                    .or_default()
                    .push(shard.clone()),
                None => holdings.unowned.push(shard.clone()),
            }
        }
        Ok(holdings)
    }

    /// The shards `owner` holds.
    #[must_use]
    pub fn of(&self, owner: &str) -> &[String] {
        self.by_owner.get(owner).map_or(&[], Vec::as_slice)
    }
}

impl fmt::Display for Holdings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self
            .by_owner
            .iter()
            .map(|(owner, shards)| format!("{owner} holds {}", shards.join(", ")))
            .collect();
        if !self.unowned.is_empty() {
            parts.push(format!("free: {}", self.unowned.join(", ")));
        }
        f.write_str(&parts.join("  |  "))
    }
}

/// What `run` needs: the two instances' brokers (same application, so same lease table), a
/// producer's, a view of the shared lease table, and the subscription.
pub struct Fleet {
    /// Instance A's broker (its owner id is set by `run`).
    pub a: KinesisBroker,
    /// Instance B's broker: the same streams and lease table as A's.
    pub b: KinesisBroker,
    /// The producer's broker: the same streams.
    pub producer: KinesisBroker,
    /// The lease table A and B share, read to show who holds what.
    pub leases: SharedLeaseStore,
    /// The subscription both instances mount.
    pub stream: KinesisStream,
    /// How long each step may take before the run gives up (a hang guard).
    pub patience: Duration,
}

/// What happened during `run`.
#[derive(Debug, Clone)]
pub struct Report {
    /// The stream's shards.
    pub shards: Vec<String>,
    /// The lease holders once A and B had balanced the shards between them.
    pub balanced: Holdings,
    /// The lease holders once B had taken over A's shards.
    pub after_a_stopped: Holdings,
    /// Every shipment published, in publish order: (customer, seq).
    pub published: Vec<(String, u64)>,
    /// Every shipment handled, by either instance, in handling order.
    pub handled: Vec<Handled>,
}

/// What a report says about the shipments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// Shipments published and never handled.
    pub lost: Vec<(String, u64)>,
    /// Handlings beyond the first of a shipment (at least once allows them).
    pub repeated: usize,
    /// Handlings that came before an earlier shipment of the same customer had been handled.
    pub out_of_order: Vec<Handled>,
}

impl Report {
    /// Checks every shipment was handled at least once, and each customer's in order: no
    /// shipment was handled before every earlier one of its customer (a repeat after a
    /// hand-over goes back, never ahead).
    #[must_use]
    pub fn audit(&self) -> Audit {
        let mut audit = Audit::default();
        let mut next: BTreeMap<&str, u64> = BTreeMap::new();
        for handled in &self.handled {
            let next = next.entry(handled.customer.as_str()).or_insert(0);
            if handled.seq > *next {
                audit.out_of_order.push(handled.clone());
            } else if handled.seq == *next {
                *next += 1;
            } else {
                audit.repeated += 1;
            }
        }
        let handled: std::collections::HashSet<(&str, u64)> = self
            .handled
            .iter()
            .map(|h| (h.customer.as_str(), h.seq))
            .collect();
        audit.lost = self
            .published
            .iter()
            .filter(|(customer, seq)| !handled.contains(&(customer.as_str(), *seq)))
            .cloned()
            .collect();
        audit
    }
}

/// A producer publishing a round of shipments (one per customer) every 50 ms until stopped.
struct Producing {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<Vec<(String, u64)>, KinesisError>>,
}

impl Producing {
    fn start(producer: &ConnectedKinesis, stream: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let publisher = producer.publisher();
        let stream = stream.to_owned();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut published = Vec::new();
            let mut seq = 0;
            while !stopped.load(Ordering::Acquire) {
                for customer in CUSTOMERS {
                    let body = format!(r#"{{"customer":"{customer}","seq":{seq}}}"#);
                    publisher
                        .publish(
                            OutgoingMessage::new(&stream, body.as_bytes()),
                            Some(&KinesisOptions::partition_key(customer)),
                        )
                        .await?;
                    published.push((customer.to_owned(), seq));
                }
                seq += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(published)
        });
        Self { stop, task }
    }

    /// Stops after the round in progress; every shipment published.
    async fn stop(self) -> Result<Vec<(String, u64)>, BoxError> {
        self.stop.store(true, Ordering::Release);
        Ok(self.task.await??)
    }
}

/// The ids of every shard of `stream`, in order (ListShards, page by page).
async fn shard_ids(
    kinesis: &dyn kinesis_dataflow::api::KinesisApi,
    stream: &str,
) -> Result<Vec<String>, BoxError> {
    let mut ids = Vec::new();
    let mut token = None;
    loop {
        let page = kinesis.list_shards(stream, token).await?;
        ids.extend(page.shards.into_iter().map(|shard| shard.shard_id));
        token = page.next_token;
        if token.is_none() {
            ids.sort();
            return Ok(ids);
        }
    }
}

/// Reads the lease table every 100 ms, printing the holders whenever they change, until
/// `done` says yes (then returns what it read) or `patience` runs out (then fails, naming
/// `what` did not happen).
async fn watch_leases(
    fleet: &Fleet,
    stream: &str,
    shards: &[String],
    last: &mut Option<Holdings>,
    what: &str,
    done: impl Fn(&Holdings) -> bool,
) -> Result<Holdings, BoxError> {
    let deadline = tokio::time::Instant::now() + fleet.patience;
    loop {
        match Holdings::read(fleet.leases.as_ref(), stream, shards).await {
            Ok(holdings) => {
                if last.as_ref() != Some(&holdings) {
                    println!("  leases: {holdings}");
                    *last = Some(holdings.clone());
                }
                if done(&holdings) {
                    return Ok(holdings);
                }
            }
            // A failed read of the table is retried; the instances retry theirs too.
            Err(e) => tracing::warn!(error = %e, "reading the lease table failed"),
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{what} did not happen within {:?}; last seen: {}",
                fleet.patience,
                last.as_ref().map_or_else(String::new, ToString::to_string)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the shipments handled since the first `mark` satisfy `done`, or fails once
/// `patience` runs out, naming `what` did not happen.
async fn watch_log(
    fleet: &Fleet,
    log: &HandledLog,
    mark: usize,
    what: &str,
    done: impl Fn(&[Handled]) -> bool,
) -> Result<(), BoxError> {
    let deadline = tokio::time::Instant::now() + fleet.patience;
    loop {
        if done(&log.lock().unwrap_or_else(PoisonError::into_inner)[mark..]) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{what} did not happen within {:?}", fleet.patience).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the scenario: A alone, then A and B balancing the shards and both handling shipments,
/// then A stopped and B holding every shard and handling the shipments of A's former shards,
/// with shipments published throughout. Returns what happened; fails only when a step does not
/// happen within `fleet.patience`.
pub async fn run(fleet: Fleet) -> Result<Report, BoxError> {
    let log = HandledLog::default();
    let stream = fleet.stream.stream_name().to_owned();

    println!("starting {INSTANCE_A}");
    let a = instance(
        fleet.a.clone(),
        INSTANCE_A,
        fleet.stream.clone(),
        log.clone(),
    )
    .start()
    .await?;
    let producer = fleet.producer.clone().connect().await?;
    let shards = shard_ids(producer.kinesis().as_ref(), &stream).await?;
    println!(
        "`{stream}` has {} shards; publishing shipments",
        shards.len()
    );
    let producing = Producing::start(&producer, &stream);

    let mut last = None;
    watch_leases(
        &fleet,
        &stream,
        &shards,
        &mut last,
        "A taking every shard",
        |h| h.of(INSTANCE_A).len() == shards.len(),
    )
    .await?;

    println!("starting {INSTANCE_B} (same application, same lease table)");
    let b = instance(
        fleet.b.clone(),
        INSTANCE_B,
        fleet.stream.clone(),
        log.clone(),
    )
    .start()
    .await?;
    let half = shards.len() / 2;
    let balanced = watch_leases(&fleet, &stream, &shards, &mut last, "the balance", |h| {
        h.unowned.is_empty() && h.of(INSTANCE_A).len() >= half && h.of(INSTANCE_B).len() >= half
    })
    .await?;

    let mark = log.lock().unwrap_or_else(PoisonError::into_inner).len();
    watch_log(
        &fleet,
        &log,
        mark,
        "both instances handling shipments",
        |new| {
            [INSTANCE_A, INSTANCE_B]
                .iter()
                .all(|instance| new.iter().any(|h| h.instance == *instance))
        },
    )
    .await?;
    println!("  both instances are handling shipments");

    println!("stopping {INSTANCE_A} gracefully");
    a.shutdown().await?;
    let after_a_stopped = watch_leases(
        &fleet,
        &stream,
        &shards,
        &mut last,
        "B taking A's shards",
        |h| h.of(INSTANCE_B).len() == shards.len(),
    )
    .await?;
    let mark = log.lock().unwrap_or_else(PoisonError::into_inner).len();
    let taken_over = balanced.of(INSTANCE_A);
    watch_log(&fleet, &log, mark, "B handling A's former shards", |new| {
        new.iter()
            .any(|h| h.instance == INSTANCE_B && taken_over.contains(&h.shard))
    })
    .await?;
    println!("  {INSTANCE_B} is handling shipments of {INSTANCE_A}'s former shards");

    let published = producing.stop().await?;
    println!(
        "stopped publishing after {} shipments; waiting for the last ones",
        published.len()
    );
    let all_handled = || {
        let log = log.lock().unwrap_or_else(PoisonError::into_inner);
        let handled: std::collections::HashSet<(&str, u64)> =
            log.iter().map(|h| (h.customer.as_str(), h.seq)).collect();
        published
            .iter()
            .all(|(customer, seq)| handled.contains(&(customer.as_str(), *seq)))
    };
    let deadline = tokio::time::Instant::now() + fleet.patience;
    while !all_handled() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    b.shutdown().await?;
    producer.shutdown().await?;
    let handled = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    Ok(Report {
        shards,
        balanced,
        after_a_stopped,
        published,
        handled,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let fleet = if std::env::args().any(|arg| arg == "--in-memory") {
        // One in-memory Kinesis and one lease table, shared by every broker built on them.
        let kinesis = MemoryKinesis::new();
        let leases = Arc::new(MemoryLeaseStore::new());
        let broker = || KinesisBroker::in_memory(kinesis.clone()).lease_store(leases.clone());
        Fleet {
            a: broker(),
            b: broker(),
            producer: broker(),
            leases,
            stream: shipments(STREAM),
            patience: Duration::from_secs(60),
        }
    } else {
        // The instances' lease table, `kinesis-dataflow-fleet`, read here to show its holders.
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let table = DynamoLeaseStore::default_table_name(APPLICATION);
        let broker = KinesisBroker::new().application(APPLICATION);
        Fleet {
            a: broker.clone(),
            b: broker.clone(),
            producer: broker,
            leases: Arc::new(DynamoLeaseStore::from_conf(&config, table)?),
            stream: shipments(STREAM),
            patience: Duration::from_secs(60),
        }
    };
    let report = run(fleet).await?;

    println!("\nshards handled, per instance:");
    let mut shards_of: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for handled in &report.handled {
        *shards_of
            .entry(handled.instance.as_str())
            .or_default()
            .entry(handled.shard.as_str())
            .or_default() += 1;
    }
    for (instance, shards) in &shards_of {
        let counts: Vec<String> = shards
            .iter()
            .map(|(shard, n)| format!("{shard}: {n}"))
            .collect();
        println!("  {instance}: {}", counts.join(", "));
    }
    let audit = report.audit();
    println!(
        "\n{} shipments published, {} handlings ({} repeated), {} lost, {} out of order",
        report.published.len(),
        report.handled.len(),
        audit.repeated,
        audit.lost.len(),
        audit.out_of_order.len()
    );
    if !audit.lost.is_empty() || !audit.out_of_order.is_empty() {
        return Err(format!("{audit:?}").into());
    }
    Ok(())
}

// Each record's effect exactly once in a database, across crashes: every record of a stream
// becomes one row of an SQLite table, written in the same transaction as the record's position
// in its shard. The database, not the lease table, is the truth about what was done: the
// subscription asks it where each shard stands when it takes the shard (its position source)
// and opens right after that.
//
// Configured by the standard AWS environment:
//
// ```sh
// AWS_REGION=us-east-1 AWS_ENDPOINT_URL_KINESIS=http://localhost:4567 \
// AWS_ENDPOINT_URL_DYNAMODB=http://localhost:4568 AWS_ACCESS_KEY_ID=test \
// AWS_SECRET_ACCESS_KEY=test RUST_LOG=info cargo run --example exactly_once -- orders effects.db
// ```
//
// Arguments: the stream, the SQLite database file, the application name that names the lease
// table (default `exactly-once`), and the lease duration in seconds (default 10). SIGINT
// (Ctrl-C) or SIGTERM stops it gracefully; SIGKILL at any moment loses nothing and applies
// nothing twice. Each record applied prints `applied <shard> <position>`; a delivery whose
// effect is already in the database (a frozen instance's, after its lease was taken) prints
// `already applied <shard> <position>` and changes nothing.
//
// No `//!` docs here: `tests/example_exactly_once.rs` runs the built binary.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::subscription::{PositionSourceError, position_source_fn};
use kinesis_dataflow::{Delivery, KinesisError, KinesisPosition, Record, Subscription};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The database: one connection, used from blocking threads.
#[derive(Clone)]
struct Effects(Arc<Mutex<Connection>>);

impl Effects {
    fn open(path: &str) -> rusqlite::Result<Self> {
        let connection = Connection::open(path)?;
        // Others may read the database while this writes (a report, a test): a lock they hold
        // a moment is waited for, not failed.
        connection.busy_timeout(std::time::Duration::from_secs(5))?;
        connection.execute_batch(
            "CREATE TABLE IF NOT EXISTS effects (
                 id INTEGER PRIMARY KEY,
                 stream TEXT NOT NULL, shard TEXT NOT NULL, position TEXT NOT NULL,
                 partition_key TEXT NOT NULL, data BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS positions (
                 stream TEXT NOT NULL, shard TEXT NOT NULL, position TEXT NOT NULL,
                 PRIMARY KEY (stream, shard));",
        )?;
        Ok(Self(Arc::new(Mutex::new(connection))))
    }

    /// Runs `f` on the connection on a blocking thread.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, PositionSourceError> {
        let connection = self.0.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut connection = connection.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut connection)
        });
        Ok(done.await??)
    }

    /// The stored position of a shard.
    async fn position(
        &self,
        stream: String,
        shard: String,
    ) -> Result<Option<Checkpoint>, PositionSourceError> {
        let text = self
            .with(move |db| {
                db.query_row(
                    "SELECT position FROM positions WHERE stream = ?1 AND shard = ?2",
                    params![stream, shard],
                    |row| row.get::<_, String>(0),
                )
                .optional()
            })
            .await?;
        match text {
            None => Ok(None),
            Some(text) => Checkpoint::decode(&text)
                .map(Some)
                .ok_or_else(|| format!("stored position {text:?} does not decode").into()),
        }
    }

    /// The effect of one record and its position, in one transaction; `false` when the
    /// database already holds a position at or past it (its effect is there).
    async fn apply(
        &self,
        stream: String,
        shard: String,
        position: Checkpoint,
        record: Record,
    ) -> Result<bool, PositionSourceError> {
        self.with(move |db| {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let stored: Option<String> = tx
                .query_row(
                    "SELECT position FROM positions WHERE stream = ?1 AND shard = ?2",
                    params![stream, shard],
                    |row| row.get(0),
                )
                .optional()?;
            let stored = stored.as_deref().and_then(Checkpoint::decode);
            if !position.is_ahead_of(stored.as_ref()) {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO effects (stream, shard, position, partition_key, data)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    stream,
                    shard,
                    position.encode(),
                    record.partition_key(),
                    &record.data()[..]
                ],
            )?;
            tx.execute(
                "INSERT INTO positions (stream, shard, position) VALUES (?1, ?2, ?3)
                 ON CONFLICT (stream, shard) DO UPDATE SET position = excluded.position",
                params![stream, shard, position.encode()],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(stream), Some(database)) = (args.next(), args.next()) else {
        eprintln!("usage: exactly_once <stream> <database file> [application] [lease seconds]");
        std::process::exit(2);
    };
    let application = args.next().unwrap_or_else(|| "exactly-once".to_owned());
    let lease: f64 = args.next().map_or(Ok(10.0), |s| s.parse())?;

    let effects = Effects::open(&database)?;
    let source = {
        let effects = effects.clone();
        position_source_fn(move |stream: String, shard: String| {
            let effects = effects.clone();
            async move { effects.position(stream, shard).await }
        })
    };
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let subscription = Subscription::aws(&config, &application, stream.as_str())?
        .initial_position(KinesisPosition::horizon())
        .lease_duration(Duration::from_secs_f64(lease))
        .position_source(source)
        .start()
        .await?;
    subscription.shutdown_handle().stop_on_signal();
    println!("ready");

    // One delivery at a time, so each shard's effects are written in the shard's order.
    let mut deliveries = subscription;
    while let Some(item) = deliveries.next().await {
        match item {
            Ok(delivery) => settle(&effects, &stream, delivery).await?,
            Err(error) => eprintln!("read error (retried): {}", error.report()),
        }
    }
    println!("stopped");
    Ok(())
}

/// Applies one delivery, then acks it (the position is already in the database, so the lease
/// table's checkpoint may lag: the position source makes up for it).
async fn settle(
    effects: &Effects,
    stream: &str,
    delivery: Delivery<Record>,
) -> Result<(), KinesisError> {
    let shard = delivery.shard_id().to_owned();
    let Some(position) = delivery.position() else {
        delivery.ack();
        return Ok(());
    };
    let record: Record = (*delivery).clone();
    match effects
        .apply(stream.to_owned(), shard.clone(), position.clone(), record)
        .await
    {
        Ok(true) => println!("applied {shard} {}", position.encode()),
        Ok(false) => println!("already applied {shard} {}", position.encode()),
        // The transaction did not commit: the record is delivered again.
        Err(e) => {
            eprintln!("the database failed ({e}); the record is delivered again");
            delivery.retry();
            return Ok(());
        }
    }
    delivery.ack();
    Ok(())
}

//! Moving an application's progress from a KCL lease table into the library's, and back.
//!
//! A [`Migration`] reads the stream's shards, the KCL's leases of the stream and the
//! application's rows, and plans each shard's position on the other side ([`Plan`]); once
//! the plan is seen, [`Migration::apply`] writes it. [`Migration::import`] and
//! [`Migration::export`] do both in one call, for an application that imports at its own
//! start. The `kinesis-dataflow kcl import` / `kcl export` commands are these calls.
//!
//! How positions cross, and why nothing is lost or read twice:
//!
//! - The KCL's checkpoint is the last record processed, (sequence, sub-sequence); it resumes
//!   after it. An import writes the library's checkpoint of the same record: the whole record
//!   settled, or inside a KPL aggregate the user records up to that sub-sequence. To tell
//!   the two apart, it reads the record at the sequence number (one GetShardIterator and
//!   GetRecords per listed shard). An export does the same the other way: a whole aggregate settled
//!   becomes its last user record's sub-sequence.
//! - `SHARD_END` is finished both ways; `TRIM_HORIZON` is "nothing processed, from the
//!   oldest record" both ways.
//! - The KCL's `LATEST` and `AT_TIMESTAMP` hold no position (the KCL takes it from its own
//!   configuration), and the library's "nothing settled, unread from a time" is nothing a
//!   KCL table can hold. Such shards are refused ([`KclError::NeedsPosition`]) unless
//!   [`MigrationOptions::unprocessed_from`] says where their unprocessed records begin. They
//!   never silently become LATEST.
//! - A closed shard the KCL has no lease of, with a descendant that has one, was finished:
//!   the KCL reads children only after their parents and deletes finished leases. It is
//!   imported as finished, so the application does not read it again.
//! - A child with no lease whose parent the stream no longer lists (past retention) but the
//!   KCL table still holds is imported from its start (TRIM_HORIZON), as the KCL reads it:
//!   the application, not seeing that parent, would start the child at its initial position.
//! - Other shards with no lease (children created after the KCL stopped) are left to the
//!   usual rule: a child is read from its start once its parents are finished.
//!
//! Nothing is written while a KCL worker writes a lease of the stream (renews, takes or
//! creates one within the KCL's failover time, ownerless leases included: a worker takes
//! those at once; [`MigrationOptions::force`] overrides it) or while an instance of the
//! application writes a row (always refused). The two fleets must never read
//! one stream at the same time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt};

use crate::api::{ShardDescription, SharedKinesis, list_all_shards};
pub use crate::error::{KclError, KclErrorKind};
use crate::lease::DynamoLeaseStore;
use crate::lease::{Lease, LeaseError, LeaseRow, LeaseStore};
use crate::position::Checkpoint;
use crate::position::StartingPoint;

mod plan;
mod position;
mod row;
mod table;

pub use plan::{Action, Direction, ShardPlan};
pub use position::{RecordShape, Unprocessed, from_kcl, to_kcl};
pub use row::{KclCheckpoint, KclItem, KclLease, KclStreamId};
pub use table::{KclContents, KclTable};

/// The owner an import writes the application's rows as, while it holds them.
pub const IMPORT_OWNER: &str = "kinesis-dataflow-kcl-import";

/// How many records at checkpoints are read at once.
const PEEKS_AT_ONCE: usize = 16;

/// How many empty pages a read of the record at a checkpoint follows before it counts the
/// record as gone.
const PEEK_PAGES: usize = 5;

/// The choices of a migration.
#[derive(Debug, Clone)]
pub struct MigrationOptions {
    /// Where the unprocessed records of a shard begin when the source table holds no
    /// position for it. `None`: such shards are refused.
    pub unprocessed_from: Option<Unprocessed>,
    /// The KCL's failover time: a lease whose counter does not move for this long belongs to
    /// no live worker (the KCL's default: 10 s).
    pub kcl_failover: Duration,
    /// The application's lease duration (the library's default: 10 s): an instance renews
    /// its rows within it.
    pub lease_duration: Duration,
    /// Write even while a KCL worker renews leases of the stream.
    pub force: bool,
    /// Export: write multi-stream rows for this account and stream creation time (seconds
    /// since the Unix epoch). `None`: as the table's rows of the stream are keyed, else
    /// single-stream rows.
    pub multi_stream: Option<(String, u64)>,
    /// Export: create the KCL table when it is missing.
    pub create: bool,
}

impl Default for MigrationOptions {
    fn default() -> Self {
        Self {
            unprocessed_from: None,
            kcl_failover: Duration::from_secs(10),
            lease_duration: Duration::from_secs(10),
            force: false,
            multi_stream: None,
            create: false,
        }
    }
}

/// The plan of an import or an export: each shard's positions on both sides and what
/// happens to it, notes, and the refusal if live workers or instances were seen.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Plan {
    /// Which way.
    pub direction: Direction,
    /// The stream.
    pub stream: String,
    /// The KCL table.
    pub kcl_table: String,
    /// The application's lease table.
    pub app_table: String,
    /// Multi-stream mode: the stream's identifier in the KCL table.
    pub kcl_stream: Option<KclStreamId>,
    /// Every shard the stream lists.
    pub shards: Vec<ShardPlan>,
    /// What the person running it should know.
    pub notes: Vec<String>,
    /// Why it must not be applied, when live workers or instances were seen.
    pub refusal: Option<KclError>,
}

impl Plan {
    /// How many shards it writes.
    #[must_use]
    pub fn writes(&self) -> usize {
        self.shards.iter().filter(|s| s.writes()).count()
    }
}

/// An import or export between a KCL lease table and the application's lease table, for one
/// stream.
///
/// ```no_run
/// # async fn demo() -> Result<(), kinesis_dataflow::kcl::KclError> {
/// use std::sync::Arc;
/// use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore};
/// use kinesis_dataflow::kcl::{KclTable, Migration, MigrationOptions};
///
/// let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
/// let dynamodb = aws_sdk_dynamodb::Client::new(&config);
/// let migration = Migration::new(
///     Arc::new(AwsKinesis::from_conf(&config)),
///     KclTable::new(dynamodb.clone(), "orders-kcl-app")?,
///     DynamoLeaseStore::new(dynamodb, DynamoLeaseStore::default_table_name("orders"))?,
///     "orders",
///     MigrationOptions::default(),
/// );
/// let plan = migration.import().await?;
/// println!("imported {} shards", plan.writes());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Migration {
    kinesis: SharedKinesis,
    kcl: KclTable,
    app: DynamoLeaseStore,
    stream: Arc<str>,
    options: MigrationOptions,
}

impl std::fmt::Debug for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migration")
            .field("kcl", &self.kcl.name())
            .field("app", &self.app.table())
            .field("stream", &self.stream)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What the watch saw move: KCL leases (key, owner) and application owners with their rows.
type Moved = (Vec<(String, String)>, Vec<(String, Vec<String>)>);

impl Migration {
    /// A migration of `stream` between `kcl` and the application's table `app`.
    #[must_use]
    pub fn new(
        kinesis: SharedKinesis,
        kcl: KclTable,
        app: DynamoLeaseStore,
        stream: impl Into<String>,
        options: MigrationOptions,
    ) -> Self {
        Self {
            kinesis,
            kcl,
            app,
            stream: stream.into().into(),
            options,
        }
    }

    /// Plans the import and writes it.
    ///
    /// # Errors
    ///
    /// As [`plan_import`](Self::plan_import) and [`apply`](Self::apply).
    pub async fn import(&self) -> Result<Plan, KclError> {
        let plan = self.plan_import().await?;
        self.apply(&plan).await?;
        Ok(plan)
    }

    /// Plans the export and writes it.
    ///
    /// # Errors
    ///
    /// As [`plan_export`](Self::plan_export) and [`apply`](Self::apply).
    pub async fn export(&self) -> Result<Plan, KclError> {
        let plan = self.plan_export().await?;
        self.apply(&plan).await?;
        Ok(plan)
    }

    /// Reads both tables and the stream, watches for live workers and instances (for the
    /// longer of the KCL's failover time and the lease duration, whether or not a row has an
    /// owner: a KCL worker takes ownerless leases at once), and plans the import. Writes
    /// nothing.
    ///
    /// # Errors
    ///
    /// Bad input ([`KclErrorKind::Input`]): the KCL table is missing, is not a KCL table,
    /// holds no lease of the stream or a malformed one; shards without a position and no
    /// [`MigrationOptions::unprocessed_from`]; the stream is missing. A failed call.
    pub async fn plan_import(&self) -> Result<Plan, KclError> {
        if !self.kcl.exists().await? {
            return Err(KclError::TableNotFound {
                table: self.kcl.name().to_owned(),
            });
        }
        let (mut reading, kcl_stream, moved) = self.read_both(Direction::Import).await?;
        self.check_listed(&reading)?;
        // Leases of shards the stream no longer lists are left as they are: nothing to read.
        let listed = listed_ids(&reading);
        let peeks = reading
            .kcl
            .iter()
            .filter(|l| listed.contains(l.shard_id.as_str()))
            .filter_map(|l| Some((l.shard_id.clone(), position::import_peek(&l.checkpoint)?)))
            .map(|(shard, seq)| (shard, seq.to_owned()))
            .collect();
        reading.shapes = self.peek_all(peeks).await?;
        let unprocessed = self.options.unprocessed_from;
        let (shards, notes) = plan::plan_import(&reading, unprocessed, now_ms())?;
        Ok(self.plan(Direction::Import, kcl_stream, shards, notes, moved))
    }

    /// The same for an export: the application's positions into the KCL table. The KCL
    /// table may be missing when [`MigrationOptions::create`] is set, and may hold no lease
    /// of the stream (an empty table; with [`MigrationOptions::multi_stream`] a multi-stream
    /// table of other streams).
    ///
    /// # Errors
    ///
    /// As [`plan_import`](Self::plan_import), except that a KCL table without leases of the
    /// stream is refused only when it is a multi-stream table of other streams and
    /// [`MigrationOptions::multi_stream`] is not set; the application's table must exist.
    pub async fn plan_export(&self) -> Result<Plan, KclError> {
        let exists = self.kcl.exists().await?;
        if !exists && !self.options.create {
            return Err(KclError::TableNotFound {
                table: self.kcl.name().to_owned(),
            });
        }
        self.app.check_table().await?;
        let (mut reading, kcl_stream, moved) = if exists {
            self.read_both(Direction::Export).await?
        } else {
            self.read_app_only().await?
        };
        // Only listed shards are exported.
        let listed = listed_ids(&reading);
        let peeks = reading
            .app
            .iter()
            .filter(|l| listed.contains(l.shard_id.as_str()))
            .filter_map(|l| {
                let seq = position::export_peek(l.checkpoint.as_ref())?;
                Some((l.shard_id.clone(), seq.to_owned()))
            })
            .collect();
        reading.shapes = self.peek_all(peeks).await?;
        let stream_id = self.given_stream_id().or(kcl_stream);
        let unprocessed = self.options.unprocessed_from;
        let (shards, notes) = plan::plan_export(&reading, unprocessed, stream_id.as_ref())?;
        Ok(self.plan(Direction::Export, stream_id, shards, notes, moved))
    }

    fn plan(
        &self,
        direction: Direction,
        kcl_stream: Option<KclStreamId>,
        shards: Vec<ShardPlan>,
        notes: Vec<String>,
        (kcl_moved, app_moved): Moved,
    ) -> Plan {
        let watched = (
            millis(self.options.kcl_failover),
            millis(self.options.lease_duration),
        );
        Plan {
            direction,
            stream: self.stream.to_string(),
            kcl_table: self.kcl.name().to_owned(),
            app_table: self.app.table().to_owned(),
            kcl_stream,
            shards,
            notes,
            refusal: plan::refusal(
                self.kcl.name(),
                self.app.table(),
                kcl_moved,
                app_moved,
                watched,
                self.options.force,
            ),
        }
    }

    /// Writes a plan: into the application's table (creating it when missing) for an
    /// import, into the KCL's (created when missing and asked for) for an export. Each row
    /// is written on condition that it is still as read.
    ///
    /// # Errors
    ///
    /// The plan's refusal; [`KclError::RowChanged`] when a row changed since it was read; a
    /// failed call. The rows written before the failure keep their new positions.
    pub async fn apply(&self, plan: &Plan) -> Result<(), KclError> {
        if let Some(refusal) = &plan.refusal {
            return Err(refusal.clone());
        }
        match plan.direction {
            Direction::Import => {
                self.app.prepare().await?;
                let listed = list_all_shards(&*self.kinesis, &self.stream).await?;
                for shard in &plan.shards {
                    if let Action::Import(to) = &shard.action {
                        let description = listed.iter().find(|s| s.shard_id == shard.shard_id);
                        self.write_app(shard, description, to).await?;
                    }
                }
            }
            Direction::Export => {
                if self.options.create {
                    self.kcl.create().await?;
                }
                for shard in &plan.shards {
                    if let Action::Export(row) = &shard.action {
                        let expected = shard.kcl.as_ref().map(|k| k.counter);
                        self.kcl.put(row, expected).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes one shard's imported checkpoint: a new row, or the existing one taken, written
    /// and released, or a row of an earlier stream of the same name replaced by the shard's
    /// (in one write, fenced on the row as read).
    async fn write_app(
        &self,
        shard: &ShardPlan,
        description: Option<&ShardDescription>,
        to: &Checkpoint,
    ) -> Result<(), KclError> {
        let changed = || KclError::RowChanged {
            table: self.app.table().to_owned(),
            row: shard.shard_id.clone(),
        };
        let earlier = |row: &Lease| {
            description.is_some_and(|d| row.is_other_generation(&d.starting_sequence_number))
        };
        match &shard.app {
            Some(row) if !earlier(row) => {
                let held = match self.app.take(row, IMPORT_OWNER).await {
                    Err(LeaseError::Lost { .. }) => return Err(changed()),
                    other => other?,
                };
                let written = self.app.checkpoint(&held, to).await?;
                self.app.release(&written).await?;
            }
            // The shard's own row, as the application would make it, is created, or takes
            // the place of a row of an earlier stream of the same name in one write (fenced on
            // the row as read).
            _ => {
                let parents =
                    description.map_or_else(Vec::new, |d| d.parents().map(str::to_owned).collect());
                let mut lease = Lease::new(&*self.stream, &shard.shard_id, parents);
                lease.starting_sequence_number =
                    description.map(|d| d.starting_sequence_number.clone());
                lease.checkpoint = Some(to.clone());
                match &shard.app {
                    Some(row) => match self.app.replace(row, &lease).await {
                        Err(LeaseError::Lost { .. }) => return Err(changed()),
                        other => drop(other?),
                    },
                    None if !self.app.create(&lease).await? => return Err(changed()),
                    None => {}
                }
            }
        }
        Ok(())
    }

    /// Reads the stream's shards and both tables, watching both for live owners.
    async fn read_both(
        &self,
        direction: Direction,
    ) -> Result<(plan::Reading, Option<KclStreamId>, Moved), KclError> {
        let shards = list_all_shards(&*self.kinesis, &self.stream).await?;
        let contents = self.kcl.read().await?;
        let (kcl, kcl_stream) = self.planned_kcl(&contents, direction)?;
        let app = self.app_rows().await?;
        let moved = self
            .watch(Some(&watched_kcl(&contents, &self.stream)), &app)
            .await?;
        let reading = plan::Reading {
            shards,
            kcl,
            app: shard_rows(app),
            shapes: HashMap::new(),
        };
        Ok((reading, kcl_stream, moved))
    }

    /// Reads the stream's shards and the application's table (an export to a new table).
    async fn read_app_only(&self) -> Result<(plan::Reading, Option<KclStreamId>, Moved), KclError> {
        let shards = list_all_shards(&*self.kinesis, &self.stream).await?;
        let app = self.app_rows().await?;
        let moved = self.watch(None, &app).await?;
        let reading = plan::Reading {
            shards,
            kcl: Vec::new(),
            app: shard_rows(app),
            shapes: HashMap::new(),
        };
        Ok((reading, None, moved))
    }

    /// The KCL table's leases the plan goes by, and the stream's identifier in a multi-stream
    /// table. An import needs leases of the stream; an export may fill a table that holds
    /// none: an empty one, or with [`MigrationOptions::multi_stream`] one of other streams.
    fn planned_kcl(
        &self,
        contents: &KclContents,
        direction: Direction,
    ) -> Result<(Vec<KclLease>, Option<KclStreamId>), KclError> {
        if direction == Direction::Export
            && let Some(id) = self.given_stream_id()
        {
            // The rows at the keys the export writes, whichever creation time the table's
            // other rows of the stream have.
            let leases = contents
                .leases
                .iter()
                .filter(|l| l.stream.as_ref() == Some(&id))
                .cloned()
                .collect();
            return Ok((leases, Some(id)));
        }
        let found = contents.of_stream(self.kcl.name(), &self.stream);
        if direction == Direction::Import {
            return found;
        }
        match found {
            Err(KclError::NoRows { .. }) if contents.leases.is_empty() => Ok((Vec::new(), None)),
            Err(KclError::NoRows {
                table,
                stream,
                detail,
            }) => Err(KclError::NoRows {
                table,
                stream,
                detail: format!(
                    "{detail}; give the stream's identifier (--multi-stream ACCOUNT:EPOCH) to \
                     export into it"
                ),
            }),
            other => other,
        }
    }

    /// The stream's identifier given by [`MigrationOptions::multi_stream`].
    fn given_stream_id(&self) -> Option<KclStreamId> {
        let (account, epoch) = self.options.multi_stream.as_ref()?;
        Some(KclStreamId {
            account: account.clone(),
            stream: self.stream.to_string(),
            creation_epoch: *epoch,
        })
    }

    /// The application's rows of the stream (none when its table does not exist yet).
    async fn app_rows(&self) -> Result<Vec<LeaseRow>, KclError> {
        match self.app.list_with_write_times(&self.stream).await {
            Ok(rows) => Ok(rows),
            Err(LeaseError::TableNotFound { .. }) => Ok(Vec::new()),
            Err(other) => Err(other.into()),
        }
    }

    /// Refuses a single-stream KCL table none of whose leases is a shard of the stream.
    fn check_listed(&self, reading: &plan::Reading) -> Result<(), KclError> {
        let listed = |id: &str| reading.shards.iter().any(|s| s.shard_id == id);
        if reading.kcl.iter().any(|l| listed(&l.shard_id)) {
            return Ok(());
        }
        let named: Vec<&str> = reading
            .kcl
            .iter()
            .map(|l| l.shard_id.as_str())
            .take(5)
            .collect();
        Err(KclError::NoRows {
            table: self.kcl.name().to_owned(),
            stream: self.stream.to_string(),
            detail: format!(
                "its leases name shards the stream does not have ({}): is it the table of \
                 another stream?",
                named.join(", ")
            ),
        })
    }

    /// Waits and reads again: a lease or row written meanwhile (renewed, taken, created or
    /// deleted) belongs to a live KCL worker or instance. It waits even when no row has an
    /// owner: a KCL worker takes ownerless leases at once, and an instance creates its rows.
    /// `kcl`: the KCL table's leases of the stream, `None` when the table does not exist; the
    /// KCL side is not watched under `force`.
    async fn watch(&self, kcl: Option<&[KclLease]>, app: &[LeaseRow]) -> Result<Moved, KclError> {
        let kcl = kcl.filter(|_| !self.options.force);
        let wait = match kcl {
            Some(_) => self.options.kcl_failover.max(self.options.lease_duration),
            None => self.options.lease_duration,
        };
        tokio::time::sleep(wait).await;
        let kcl_moved = match kcl {
            Some(before) => {
                let again = watched_kcl(&self.kcl.read().await?, &self.stream);
                moved_kcl(before, &again)
            }
            None => Vec::new(),
        };
        let app_moved = moved_app(app, &self.app_rows().await?);
        Ok((kcl_moved, app_moved))
    }

    /// Reads the record at each (shard, sequence number), a few at once.
    async fn peek_all(
        &self,
        peeks: Vec<(String, String)>,
    ) -> Result<HashMap<String, RecordShape>, KclError> {
        futures::stream::iter(peeks)
            .map(|(shard, seq)| async move {
                let shape = self.peek(&shard, &seq).await?;
                Ok::<_, KclError>((shard, shape))
            })
            .buffer_unordered(PEEKS_AT_ONCE)
            .try_collect()
            .await
    }

    /// What the record at `seq` of `shard` is.
    async fn peek(&self, shard: &str, seq: &str) -> Result<RecordShape, KclError> {
        let at = StartingPoint::AtSequence(seq.to_owned());
        let shard_id: Arc<str> = shard.into();
        let mut iterator = self
            .kinesis
            .get_shard_iterator(&self.stream, shard, &at)
            .await?;
        for _ in 0..PEEK_PAGES {
            let page = self
                .kinesis
                .get_records(&self.stream, &shard_id, iterator, 1)
                .await?;
            if let Some(record) = page.records.first() {
                if record.sequence_number() != seq {
                    return Ok(RecordShape::Gone);
                }
                return Ok(match crate::kpl::unpack(record) {
                    crate::kpl::Unpacked::Users(users) => RecordShape::Aggregate {
                        user_records: users.len() as u64,
                    },
                    _ => RecordShape::Plain,
                });
            }
            match page.next_shard_iterator {
                Some(next) if page.millis_behind_latest != Some(0) => iterator = next,
                _ => break,
            }
        }
        Ok(RecordShape::Gone)
    }
}

/// The ids of the shards the stream lists.
fn listed_ids(reading: &plan::Reading) -> HashSet<String> {
    reading.shards.iter().map(|s| s.shard_id.clone()).collect()
}

/// The rows of shards (not the instances' worker rows).
fn shard_rows(rows: Vec<LeaseRow>) -> Vec<Lease> {
    rows.into_iter()
        .map(|r| r.lease)
        .filter(|l| !l.shard_id.starts_with(crate::lease::WORKER_ROW_PREFIX))
        .collect()
}

/// The leases of the KCL table a worker of the stream may write: in a single-stream table
/// all, in a multi-stream table the stream's under any creation time.
fn watched_kcl(contents: &KclContents, stream: &str) -> Vec<KclLease> {
    contents
        .leases
        .iter()
        .filter(|l| l.stream.as_ref().is_none_or(|id| id.stream == stream))
        .cloned()
        .collect()
}

/// What a row without an owner is reported as.
const NO_OWNER: &str = "(no owner)";

/// KCL leases written between the two reads (counter or owner changed, created or deleted):
/// (key, owner now, else before).
fn moved_kcl(before: &[KclLease], after: &[KclLease]) -> Vec<(String, String)> {
    let was: HashMap<&str, &KclLease> = before.iter().map(|l| (l.lease_key.as_str(), l)).collect();
    let now: HashMap<&str, &KclLease> = after.iter().map(|l| (l.lease_key.as_str(), l)).collect();
    let owner = |l: &KclLease| l.owner.clone();
    let mut moved: Vec<(String, String)> = after
        .iter()
        .filter_map(|now| match was.get(now.lease_key.as_str()) {
            Some(was) if was.counter == now.counter && was.owner == now.owner => None,
            was => Some((
                now.lease_key.clone(),
                owner(now).or_else(|| was.and_then(|w| owner(w))),
            )),
        })
        .chain(
            before
                .iter()
                .filter(|was| !now.contains_key(was.lease_key.as_str()))
                .map(|was| (was.lease_key.clone(), owner(was))),
        )
        .map(|(key, owner)| (key, owner.unwrap_or_else(|| NO_OWNER.to_owned())))
        .collect();
    moved.sort();
    moved
}

/// The application's rows written between the two reads (counter or owner changed, created
/// or deleted), by owner (now, else before).
fn moved_app(before: &[LeaseRow], after: &[LeaseRow]) -> Vec<(String, Vec<String>)> {
    let id = |r: &LeaseRow| r.lease.shard_id.clone();
    let was: HashMap<String, &LeaseRow> = before.iter().map(|r| (id(r), r)).collect();
    let now: HashMap<String, &LeaseRow> = after.iter().map(|r| (id(r), r)).collect();
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |owner: Option<&String>, row: String| {
        let owner = owner.map_or_else(|| NO_OWNER.to_owned(), Clone::clone);
        owners.entry(owner).or_default().push(row);
    };
    for row in after {
        match was.get(&id(row)) {
            Some(w) if w.lease.counter == row.lease.counter && w.lease.owner == row.lease.owner => {
            }
            w => add(
                row.lease
                    .owner
                    .as_ref()
                    .or_else(|| w.and_then(|w| w.lease.owner.as_ref())),
                id(row),
            ),
        }
    }
    for row in before.iter().filter(|r| !now.contains_key(&id(r))) {
        add(row.lease.owner.as_ref(), id(row));
    }
    owners.into_iter().collect()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(key: &str, owner: Option<&str>, counter: u64) -> KclLease {
        KclLease {
            lease_key: key.to_owned(),
            stream: None,
            shard_id: key.to_owned(),
            owner: owner.map(str::to_owned),
            counter,
            owner_switches: 0,
            checkpoint: KclCheckpoint::TrimHorizon,
            parents: Vec::new(),
            children: Vec::new(),
            hash_range: None,
        }
    }

    #[test]
    fn a_lease_taken_or_created_during_the_watch_moved() {
        let before = vec![lease("s0", None, 3), lease("s1", Some("w"), 5)];
        let taken = vec![lease("s0", Some("w2"), 4), lease("s1", Some("w"), 5)];
        assert_eq!(
            moved_kcl(&before, &taken),
            vec![("s0".to_owned(), "w2".to_owned())]
        );
        let created = vec![
            lease("s0", None, 3),
            lease("s1", Some("w"), 5),
            lease("s2", None, 0),
        ];
        assert_eq!(moved_kcl(&before, &created).len(), 1, "a new row");
        assert!(moved_kcl(&before, &before).is_empty());
    }

    fn row(shard: &str, owner: Option<&str>, counter: u64) -> LeaseRow {
        let mut lease = Lease::new("orders", shard, Vec::new());
        lease.owner = owner.map(str::to_owned);
        lease.counter = counter;
        LeaseRow {
            lease,
            last_written_ms: None,
        }
    }

    #[test]
    fn an_application_row_taken_or_created_during_the_watch_moved() {
        let before = vec![row("s0", None, 3)];
        let taken = vec![row("s0", Some("i-1"), 4)];
        assert_eq!(
            moved_app(&before, &taken),
            vec![("i-1".to_owned(), vec!["s0".to_owned()])]
        );
        let created = vec![row("s0", None, 3), row("s1", Some("i-2"), 1)];
        assert_eq!(
            moved_app(&before, &created),
            vec![("i-2".to_owned(), vec!["s1".to_owned()])]
        );
        assert!(moved_app(&before, &before).is_empty());
    }
}

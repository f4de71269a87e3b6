//! The plan of an import or an export, decided over what was read: pure functions.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::api::ShardDescription;
use crate::error::KclError;
use crate::lease::Lease;
use crate::position::{Checkpoint, StartingPoint};

use super::position::{self, RecordShape, Unprocessed};
use super::row::{KclCheckpoint, KclLease, KclStreamId};

/// Which way the positions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the KCL's table into the application's.
    Import,
    /// From the application's table into the KCL's.
    Export,
}

/// What happens to one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Import: this checkpoint is written into the application's lease table.
    Import(Checkpoint),
    /// Export: this row is written into the KCL's table, without an owner.
    Export(Box<KclLease>),
    /// The destination holds this position already.
    Unchanged,
    /// Nothing is written for the shard; why.
    Leave(String),
}

/// One shard of the plan: what both tables hold for it, and what happens to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// The shard id.
    pub shard_id: String,
    /// Whether the stream lists it as closed.
    pub closed: bool,
    /// Its KCL lease, if the KCL table has one.
    pub kcl: Option<KclLease>,
    /// Its row in the application's lease table, if there is one.
    pub app: Option<Lease>,
    /// What happens to it.
    pub action: Action,
}

impl ShardPlan {
    /// Whether the plan writes something for this shard.
    #[must_use]
    pub fn writes(&self) -> bool {
        matches!(self.action, Action::Import(_) | Action::Export(_))
    }
}

/// What was read to plan: the stream's shards, both tables' rows of the stream, and the
/// shape of the records at the checkpoints' sequence numbers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reading {
    pub(crate) shards: Vec<ShardDescription>,
    pub(crate) kcl: Vec<KclLease>,
    pub(crate) app: Vec<Lease>,
    /// By shard id: the record at the sequence number the direction peeks at.
    pub(crate) shapes: HashMap<String, RecordShape>,
}

impl Reading {
    /// Both tables' rows by shard id, built once per plan (a stream may have thousands of
    /// shards).
    fn by_shard(&self) -> (HashMap<&str, &KclLease>, HashMap<&str, &Lease>) {
        let kcl = self.kcl.iter().map(|l| (l.shard_id.as_str(), l)).collect();
        let app = self.app.iter().map(|l| (l.shard_id.as_str(), l)).collect();
        (kcl, app)
    }

    /// Shard id → its children, as the stream lists them.
    fn children(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for shard in &self.shards {
            for parent in shard.parents() {
                children.entry(parent).or_default().push(&shard.shard_id);
            }
        }
        children
    }

    /// KCL leases of shards the stream no longer lists (past the retention period).
    fn unlisted_kcl(&self) -> Vec<&str> {
        let listed: BTreeSet<&str> = self.shards.iter().map(|s| s.shard_id.as_str()).collect();
        self.kcl
            .iter()
            .map(|l| l.shard_id.as_str())
            .filter(|id| !listed.contains(id))
            .collect()
    }
}

/// Whether some descendant of `shard` (child, grandchild, …) satisfies `has`.
fn any_descendant(
    shard: &str,
    children: &BTreeMap<&str, Vec<&str>>,
    has: &dyn Fn(&str) -> bool,
) -> bool {
    let mut stack: Vec<&str> = children.get(shard).cloned().unwrap_or_default();
    let mut seen = BTreeSet::new();
    while let Some(next) = stack.pop() {
        if !seen.insert(next) {
            continue;
        }
        if has(next) {
            return true;
        }
        stack.extend(children.get(next).into_iter().flatten());
    }
    false
}

/// Plans an import: each listed shard's new checkpoint in the application's table.
pub(crate) fn plan_import(
    reading: &Reading,
    unprocessed: Option<Unprocessed>,
    now_ms: u64,
) -> Result<(Vec<ShardPlan>, Vec<String>), KclError> {
    let children = reading.children();
    let (kcl_rows, app_rows) = reading.by_shard();
    let has_row = |id: &str| kcl_rows.contains_key(id);
    let listed: BTreeSet<&str> = reading.shards.iter().map(|s| s.shard_id.as_str()).collect();
    let mut needs = Vec::new();
    let mut notes = unlisted_notes(reading);
    let mut plans = Vec::new();
    for shard in &reading.shards {
        let id = shard.shard_id.as_str();
        let closed = shard.ending_sequence_number.is_some();
        let kcl = kcl_rows.get(id).copied();
        let target = match kcl {
            Some(lease) => {
                let shape = reading.shapes.get(id).copied();
                let mapped =
                    position::from_kcl(&lease.checkpoint, shape, closed, unprocessed, now_ms);
                if mapped.is_none() {
                    needs.push((
                        id.to_owned(),
                        format!("KCL checkpoint {}", lease.checkpoint),
                    ));
                }
                mapped.ok_or(String::new())
            }
            // The KCL reads a child only after its parents and deletes the leases of
            // finished shards: a descendant with a lease means this shard was finished.
            None if any_descendant(id, &children, &has_row) => Ok(Checkpoint::ShardEnd),
            // The KCL reads a child from its start once it is done with its parents; the
            // application, not seeing a parent the stream no longer lists, would take the
            // child for a shard of its frontier and start it at its initial position.
            None if shard.parents().any(|p| !listed.contains(p) && has_row(p)) => {
                notes.push(format!(
                    "{id} has no KCL lease and a parent the stream no longer lists with one: \
                     it is read from its start (TRIM_HORIZON), as the KCL would"
                ));
                Ok(Checkpoint::Start(StartingPoint::TrimHorizon))
            }
            None if shard.parents().next().is_some() => Err(
                "no KCL lease: a child the KCL never opened; the application reads it from \
                 its start once its parents are finished"
                    .to_owned(),
            ),
            None => match unprocessed {
                Some(from) => Ok(position::from_kcl(
                    &KclCheckpoint::Latest,
                    None,
                    closed,
                    Some(from),
                    now_ms,
                )
                .unwrap_or(Checkpoint::ShardEnd)),
                None => {
                    notes.push(format!(
                        "{id} has no KCL lease and no relative with one: the application \
                         starts it at its own initial position (or pass --unprocessed-from)"
                    ));
                    Err("no KCL lease: the application's initial position applies".to_owned())
                }
            },
        };
        let app = app_rows.get(id).map(|l| (*l).clone());
        // A row of an earlier stream of the same name is not this shard's, whatever it holds.
        let earlier =
            (app.as_ref()).is_some_and(|a| a.is_other_generation(&shard.starting_sequence_number));
        let action = match target {
            Ok(to) if !earlier && app.as_ref().and_then(|a| a.checkpoint.as_ref()) == Some(&to) => {
                Action::Unchanged
            }
            Ok(to) => {
                if earlier {
                    notes.push(format!(
                        "{id}: the application's row was written for an earlier stream of the \
                         same name (deleted and created again): the import replaces it"
                    ));
                }
                Action::Import(to)
            }
            Err(why) => Action::Leave(why),
        };
        plans.push(ShardPlan {
            shard_id: id.to_owned(),
            closed,
            kcl: kcl.cloned(),
            app,
            action,
        });
    }
    if !needs.is_empty() {
        return Err(KclError::NeedsPosition { shards: needs });
    }
    let inside: Vec<&str> = plans
        .iter()
        .filter(|p| matches!(p.action, Action::Import(Checkpoint::SubSequence(..))))
        .map(|p| p.shard_id.as_str())
        .collect();
    if !inside.is_empty() {
        notes.push(format!(
            "{} resume inside a KPL aggregate: read them with de-aggregation on \
             (ReadSettings::deaggregate(true)), as the KCL does; without it the whole aggregate \
             is delivered again",
            inside.join(", ")
        ));
    }
    Ok((plans, notes))
}

/// Plans an export: each listed shard's row in the KCL table, keyed for `stream_id`'s mode
/// (`None`: single-stream, keyed by the shard id).
pub(crate) fn plan_export(
    reading: &Reading,
    unprocessed: Option<Unprocessed>,
    stream_id: Option<&KclStreamId>,
) -> Result<(Vec<ShardPlan>, Vec<String>), KclError> {
    let children = reading.children();
    let (_, app_rows) = reading.by_shard();
    // The row each shard's lease key names: the one the write replaces.
    let kcl_rows: HashMap<&str, &KclLease> = reading
        .kcl
        .iter()
        .map(|l| (l.lease_key.as_str(), l))
        .collect();
    let mut needs = Vec::new();
    let mut notes = unlisted_notes(reading);
    let mut plans = Vec::new();
    for shard in &reading.shards {
        let id = shard.shard_id.as_str();
        let closed = shard.ending_sequence_number.is_some();
        let app = app_rows.get(id).map(|l| (*l).clone());
        let key = lease_key(stream_id, id);
        let kcl = kcl_rows.get(key.as_str()).map(|l| (*l).clone());
        let action = match &app {
            None => Action::Leave(
                "no row in the application's table: the KCL creates its lease when it lists \
                 the shard"
                    .to_owned(),
            ),
            Some(lease) => {
                let is_child = shard.parents().next().is_some();
                let shape = reading.shapes.get(id).copied();
                // A row of an earlier stream of the same name says nothing of this shard,
                // which the application would read from its beginning.
                let checkpoint = if lease.is_other_generation(&shard.starting_sequence_number) {
                    notes.push(format!(
                        "{id}: the application's row was written for an earlier stream of the \
                         same name (deleted and created again): exported as TRIM_HORIZON, where \
                         the application would read the shard from"
                    ));
                    Some(Checkpoint::Start(StartingPoint::TrimHorizon))
                } else {
                    lease.checkpoint.clone()
                };
                match position::to_kcl(checkpoint.as_ref(), shape, is_child, unprocessed) {
                    None => {
                        needs.push((
                            id.to_owned(),
                            position::unread_reason(lease.checkpoint.as_ref()),
                        ));
                        Action::Leave(String::new())
                    }
                    Some(checkpoint) => {
                        let row = kcl_row(shard, &children, stream_id, kcl.as_ref(), checkpoint);
                        if kcl
                            .as_ref()
                            .is_some_and(|k| k.owner.is_none() && k.checkpoint == row.checkpoint)
                        {
                            Action::Unchanged
                        } else {
                            Action::Export(Box::new(row))
                        }
                    }
                }
            }
        };
        plans.push(ShardPlan {
            shard_id: id.to_owned(),
            closed,
            kcl,
            app,
            action,
        });
    }
    if !needs.is_empty() {
        return Err(KclError::NeedsPosition { shards: needs });
    }
    if plans
        .iter()
        .any(|p| matches!(&p.action, Action::Export(row) if row.checkpoint == KclCheckpoint::AtTimestamp))
    {
        notes.push(
            "shards written AT_TIMESTAMP are read from the time in the KCL application's own \
             configuration (InitialPositionInStreamExtended.newInitialPositionAtTimestamp)"
                .to_owned(),
        );
    }
    Ok((plans, notes))
}

/// The KCL row of `shard` at `checkpoint`: no owner, the counter moved past the row it
/// replaces (a KCL worker still holding that row fails its next conditional write).
fn kcl_row(
    shard: &ShardDescription,
    children: &BTreeMap<&str, Vec<&str>>,
    stream_id: Option<&KclStreamId>,
    existing: Option<&KclLease>,
    checkpoint: KclCheckpoint,
) -> KclLease {
    let id = &shard.shard_id;
    let finished = checkpoint == KclCheckpoint::ShardEnd;
    KclLease {
        lease_key: lease_key(stream_id, id),
        stream: stream_id.cloned(),
        shard_id: id.clone(),
        owner: None,
        counter: existing.map_or(0, |e| e.counter + 1),
        owner_switches: 0,
        checkpoint,
        parents: shard.parents().map(str::to_owned).collect(),
        // The KCL records a finished shard's children (it creates their leases from them).
        children: match children.get(id.as_str()) {
            Some(ids) if finished => ids.iter().map(|c| (*c).to_owned()).collect(),
            _ => Vec::new(),
        },
        hash_range: Some((
            shard.starting_hash_key.clone(),
            shard.ending_hash_key.clone(),
        )),
    }
}

/// The KCL's lease key of shard `id`: `account:stream:epoch:shard` in multi-stream mode, else
/// the shard id.
fn lease_key(stream_id: Option<&KclStreamId>, id: &str) -> String {
    match stream_id {
        Some(stream) => format!("{stream}:{id}"),
        None => id.to_owned(),
    }
}

/// Notes on KCL leases of shards the stream does not list any more.
fn unlisted_notes(reading: &Reading) -> Vec<String> {
    let unlisted = reading.unlisted_kcl();
    if unlisted.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "KCL leases of shards the stream no longer lists (past its retention period) are left \
         as they are: {}",
        unlisted.join(", ")
    )]
}

/// The refusal, if any: live instances of the application always refuse; live KCL workers
/// refuse unless `force`.
pub(crate) fn refusal(
    kcl_table: &str,
    app_table: &str,
    kcl_moved: Vec<(String, String)>,
    app_moved: Vec<(String, Vec<String>)>,
    watched_ms: (u64, u64),
    force: bool,
) -> Option<KclError> {
    if !app_moved.is_empty() {
        return Some(KclError::InstancesLive {
            table: app_table.to_owned(),
            owners: app_moved,
            lease_duration_ms: watched_ms.1,
        });
    }
    (!kcl_moved.is_empty() && !force).then(|| KclError::KclWorkersAlive {
        table: kcl_table.to_owned(),
        leases: kcl_moved,
        failover_ms: watched_ms.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parents: &[&str], closed: bool) -> ShardDescription {
        ShardDescription {
            shard_id: id.to_owned(),
            parent_shard_id: parents.first().map(|p| (*p).to_owned()),
            adjacent_parent_shard_id: parents.get(1).map(|p| (*p).to_owned()),
            starting_hash_key: "0".to_owned(),
            ending_hash_key: "9".to_owned(),
            starting_sequence_number: "1".to_owned(),
            ending_sequence_number: closed.then(|| "9".to_owned()),
        }
    }

    fn kcl(id: &str, checkpoint: KclCheckpoint) -> KclLease {
        KclLease {
            lease_key: id.to_owned(),
            stream: None,
            shard_id: id.to_owned(),
            owner: Some("w".to_owned()),
            counter: 3,
            owner_switches: 0,
            checkpoint,
            parents: Vec::new(),
            children: Vec::new(),
            hash_range: None,
        }
    }

    fn split() -> Vec<ShardDescription> {
        vec![
            shard("s0", &[], true),
            shard("s1", &["s0"], false),
            shard("s2", &["s0"], false),
        ]
    }

    #[test]
    fn a_parent_whose_lease_the_kcl_deleted_is_finished_and_new_children_wait() {
        let reading = Reading {
            shards: split(),
            kcl: vec![kcl(
                "s1",
                KclCheckpoint::Sequence {
                    sequence: "5".into(),
                    sub_sequence: 0,
                },
            )],
            ..Reading::default()
        };
        let (plans, _) = plan_import(&reading, None, 0).expect("a plan");
        assert_eq!(plans[0].action, Action::Import(Checkpoint::ShardEnd));
        assert_eq!(
            plans[1].action,
            Action::Import(Checkpoint::Sequence("5".into()))
        );
        assert!(matches!(plans[2].action, Action::Leave(_)));
    }

    #[test]
    fn a_child_of_an_unlisted_parent_with_a_lease_is_read_from_its_start() {
        // s0 is past retention; the KCL's lease of it is not finished, and s1 has no lease.
        let reading = Reading {
            shards: vec![shard("s1", &["s0"], false), shard("s2", &["gone"], false)],
            kcl: vec![kcl(
                "s0",
                KclCheckpoint::Sequence {
                    sequence: "5".into(),
                    sub_sequence: 0,
                },
            )],
            ..Reading::default()
        };
        let (plans, notes) = plan_import(&reading, None, 0).expect("a plan");
        assert_eq!(
            plans[0].action,
            Action::Import(Checkpoint::Start(StartingPoint::TrimHorizon))
        );
        assert!(notes.iter().any(|n| n.contains("s1")), "{notes:?}");
        // A parent without a lease says nothing: the usual rule applies.
        assert!(matches!(plans[1].action, Action::Leave(_)));
    }

    #[test]
    fn latest_rows_are_refused_with_their_shards_named_unless_told() {
        let reading = Reading {
            shards: vec![shard("s0", &[], false), shard("s1", &[], false)],
            kcl: vec![
                kcl("s0", KclCheckpoint::Latest),
                kcl("s1", KclCheckpoint::AtTimestamp),
            ],
            ..Reading::default()
        };
        let message = plan_import(&reading, None, 0)
            .expect_err("refused")
            .to_string();
        assert!(message.contains("s0 (KCL checkpoint LATEST)"), "{message}");
        assert!(
            message.contains("s1 (KCL checkpoint AT_TIMESTAMP)"),
            "{message}"
        );
        let (plans, _) = plan_import(&reading, Some(Unprocessed::Horizon), 0).expect("a plan");
        assert!(
            plans
                .iter()
                .all(|p| p.action == Action::Import(Checkpoint::Start(StartingPoint::TrimHorizon)))
        );
    }

    #[test]
    fn an_export_writes_ownerless_rows_past_the_old_counter() {
        let mut app = Lease::new("orders", "s0", Vec::new());
        app.checkpoint = Some(Checkpoint::ShardEnd);
        let mut child = Lease::new("orders", "s1", vec!["s0".into()]);
        child.checkpoint = Some(Checkpoint::SubSequence("7".into(), 2));
        let reading = Reading {
            shards: split(),
            kcl: vec![kcl("s0", KclCheckpoint::TrimHorizon)],
            app: vec![app, child],
            ..Reading::default()
        };
        let (plans, _) = plan_export(&reading, None, None).expect("a plan");
        let Action::Export(parent) = &plans[0].action else {
            panic!("{:?}", plans[0].action)
        };
        assert_eq!((parent.owner.as_ref(), parent.counter), (None, 4));
        assert_eq!(parent.children, vec!["s1".to_owned(), "s2".to_owned()]);
        let Action::Export(child) = &plans[1].action else {
            panic!("{:?}", plans[1].action)
        };
        assert_eq!(child.parents, vec!["s0".to_owned()]);
        assert_eq!(
            child.checkpoint,
            KclCheckpoint::Sequence {
                sequence: "7".into(),
                sub_sequence: 2
            }
        );
        assert!(matches!(plans[2].action, Action::Leave(_)));
    }

    /// The application's row of s0 was written for an earlier stream of the same name (the
    /// stream was deleted and created again): an export writes where the application would
    /// read the new shard from (its beginning), not the earlier stream's SHARD_END; an import
    /// replaces that row even when its checkpoint is the one imported.
    #[test]
    fn rows_of_an_earlier_stream_are_not_taken_for_the_shards_own() {
        let mut earlier = Lease::new("orders", "s0", Vec::new());
        earlier.checkpoint = Some(Checkpoint::ShardEnd);
        earlier.starting_sequence_number = Some("0-earlier".into());
        let reading = Reading {
            shards: vec![shard("s0", &[], false)],
            kcl: vec![kcl("s0", KclCheckpoint::ShardEnd)],
            app: vec![earlier],
            ..Reading::default()
        };
        let (plans, notes) = plan_export(&reading, None, None).expect("a plan");
        let Action::Export(row) = &plans[0].action else {
            panic!("{:?}", plans[0].action)
        };
        assert_eq!(row.checkpoint, KclCheckpoint::TrimHorizon);
        assert!(
            notes.iter().any(|n| n.contains("earlier stream")),
            "{notes:?}"
        );

        let (plans, notes) = plan_import(&reading, None, 0).expect("a plan");
        assert_eq!(plans[0].action, Action::Import(Checkpoint::ShardEnd));
        assert!(notes.iter().any(|n| n.contains("replaces it")), "{notes:?}");
        // The shard's own row holding that checkpoint already is left as it is.
        let mut own = reading.app[0].clone();
        own.starting_sequence_number = Some("1".into());
        let reading = Reading {
            app: vec![own],
            ..reading
        };
        let (plans, _) = plan_import(&reading, None, 0).expect("a plan");
        assert_eq!(plans[0].action, Action::Unchanged);
        let (plans, _) = plan_export(&reading, None, None).expect("a plan");
        assert!(
            matches!(&plans[0].action, Action::Export(row) if row.checkpoint == KclCheckpoint::ShardEnd)
        );
    }

    #[test]
    fn live_instances_refuse_even_with_force() {
        let app_live = vec![("i-1".to_owned(), vec!["s0".to_owned()])];
        let kcl_live = vec![("s0".to_owned(), "w".to_owned())];
        assert!(matches!(
            refusal("k", "a", kcl_live.clone(), app_live, (10, 10), true),
            Some(KclError::InstancesLive { .. })
        ));
        assert!(refusal("k", "a", kcl_live.clone(), Vec::new(), (10, 10), true).is_none());
        assert!(matches!(
            refusal("k", "a", kcl_live, Vec::new(), (10, 10), false),
            Some(KclError::KclWorkersAlive { .. })
        ));
    }
}

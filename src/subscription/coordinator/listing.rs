//! The listing job: the stream's shards, the lease rows, and the rows of new shards created
//! (parents before children, as [`lineage::new_rows`] decides them).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures::future::join_all;
use tokio::time::Instant;

use super::lineage::{self, Frontier};
use super::opening;
use super::shared::Shared;
use crate::api::{ShardDescription, ShardEvents, list_all_shards};
use crate::error::{KinesisError, Operation};
use crate::lease::{Lease, LeaseError};
use crate::position::{Checkpoint, KinesisPosition, StartingPoint};

/// How many times one listing reads the table again after another instance created some of
/// the same rows first.
const CREATE_ROUNDS: usize = 3;

/// The stream and the table, as one listing saw them.
#[derive(Debug)]
pub(crate) struct Listing {
    pub(crate) shards: Vec<ShardDescription>,
    /// Every row of the stream (shards and workers), by id.
    pub(crate) rows: BTreeMap<String, Lease>,
    /// The tips fetched for the rows this listing created (see [`NewRowRule::fetch_tips`]).
    pub(crate) tips: HashMap<String, Tip>,
    /// False when the table was not read (the shards were as at the last scan; see
    /// [`NewRowRule::unless_shards`]): `rows` is then empty.
    pub(crate) scanned: bool,
    /// Other instances declared gone through the anchor row of their liveness group (see
    /// [`declared_elsewhere`]): their leases here are free at once.
    pub(crate) declared: HashSet<String>,
}

/// The shards of a listing as far as the lease table cares: each shard's id, its starting
/// sequence number (a stream created again in the same shape differs in it) and whether it
/// is closed.
pub(crate) type ShardSet = Vec<(String, String, bool)>;

/// The shortest time between two reads of the table asked for by events (the roster row
/// moved, a shard finished), when the listing interval is not shorter.
pub(crate) const MIN_SCAN_GAP: Duration = Duration::from_secs(1);

/// When the table is read.
///
/// Every listing asks Kinesis for the shards, but the table is read only when something may
/// have changed for this instance: the shards changed, an event asked for it ([`Self::forced`]:
/// the roster row moved, a shard finished, a hand-off is due), or a safety interval passed,
/// the listing interval times the number of instances, so the whole fleet reads the table
/// about once per listing interval however many instances it has.
#[derive(Debug, Default)]
pub(crate) struct Scans {
    /// The next listing reads the table whatever the shards.
    pub(crate) forced: bool,
    /// When the table was last read, and the shards then.
    last: Option<(Instant, ShardSet)>,
    /// The instances sharing at the last read.
    live_workers: usize,
}

impl Scans {
    /// The shards to compare with for a listing starting at `now`; `None` when the table must
    /// be read in any case. A forced read is no longer pending once asked for.
    pub(crate) fn skip_unless_changed(
        &mut self,
        now: Instant,
        list_interval: Duration,
    ) -> Option<ShardSet> {
        let (at, shards) = self.last.as_ref()?;
        let workers = u32::try_from(self.live_workers.max(1)).unwrap_or(u32::MAX);
        let due = *at + list_interval.saturating_mul(workers);
        if std::mem::take(&mut self.forced) || now >= due {
            return None;
        }
        Some(shards.clone())
    }

    /// The table was read at `now`.
    pub(crate) fn scanned(&mut self, now: Instant, shards: ShardSet, live_workers: usize) {
        self.last = Some((now, shards));
        self.live_workers = live_workers;
    }

    /// The earliest an event may have the table read again.
    pub(crate) fn earliest_next(&self, now: Instant, list_interval: Duration) -> Instant {
        let gap = MIN_SCAN_GAP.min(list_interval);
        self.last
            .as_ref()
            .map_or(now, |(at, _)| (*at + gap).max(now))
    }
}

/// The [`ShardSet`] of `shards`.
pub(crate) fn shard_set(shards: &[ShardDescription]) -> ShardSet {
    let mut set: ShardSet = shards
        .iter()
        .map(|s| {
            let closed = s.ending_sequence_number.is_some();
            (
                s.shard_id.clone(),
                s.starting_sequence_number.clone(),
                closed,
            )
        })
        .collect();
    set.sort();
    set
}

/// The tip of a shard fixed right before this instance created the shard's row: a LATEST
/// iterator, or with enhanced fan-out a subscription at LATEST.
///
/// Any other instance learns of the shard from that row (it reads it, or fails to create it),
/// so the position was fixed before any other instance's `start` could return counting the
/// shard: a reader opened there misses nothing another instance promised. LATEST asked for at
/// the take instead could come after another instance returned and records were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tip {
    pub(crate) at: TipAt,
    /// When the request was sent.
    pub(crate) asked: SystemTime,
}

/// What fixes a [`Tip`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TipAt {
    Iterator(String),
    Subscription(SharedEvents),
}

/// A subscription's events, handed over once (to the reader of the shard).
#[derive(Clone)]
pub(crate) struct SharedEvents(Arc<Mutex<Option<ShardEvents>>>);

impl SharedEvents {
    fn new(events: ShardEvents) -> Self {
        Self(Arc::new(Mutex::new(Some(events))))
    }

    /// The events, unless they were taken already.
    pub(crate) fn take(&self) -> Option<ShardEvents> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl PartialEq for SharedEvents {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedEvents {}

impl fmt::Debug for SharedEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedEvents")
    }
}

/// Why a listing failed.
#[derive(Debug)]
pub(crate) enum ListingFailure {
    /// ListShards failed.
    Kinesis(KinesisError),
    /// The lease table could not be read or written.
    Table(LeaseError),
    /// A setting cannot apply to the stream as listed (see [`NewRowRule::refuse_unlisted`]).
    Refused(KinesisError),
}

impl From<LeaseError> for ListingFailure {
    fn from(e: LeaseError) -> Self {
        Self::Table(e)
    }
}

/// Where new frontier shards begin, owned so the job can run on its own.
#[derive(Debug, Clone)]
pub(crate) struct NewRowRule {
    pub(crate) position: Option<KinesisPosition>,
    pub(crate) tip: StartingPoint,
    /// Rows nobody held at the previous listing (free, or not written for the lease
    /// duration): a row of an earlier stream of the same name among them may be replaced.
    pub(crate) replaceable: HashSet<String>,
    /// Each shard's starting sequence number as this instance's last listing that read the
    /// table knew it ([`generation_after`]): a listed shard that has no row and began
    /// elsewhere then is of the stream created again since, and is read from its beginning.
    /// (Its earlier rows were removed meanwhile: an instance found the stream deleted, see
    /// [`end_when_deleted`](crate::subscription::SubscriptionConfig::end_when_deleted).)
    pub(crate) known: Arc<HashMap<String, String>>,
    /// Fetch a [`Tip`] for each new row that begins at `tip` before creating it (while
    /// `start` runs).
    pub(crate) fetch_tips: bool,
    /// Read the table only if the shards differ from these (the shards at the last scan);
    /// `None`: read it in any case.
    pub(crate) unless_shards: Option<ShardSet>,
    /// A `start_at` naming one shard, while `start` runs: refused (before any row is created)
    /// when the stream does not list that shard.
    pub(crate) refuse_unlisted: Option<KinesisPosition>,
}

/// Lists the shards and the rows, and creates the rows of shards that have none.
pub(crate) async fn list(shared: Arc<Shared>, rule: NewRowRule) -> Result<Listing, ListingFailure> {
    let shards = list_shards(&shared)
        .await
        .map_err(ListingFailure::Kinesis)?;
    if let Some(refusal) = (rule.refuse_unlisted.as_ref())
        .and_then(|start_at| opening::unlisted_refusal(&shared.stream, start_at, &shards))
    {
        return Err(ListingFailure::Refused(refusal));
    }
    if rule.unless_shards.as_ref() == Some(&shard_set(&shards)) {
        return Ok(Listing {
            shards,
            rows: BTreeMap::new(),
            tips: HashMap::new(),
            scanned: false,
            declared: HashSet::new(),
        });
    }
    let mut rows = scan(&shared).await?;
    let mut tips = HashMap::new();
    let mut created = HashSet::new();
    for _ in 0..CREATE_ROUNDS {
        let earlier = earlier_streams_rows(&shards, &rows, &rule.replaceable);
        let recreated: HashSet<String> = (earlier.keys().cloned())
            .chain(created_again(&shards, &rows, &rule.known))
            .collect();
        let frontier = Frontier {
            position: rule.position.as_ref(),
            tip: rule.tip.clone(),
            recreated: &recreated,
        };
        let new = if earlier.is_empty() {
            lineage::new_rows(&shared.stream, &shards, &rows, &frontier)
        } else {
            // Decided as if those rows were gone; each is then replaced in one write.
            let mut rest = rows.clone();
            rest.retain(|id, _| !earlier.contains_key(id));
            lineage::new_rows(&shared.stream, &shards, &rest, &frontier)
        };
        if new.is_empty() {
            break;
        }
        if rule.fetch_tips {
            fetch_tips(&shared, &new, &rule.tip, &mut tips).await;
        }
        if create_all(&shared, new, &earlier, &mut rows, &mut created).await? {
            break;
        }
        // Another instance created or replaced some first: its rows are the ones to go by.
        rows = scan(&shared).await?;
    }
    tips.retain(|shard, _| created.contains(shard));
    let declared = declared_elsewhere(&shared, &rows).await;
    Ok(Listing {
        shards,
        rows,
        tips,
        scanned: true,
        declared,
    })
}

/// The other instances whose worker row here names a liveness group anchored on another
/// stream, and whose anchor row, read now (after the listing), is released and names the
/// same group: they were declared gone, and every reader of theirs has stopped (see
/// [`crate::subscription::group`]). An anchor row missing, held, or naming another group (a
/// later start) declares nothing; neither does a failed read (the leases then wait for their
/// expiry).
pub(crate) async fn declared_elsewhere(
    shared: &Shared,
    rows: &BTreeMap<String, Lease>,
) -> HashSet<String> {
    let me = shared.config.owner.as_str();
    let mut by_anchor: BTreeMap<&str, BTreeMap<String, (&str, &str)>> = BTreeMap::new();
    for row in rows.values() {
        let (Some(owner), Some(group)) = (row.owner.as_deref(), row.liveness_group.as_deref())
        else {
            continue;
        };
        let Some(anchor) = crate::subscription::group::anchor_of(group) else {
            continue;
        };
        if owner == me
            || anchor == &*shared.stream
            || super::plan::worker_owner(&row.shard_id).is_none()
        {
            continue;
        }
        let id = super::worker::worker_row_id(owner);
        by_anchor
            .entry(anchor)
            .or_default()
            .insert(id, (owner, group));
    }
    let mut declared = HashSet::new();
    for (anchor, wanted) in by_anchor {
        let ids: Vec<String> = wanted.keys().cloned().collect();
        let read = match shared.store.get(anchor, &ids).await {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!(anchor, error = %e, "could not read the anchor rows of other instances' liveness groups; their leases wait for their expiry");
                continue;
            }
        };
        for row in read {
            let Some((owner, group)) = wanted.get(&row.shard_id) else {
                continue;
            };
            if row.owner.is_none() && row.liveness_group.as_deref() == Some(*group) {
                declared.insert((*owner).to_owned());
            }
        }
    }
    declared
}

/// Fetches a LATEST iterator for each of the `new` rows that begin at `tip` and have none yet,
/// side by side within the work bound. A failed request leaves the shard without one: it then
/// opens at the time the subscription started.
async fn fetch_tips(
    shared: &Shared,
    new: &[Lease],
    tip: &StartingPoint,
    tips: &mut HashMap<String, Tip>,
) {
    let begins_at_tip = Some(Checkpoint::Initial(tip.clone()));
    let wanted: Vec<&str> = new
        .iter()
        .filter(|row| row.checkpoint == begins_at_tip && !tips.contains_key(&row.shard_id))
        .map(|row| row.shard_id.as_str())
        .collect();
    let fetched = join_all(wanted.iter().map(|&shard| async move {
        let _permit = shared.permits.acquire().await;
        let asked = SystemTime::now();
        match tokio::time::timeout(shared.config.call_timeout(), fix_tip(shared, shard)).await {
            Ok(Ok(at)) => Some(Tip { at, asked }),
            Ok(Err(e)) => {
                tracing::debug!(shard, error = %e, "no tip fixed; the shard opens at the start time");
                None
            }
            Err(_) => None,
        }
    }))
    .await;
    for (shard, tip) in wanted.into_iter().zip(fetched) {
        if let Some(tip) = tip {
            tips.insert(shard.to_owned(), tip);
        }
    }
}

/// The rows of listed shards that were written for an earlier stream of the same name, when
/// nobody holds them: each is replaced by the new shard's row, read from its beginning.
fn earlier_streams_rows(
    shards: &[ShardDescription],
    rows: &BTreeMap<String, Lease>,
    replaceable: &HashSet<String>,
) -> BTreeMap<String, Lease> {
    shards
        .iter()
        .filter_map(|shard| {
            rows.get(&shard.shard_id)
                .filter(|row| lineage::is_other_generation(row, shard))
                .filter(|row| row.owner.is_none() || replaceable.contains(&row.shard_id))
                .map(|row| (row.shard_id.clone(), row.clone()))
        })
        .collect()
}

/// The listed shards that have no row and began elsewhere at this instance's last listing
/// (see [`NewRowRule::known`]).
fn created_again(
    shards: &[ShardDescription],
    rows: &BTreeMap<String, Lease>,
    known: &HashMap<String, String>,
) -> Vec<String> {
    shards
        .iter()
        .filter(|shard| !rows.contains_key(&shard.shard_id))
        .filter(|shard| {
            known
                .get(&shard.shard_id)
                .is_some_and(|seq| *seq != shard.starting_sequence_number)
        })
        .map(|shard| shard.shard_id.clone())
        .collect()
}

/// Each shard's starting sequence number as this instance knows it after a listing that read
/// the table (see [`NewRowRule::known`]): the listed shard's when its row is of this stream;
/// the row's own when it is an earlier stream's (not replaced yet: held); as known before when
/// the shard has no row (another instance created it first at each try). So a row of the
/// earlier stream removed later (by an instance that found that stream deleted) still leaves
/// the shard known as created again.
pub(crate) fn generation_after(
    before: &HashMap<String, String>,
    shards: &[ShardDescription],
    rows: &BTreeMap<String, Lease>,
) -> HashMap<String, String> {
    shards
        .iter()
        .filter_map(|shard| {
            let id = &shard.shard_id;
            let seq = match rows.get(id) {
                Some(row) if lineage::is_other_generation(row, shard) => {
                    row.starting_sequence_number.clone()?
                }
                Some(_) => shard.starting_sequence_number.clone(),
                None => before.get(id)?.clone(),
            };
            Some((id.clone(), seq))
        })
        .collect()
}

async fn list_shards(shared: &Shared) -> Result<Vec<ShardDescription>, KinesisError> {
    let timeout = shared.config.call_timeout();
    match tokio::time::timeout(
        timeout,
        list_all_shards(shared.api.as_ref(), &shared.stream),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(KinesisError::Service {
            operation: Operation::ListShards,
            stream: shared.stream.to_string(),
            message: format!("no answer within {timeout:?}"),
            source: None,
        }),
    }
}

async fn scan(shared: &Shared) -> Result<BTreeMap<String, Lease>, LeaseError> {
    Ok(shared
        .store
        .list(&shared.stream)
        .await?
        .into_iter()
        .map(|l| (l.shard_id.clone(), l))
        .collect())
}

/// Fixes the tip of `shard`: a LATEST iterator, or with enhanced fan-out a subscription.
async fn fix_tip(shared: &Shared, shard: &str) -> Result<TipAt, KinesisError> {
    let latest = StartingPoint::Latest;
    match &shared.config.consumer_arn {
        Some(arn) => {
            let shard: Arc<str> = shard.into();
            let events = shared
                .api
                .subscribe_to_shard(&shared.stream, arn, &shard, &latest)
                .await?;
            Ok(TipAt::Subscription(SharedEvents::new(events)))
        }
        None => {
            let iterator = shared
                .api
                .get_shard_iterator(&shared.stream, shard, &latest)
                .await?;
            Ok(TipAt::Iterator(iterator))
        }
    }
}

/// Creates `new` level by level (a row only once the rows of its new parents exist), each
/// level side by side within the work bound; a row of `earlier` (an earlier stream's) is
/// replaced instead, in one write. Notes the rows it wrote in `created`. Returns false when
/// another instance created or replaced one of them first.
async fn create_all(
    shared: &Shared,
    new: Vec<Lease>,
    earlier: &BTreeMap<String, Lease>,
    rows: &mut BTreeMap<String, Lease>,
    created: &mut HashSet<String>,
) -> Result<bool, LeaseError> {
    let mut depth: HashMap<String, usize> = HashMap::new();
    for lease in &new {
        let d = lease
            .parents
            .iter()
            .filter_map(|p| depth.get(p))
            .map(|d| d + 1)
            .max()
            .unwrap_or(0);
        depth.insert(lease.shard_id.clone(), d);
    }
    let deepest = depth.values().copied().max().unwrap_or(0);
    for level in 0..=deepest {
        let batch: Vec<&Lease> = new.iter().filter(|l| depth[&l.shard_id] == level).collect();
        let results = join_all(batch.iter().map(|lease| async {
            let _permit = shared.permits.acquire().await;
            write_new_row(shared, lease, earlier.get(&lease.shard_id)).await
        }))
        .await;
        let mut raced = false;
        for (lease, result) in batch.into_iter().zip(results) {
            match result? {
                Some(written) => {
                    if written.checkpoint == Some(Checkpoint::ShardEnd) {
                        tracing::info!(shard = %written.shard_id, "a closed shard nothing will read (the subscription began after it): recorded as finished");
                    }
                    created.insert(lease.shard_id.clone());
                    rows.insert(lease.shard_id.clone(), written);
                }
                None => raced = true,
            }
        }
        if raced {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Creates `lease`'s row, or puts it in place of `earlier` (a row of an earlier stream of the
/// same name) in one write; `None` when another instance wrote the row first.
async fn write_new_row(
    shared: &Shared,
    lease: &Lease,
    earlier: Option<&Lease>,
) -> Result<Option<Lease>, LeaseError> {
    let Some(earlier) = earlier else {
        let created = shared.store.create(lease).await?;
        return Ok(created.then(|| lease.clone()));
    };
    match shared.store.replace(earlier, lease).await {
        Ok(written) => {
            tracing::info!(shard = %lease.shard_id, "the row of a shard of an earlier stream of the same name was replaced; the new shard is read from its beginning");
            Ok(Some(written))
        }
        Err(e) if e.is_lost() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(id: &str, starting: &str) -> ShardDescription {
        ShardDescription {
            shard_id: id.to_owned(),
            parent_shard_id: None,
            adjacent_parent_shard_id: None,
            starting_hash_key: "0".into(),
            ending_hash_key: "1".into(),
            starting_sequence_number: starting.to_owned(),
            ending_sequence_number: None,
        }
    }

    #[test]
    fn a_shard_without_a_row_that_began_elsewhere_at_the_last_listing_was_created_again() {
        let shards = [listed("a", "20"), listed("b", "21"), listed("c", "22")];
        let known: HashMap<String, String> = [("a", "10"), ("b", "21"), ("d", "13")]
            .map(|(id, seq)| (id.to_owned(), seq.to_owned()))
            .into();
        let mut rows = BTreeMap::new();
        // `a` began at 10 then, 20 now: created again. `b` is as it was; `c` is new.
        assert_eq!(created_again(&shards, &rows, &known), ["a"]);
        // A row of `a` (the stream created again's, or an earlier one's: replaced apart)
        // decides.
        rows.insert("a".to_owned(), Lease::new("s", "a", vec![]));
        assert!(created_again(&shards, &rows, &known).is_empty());
        // A stream created again in the same shape is a change of shards: the table is read.
        assert_ne!(
            shard_set(&shards),
            shard_set(&[listed("a", "10"), listed("b", "21"), listed("c", "22")])
        );
    }

    #[test]
    fn a_shard_is_known_by_the_stream_its_row_is_of() {
        let shards = [
            listed("a", "20"),
            listed("b", "21"),
            listed("c", "22"),
            listed("e", "24"),
        ];
        let before: HashMap<String, String> = [("a", "10"), ("b", "11"), ("c", "12"), ("d", "13")]
            .map(|(id, seq)| (id.to_owned(), seq.to_owned()))
            .into();
        let row = |id: &str, seq: &str| {
            let mut row = Lease::new("s", id, vec![]);
            row.starting_sequence_number = Some(seq.to_owned());
            (id.to_owned(), row)
        };
        // `a`: a row of this stream. `b`: an earlier stream's row, still held. `c`: no row
        // (created elsewhere meanwhile, not seen yet). `d`: not listed. `e`: new, no row.
        let rows: BTreeMap<String, Lease> = [row("a", "20"), row("b", "11")].into();
        let after = generation_after(&before, &shards, &rows);
        let expected: HashMap<String, String> = [("a", "20"), ("b", "11"), ("c", "12")]
            .map(|(id, seq)| (id.to_owned(), seq.to_owned()))
            .into();
        assert_eq!(after, expected);
        // `b`'s earlier row removed later: the shard is still known as created again.
        assert_eq!(created_again(&shards, &BTreeMap::new(), &after), ["b", "c"]);
    }

    #[test]
    fn the_table_is_read_when_the_shards_change_when_asked_and_at_the_safety_interval() {
        let interval = Duration::from_secs(10);
        let t0 = Instant::now();
        let shards: ShardSet = vec![
            ("a".into(), "1".into(), false),
            ("b".into(), "2".into(), true),
        ];
        let mut scans = Scans::default();
        assert_eq!(scans.skip_unless_changed(t0, interval), None, "first");
        scans.scanned(t0, shards.clone(), 3);
        // Three instances: each reads the table every 30 s unless something changed.
        let later = t0 + Duration::from_secs(29);
        assert_eq!(
            scans.skip_unless_changed(later, interval),
            Some(shards.clone())
        );
        assert_eq!(
            scans.skip_unless_changed(t0 + Duration::from_secs(30), interval),
            None
        );
        scans.forced = true;
        assert_eq!(scans.skip_unless_changed(later, interval), None);
        assert!(!scans.forced, "asked for once");
        // Events read it again a second after the last read at the soonest.
        assert_eq!(scans.earliest_next(t0, interval), t0 + MIN_SCAN_GAP);
        assert_eq!(scans.earliest_next(later, interval), later);
        assert_eq!(
            scans.earliest_next(t0, Duration::from_millis(300)),
            t0 + Duration::from_millis(300)
        );
    }
}

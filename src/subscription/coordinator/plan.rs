//! What one listing decides for this instance: which leases to take, which held shards to hand
//! off, and which rows nobody needs any more. Pure functions over the table as listed and what
//! this instance holds; the coordinator carries the plan out.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::api::ShardDescription;
use crate::lease::{Lease, WorkerLimits};

/// The prefix of the lease rows that record live instances (one per owner).
pub(crate) const WORKER_PREFIX: &str = crate::lease::WORKER_ROW_PREFIX;

/// The row whose counter moves whenever the set of instances changes (one joined, left, or
/// was declared gone), so the others list again at once. Its id is the worker prefix alone,
/// which no owner id can give (an owner id is never empty).
pub(crate) const ROSTER_ROW: &str = WORKER_PREFIX;

/// The owner a worker row stands for; `None` for shard rows and the roster row.
pub(crate) fn worker_owner(id: &str) -> Option<&str> {
    id.strip_prefix(WORKER_PREFIX)
        .filter(|owner| !owner.is_empty())
}

/// The owners declared gone: another instance saw their worker row unchanged for the lease
/// duration and released it. Their leases are free at once.
pub(crate) fn declared_gone(rows: &BTreeMap<String, Lease>) -> HashSet<&str> {
    rows.values()
        .filter(|row| row.owner.is_none())
        .filter_map(|row| worker_owner(&row.shard_id))
        .collect()
}

/// How many stale rows one listing deletes at most.
pub(crate) const MAX_DELETES_PER_LISTING: usize = 16;

/// What this instance holds or is busy with, as the plan sees it.
#[derive(Debug, Default)]
pub(crate) struct Holdings {
    /// Shards being read.
    pub(crate) held: BTreeSet<String>,
    /// Shards whose take is under way.
    pub(crate) taking: BTreeSet<String>,
    /// Shards being handed back (in-flight deliveries settling): not taken again meanwhile.
    pub(crate) releasing: BTreeSet<String>,
}

impl Holdings {
    /// True when the shard is held, being taken or being released here.
    pub(crate) fn has(&self, shard: &str) -> bool {
        self.held.contains(shard) || self.taking.contains(shard) || self.releasing.contains(shard)
    }
}

/// The table as one listing saw it, and this instance's part in it.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    /// Every row of the stream, by id.
    pub(crate) rows: &'a BTreeMap<String, Lease>,
    /// The listed shards.
    pub(crate) shards: &'a [ShardDescription],
    /// This instance's owner id.
    pub(crate) owner: &'a str,
    /// What this instance holds or is busy with.
    pub(crate) holdings: &'a Holdings,
    /// True for a row nobody has written for the lease duration (on this instance's clock).
    pub(crate) expired: &'a dyn Fn(&Lease) -> bool,
    /// This instance's capacity and bound.
    pub(crate) limits: WorkerLimits,
}

/// The shares decided by one listing.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Shares {
    /// How many shards this instance should read.
    pub(crate) target: usize,
    /// How many instances share the shards (this one included when it can work).
    pub(crate) live_workers: usize,
    /// Leases to take, in listing order.
    pub(crate) take: Vec<Lease>,
    /// Held shards to hand off gracefully.
    pub(crate) hand_off: Vec<String>,
    /// Shards beyond what the sharing instances may hold together (their `max_leases`).
    pub(crate) beyond_bounds: usize,
}

/// Decides this instance's share of the `eligible` shards.
///
/// * The instances that share are the live worker rows of others, and this one while it can
///   do the work (`can_work`): an instance that cannot reach Kinesis takes nothing and does
///   not count, so the others take what it cannot read. An instance declared gone
///   ([`declared_gone`]) takes nothing until it holds a worker row again.
/// * The shards shared are the eligible ones not pinned by a live holder that does not share
///   (one that withdrew its worker row keeps reading what it holds).
/// * Shares differ by one at most ([`fair_targets`]): 4 shards on 3 instances are 2/1/1, the
///   extra shard going to the first instance in owner order.
/// * A lease is free when nobody holds it, this instance holds it (a view it lost), its
///   holder has not written it for the lease duration (`expired`), or its holder was declared
///   gone.
/// * Above its target an instance hands off the held shards last in shard order, so the
///   instances agree on which shards move without talking to each other, and only as many as
///   the instances below their targets cannot take from free leases. Nothing is handed off
///   while this instance is the only worker, or while it cannot work (its readers stop on
///   their own if they fail; a brief failure must not move every shard). The caller paces
///   the hand-offs ([`hand_off_budget`]).
pub(crate) fn shares(view: &View<'_>, eligible: &[&Lease], can_work: bool) -> Shares {
    let View {
        rows,
        owner,
        holdings,
        expired,
        limits,
        ..
    } = view;
    let declared = declared_gone(rows);
    let can_work = can_work && !declared.contains(owner);
    let mut members = other_members(view);
    let live_workers = (members.len() + usize::from(can_work)).max(1);
    let free = |lease: &Lease| match lease.owner.as_deref() {
        None => true,
        Some(holder) => holder == *owner || expired(lease) || declared.contains(holder),
    };
    let (pinned, unheld) = count_holders(eligible, holdings, &free, &mut members);
    let mine = holdings.held.len() + holdings.taking.len();
    let mut counts: Vec<Member<'_>> = members
        .iter()
        .map(|(owner, (held, limits))| Member::new(owner, *held, *limits))
        .collect();
    if can_work {
        counts.push(Member::new(owner, mine, *limits));
    }
    let shared = eligible.len() - pinned;
    let targets = fair_targets(shared, &counts);
    let beyond_bounds = shared.saturating_sub(targets.values().map(|t| t.target).sum());
    let target = if can_work { targets[*owner].target } else { 0 };
    let take = (eligible.iter())
        .filter(|lease| !holdings.has(&lease.shard_id) && free(lease))
        .take(target.saturating_sub(mine))
        .map(|lease| (*lease).clone())
        .collect();
    // Only what the others lack below their floor is handed off: an instance holding one of
    // the extra shards keeps it rather than passing it to another that would hold it instead.
    let wanting: usize = (counts.iter())
        .filter(|m| m.owner != *owner)
        .map(|m| targets[m.owner].floor.saturating_sub(m.held))
        .sum();
    let excess = (mine.saturating_sub(target)).min(wanting.saturating_sub(unheld));
    let hand_off = if excess > 0 && live_workers > 1 && can_work {
        holdings.held.iter().rev().take(excess).cloned().collect()
    } else {
        Vec::new()
    };
    Shares {
        target,
        live_workers,
        take,
        hand_off,
        beyond_bounds,
    }
}

/// The other instances with a live worker row, each with no shard counted yet and its limits.
fn other_members<'a>(view: &View<'a>) -> BTreeMap<&'a str, (usize, WorkerLimits)> {
    let (rows, owner, expired) = (view.rows, view.owner, view.expired);
    rows.values()
        .filter(|row| row.owner.is_some() && !expired(row))
        .filter_map(|row| Some((worker_owner(&row.shard_id)?, row.limits.unwrap_or_default())))
        .filter(|(o, _)| *o != owner)
        .map(|(o, limits)| (o, (0, limits)))
        .collect()
}

/// Counts, over the `eligible` shards this instance neither holds nor takes, those each
/// member holds, and returns how many are pinned (held live by an instance that does not
/// share) and how many are unheld (free, or being handed back by this instance).
fn count_holders(
    eligible: &[&Lease],
    holdings: &Holdings,
    free: &dyn Fn(&Lease) -> bool,
    members: &mut BTreeMap<&str, (usize, WorkerLimits)>,
) -> (usize, usize) {
    let (mut pinned, mut unheld) = (0, 0);
    for lease in eligible {
        if holdings.releasing.contains(&lease.shard_id) {
            // Free as soon as its in-flight deliveries settle.
            unheld += 1;
            continue;
        }
        if holdings.has(&lease.shard_id) {
            continue;
        }
        match lease.owner.as_deref() {
            _ if free(lease) => unheld += 1,
            Some(holder) => match members.get_mut(holder) {
                Some((count, _)) => *count += 1,
                None => pinned += 1,
            },
            None => {}
        }
    }
    (pinned, unheld)
}

/// One sharing instance as [`fair_targets`] sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member<'a> {
    pub(crate) owner: &'a str,
    /// How many of the shared shards it holds now.
    pub(crate) held: usize,
    /// Its capacity relative to the others' (at least 1).
    pub(crate) weight: u64,
    /// The most it reads at once.
    pub(crate) max: usize,
}

impl<'a> Member<'a> {
    pub(crate) fn new(owner: &'a str, held: usize, limits: WorkerLimits) -> Self {
        Self {
            owner,
            held,
            weight: u64::from(limits.weight.max(1)),
            max: limits
                .max_leases
                .map_or(usize::MAX, |max| usize::try_from(max).unwrap_or(usize::MAX)),
        }
    }
}

/// One member's part of the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    /// How many it should read.
    pub(crate) target: usize,
    /// Its proportional part rounded down (its bound, when bounded): what the others make up
    /// for by handing shards off when it holds fewer.
    pub(crate) floor: usize,
}

/// Splits `shards` over `members` in proportion to their weights, none above its bound:
///
/// * a member whose proportional part is above its bound gets its bound, and the rest is
///   split again among the others (shards beyond every bound are nobody's);
/// * each of the others gets its proportional part rounded down, and the shards left over go
///   one each to the largest fractions, then to the first members in owner order. With equal
///   weights the targets differ by one at most.
///
/// Nothing depends on what the members hold now, so every instance computes the same targets
/// whatever it has seen of the others' holdings at that moment (a rule that followed the
/// holdings could leave a released shard in nobody's share while two instances each saw the
/// other as the one to take it).
pub(crate) fn fair_targets<'a>(shards: usize, members: &[Member<'a>]) -> HashMap<&'a str, Target> {
    let mut open: Vec<&Member<'a>> = members.iter().collect();
    open.sort_by(|a, b| a.owner.cmp(b.owner));
    let mut targets = HashMap::new();
    let mut left = shards as u128;
    loop {
        let total: u128 = open.iter().map(|m| u128::from(m.weight)).sum();
        let (capped, rest): (Vec<&Member<'a>>, Vec<&Member<'a>>) = open
            .iter()
            .partition(|m| left * u128::from(m.weight) > m.max as u128 * total);
        if capped.is_empty() || total == 0 {
            break;
        }
        for m in capped {
            let max = Target {
                target: m.max,
                floor: m.max,
            };
            targets.insert(m.owner, max);
            left -= m.max as u128;
        }
        open = rest;
    }
    let total: u128 = open.iter().map(|m| u128::from(m.weight)).sum();
    if total == 0 {
        return targets;
    }
    let mut given = 0u128;
    let mut fractions: Vec<(u128, &str)> = Vec::new();
    for m in &open {
        let exact = left * u128::from(m.weight);
        given += exact / total;
        let floor = usize::try_from(exact / total).unwrap_or(usize::MAX);
        targets.insert(
            m.owner,
            Target {
                target: floor,
                floor,
            },
        );
        fractions.push((exact % total, m.owner));
    }
    // Largest fraction first; owner order among equals (the sort is stable).
    fractions.sort_by_key(|f| std::cmp::Reverse(f.0));
    let extra = usize::try_from(left - given).unwrap_or(usize::MAX);
    for (_, owner) in fractions.into_iter().take(extra) {
        if let Some(part) = targets.get_mut(owner) {
            part.target += 1;
        }
    }
    targets
}

/// How many shards an instance with this `target` and this `excess` over it hands off per
/// listing interval at most: half its excess, or a tenth of its target when that is more, and
/// at least two. A join then moves a little at a time from each instance instead of stopping a
/// large part of every instance's reading at once, while an instance holding far too many (the
/// first one of a fleet starting) sheds them in a few intervals.
pub(crate) fn hand_off_budget(target: usize, excess: usize) -> usize {
    (target / 10).max(excess / 2).max(2)
}

/// The rows nobody needs any more, at most [`MAX_DELETES_PER_LISTING`]:
///
/// * another instance's worker row nobody has written for the lease duration (it stopped
///   without deleting it, or crashed; a row released to declare its owner gone goes a lease
///   duration after the release); never the roster row. The caller's `expired` must judge
///   worker rows by the lease duration too, not the worker timeout: the watch declares a
///   stale worker row gone, which frees its leases, and a row deleted before that leaves them
///   to their own expiry;
/// * the row of a shard the stream has not listed for `unlisted_for` (past the retention
///   period: nothing to read, no child waits for it), not held here, and not written for the
///   lease duration.
///
/// (Rows of a shard of an earlier stream of the same name are replaced by the listing itself.)
pub(crate) fn stale_rows(
    view: &View<'_>,
    unlisted_since: &HashMap<String, Instant>,
    now: Instant,
    unlisted_for: Duration,
) -> Vec<Lease> {
    let View {
        rows,
        shards,
        owner,
        holdings,
        expired,
        ..
    } = view;
    let listed: HashSet<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
    rows.values()
        .filter(|row| {
            if row.shard_id.starts_with(WORKER_PREFIX) {
                return worker_owner(&row.shard_id).is_some_and(|o| o != *owner) && expired(row);
            }
            if holdings.has(&row.shard_id) {
                return false;
            }
            !listed.contains(row.shard_id.as_str())
                && expired(row)
                && unlisted_since
                    .get(&row.shard_id)
                    .is_some_and(|since| now.saturating_duration_since(*since) >= unlisted_for)
        })
        .take(MAX_DELETES_PER_LISTING)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: &str, owner: Option<&str>) -> Lease {
        let mut lease = Lease::new("s", id, vec![]);
        lease.owner = owner.map(str::to_owned);
        lease
    }

    fn table(leases: Vec<Lease>) -> BTreeMap<String, Lease> {
        leases
            .into_iter()
            .map(|l| (l.shard_id.clone(), l))
            .collect()
    }

    fn never(_: &Lease) -> bool {
        false
    }

    fn ids(leases: &[Lease]) -> Vec<&str> {
        leases.iter().map(|l| l.shard_id.as_str()).collect()
    }

    fn share(
        rows: &BTreeMap<String, Lease>,
        eligible: &[&Lease],
        owner: &str,
        holdings: &Holdings,
        can_work: bool,
        expired: &dyn Fn(&Lease) -> bool,
    ) -> Shares {
        let view = View {
            rows,
            shards: &[],
            owner,
            holdings,
            expired,
            limits: WorkerLimits::default(),
        };
        shares(&view, eligible, can_work)
    }

    #[test]
    fn an_instance_takes_its_share_of_free_shards_and_counts_live_workers() {
        let rows = table(vec![
            lease("0", None),
            lease("1", None),
            lease("2", Some("b")),
            lease("3", None),
            lease("worker:a", Some("a")),
            lease("worker:b", Some("b")),
        ]);
        let eligible: Vec<&Lease> = ["0", "1", "2", "3"].iter().map(|id| &rows[*id]).collect();
        let plan = share(&rows, &eligible, "a", &Holdings::default(), true, &never);
        assert_eq!((plan.live_workers, plan.target), (2, 2));
        assert_eq!(ids(&plan.take), ["0", "1"]);
        assert!(plan.hand_off.is_empty());
    }

    #[test]
    fn an_expired_holder_loses_its_shards_and_does_not_count() {
        let rows = table(vec![
            lease("0", Some("b")),
            lease("1", Some("b")),
            lease("worker:b", Some("b")),
        ]);
        let eligible: Vec<&Lease> = ["0", "1"].iter().map(|id| &rows[*id]).collect();
        let expired = |l: &Lease| l.owner.as_deref() == Some("b");
        let plan = share(&rows, &eligible, "a", &Holdings::default(), true, &expired);
        assert_eq!((plan.live_workers, plan.target), (1, 2));
        assert_eq!(ids(&plan.take), ["0", "1"]);
    }

    #[test]
    fn the_leases_of_an_instance_declared_gone_are_free_at_once() {
        let rows = table(vec![
            lease("0", Some("b")),
            lease("1", Some("b")),
            lease("2", Some("c")),
            lease("worker:a", Some("a")),
            lease("worker:b", None),
            lease("worker:c", Some("c")),
            lease(ROSTER_ROW, Some("c")),
        ]);
        let eligible: Vec<&Lease> = ["0", "1", "2"].iter().map(|id| &rows[*id]).collect();
        let plan = share(&rows, &eligible, "a", &Holdings::default(), true, &never);
        // b is gone (not counted, its leases free); c is live, the roster row is nobody. Of
        // the three shards, a (first in owner order) gets two.
        assert_eq!((plan.live_workers, plan.target), (2, 2));
        assert_eq!(ids(&plan.take), ["0", "1"]);
        // b itself, back before it holds a worker row again, takes nothing.
        let plan = share(&rows, &eligible, "b", &Holdings::default(), true, &never);
        assert_eq!(plan.target, 0);
        assert!(plan.take.is_empty());
        assert_eq!(declared_gone(&rows).into_iter().collect::<Vec<_>>(), ["b"]);
        assert_eq!(worker_owner(ROSTER_ROW), None);
        assert_eq!(worker_owner("shardId-1"), None);
    }

    #[test]
    fn above_the_target_the_last_shards_are_handed_off() {
        let rows = table(vec![
            lease("0", Some("a")),
            lease("1", Some("a")),
            lease("2", Some("a")),
            lease("3", Some("a")),
            lease("worker:b", Some("b")),
        ]);
        let eligible: Vec<&Lease> = rows
            .values()
            .filter(|l| !l.shard_id.starts_with('w'))
            .collect();
        let holdings = Holdings {
            held: ["0", "1", "2", "3"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            ..Holdings::default()
        };
        let plan = share(&rows, &eligible, "a", &holdings, true, &never);
        assert_eq!(plan.target, 2);
        assert_eq!(plan.hand_off, ["3", "2"]);
        assert!(plan.take.is_empty());
        // Alone, or unable to work: nothing moves.
        let alone = table(
            rows.values()
                .filter(|l| l.shard_id != "worker:b")
                .cloned()
                .collect(),
        );
        assert!(
            share(&alone, &eligible, "a", &holdings, true, &never)
                .hand_off
                .is_empty()
        );
        assert!(
            share(&rows, &eligible, "a", &holdings, false, &never)
                .hand_off
                .is_empty()
        );
    }

    fn held(ids: &[&str]) -> Holdings {
        Holdings {
            held: ids.iter().map(|s| (*s).to_owned()).collect(),
            ..Holdings::default()
        }
    }

    #[test]
    fn shares_differ_by_one_at_most_and_agree_between_instances() {
        let member = |owner, held| Member::new(owner, held, WorkerLimits::default());
        let targets = fair_targets(4, &[member("a", 2), member("b", 2), member("c", 0)]);
        assert_eq!(
            (
                targets["a"].target,
                targets["b"].target,
                targets["c"].target
            ),
            (2, 1, 1)
        );
        // The same targets whatever the holdings are seen to be.
        let targets = fair_targets(10, &[member("b", 7), member("a", 0), member("c", 3)]);
        assert_eq!(
            (
                targets["a"].target,
                targets["b"].target,
                targets["c"].target
            ),
            (4, 3, 3)
        );
        assert_eq!(
            fair_targets(2, &[member("a", 0), member("b", 0), member("c", 0)])["c"].target,
            0
        );
        assert!(fair_targets(5, &[]).is_empty());
    }

    #[test]
    fn capacities_weigh_the_shares_and_bounds_cap_them() {
        let limits = |weight, max_leases| WorkerLimits { weight, max_leases };
        let member = |owner, weight, max| Member::new(owner, 0, limits(weight, max));
        // Weight 2 reads twice as many.
        let t = fair_targets(
            12,
            &[
                member("a", 2, None),
                member("b", 1, None),
                member("c", 1, None),
            ],
        );
        assert_eq!((t["a"].target, t["b"].target, t["c"].target), (6, 3, 3));
        // A bound: the rest is split among the others.
        let t = fair_targets(
            12,
            &[
                member("a", 1, None),
                member("b", 1, None),
                member("c", 1, Some(2)),
            ],
        );
        assert_eq!((t["a"].target, t["b"].target, t["c"].target), (5, 5, 2));
        // Bounds below the shards: the rest is nobody's.
        let t = fair_targets(12, &[member("a", 1, Some(3)), member("b", 5, Some(4))]);
        assert_eq!((t["a"].target, t["b"].target), (3, 4));
        // Leftovers go to the largest fractions: 10 over weights 1, 1, 3 is 2, 2, 6.
        let t = fair_targets(
            10,
            &[
                member("a", 1, None),
                member("b", 1, None),
                member("c", 3, None),
            ],
        );
        assert_eq!((t["a"].target, t["b"].target, t["c"].target), (2, 2, 6));
        let t = fair_targets(
            7,
            &[
                member("a", 1, None),
                member("b", 1, None),
                member("c", 3, None),
            ],
        );
        assert_eq!(
            (t["a"].target, t["b"].target, t["c"].target),
            (2, 1, 4),
            "1.4, 1.4, 4.2: the first 0.4 in owner order"
        );
    }

    #[test]
    fn a_bound_in_a_worker_row_counts_for_everyone_and_shards_beyond_all_bounds_are_said() {
        let mut bounded = lease("worker:b", Some("b"));
        bounded.limits = Some(WorkerLimits {
            weight: 1,
            max_leases: Some(1),
        });
        let rows = table(vec![
            lease("0", None),
            lease("1", None),
            lease("2", None),
            lease("worker:a", Some("a")),
            bounded,
        ]);
        let eligible: Vec<&Lease> = ["0", "1", "2"].iter().map(|id| &rows[*id]).collect();
        let plan = share(&rows, &eligible, "a", &Holdings::default(), true, &never);
        assert_eq!(plan.target, 2);
        assert_eq!(plan.beyond_bounds, 0);
        let view = View {
            rows: &rows,
            shards: &[],
            owner: "a",
            holdings: &Holdings::default(),
            expired: &never,
            limits: WorkerLimits {
                weight: 1,
                max_leases: Some(1),
            },
        };
        let plan = shares(&view, &eligible, true);
        assert_eq!((plan.target, plan.beyond_bounds), (1, 1));
    }

    #[test]
    fn an_instance_holding_an_extra_shard_keeps_it() {
        // One shard, two instances: either may hold it; it does not move to the first in
        // owner order just because that one came back.
        let rows = table(vec![
            lease("0", Some("b")),
            lease("worker:a", Some("a")),
            lease("worker:b", Some("b")),
        ]);
        let eligible: Vec<&Lease> = vec![&rows["0"]];
        let plan = share(&rows, &eligible, "b", &held(&["0"]), true, &never);
        assert_eq!(plan.target, 0);
        assert!(plan.hand_off.is_empty());
        let plan = share(&rows, &eligible, "a", &Holdings::default(), true, &never);
        assert_eq!(plan.target, 1);
        assert!(plan.take.is_empty());
    }

    #[test]
    fn four_shards_on_three_instances_end_two_one_one() {
        let rows = table(vec![
            lease("0", Some("a")),
            lease("1", Some("a")),
            lease("2", Some("b")),
            lease("3", Some("b")),
            lease("worker:a", Some("a")),
            lease("worker:b", Some("b")),
            lease("worker:c", Some("c")),
        ]);
        let eligible: Vec<&Lease> = ["0", "1", "2", "3"].iter().map(|id| &rows[*id]).collect();
        // a keeps two (first in owner order), b hands one off.
        let plan = share(&rows, &eligible, "a", &held(&["0", "1"]), true, &never);
        assert_eq!(plan.target, 2);
        assert!(plan.hand_off.is_empty());
        let plan = share(&rows, &eligible, "b", &held(&["2", "3"]), true, &never);
        assert_eq!(
            (plan.target, plan.hand_off.clone()),
            (1, vec!["3".to_owned()])
        );
        let plan = share(&rows, &eligible, "c", &Holdings::default(), true, &never);
        assert_eq!(plan.target, 1);
        assert!(plan.take.is_empty(), "nothing free yet");
    }

    #[test]
    fn nothing_is_handed_off_that_free_leases_can_make_up_for() {
        let rows = table(vec![
            lease("0", Some("a")),
            lease("1", Some("a")),
            lease("2", Some("a")),
            lease("3", None),
            lease("worker:a", Some("a")),
            lease("worker:b", Some("b")),
        ]);
        let eligible: Vec<&Lease> = ["0", "1", "2", "3"].iter().map(|id| &rows[*id]).collect();
        // a holds 3 of 4, target 2: b wants 2, one of which is free, so a hands off one.
        let plan = share(&rows, &eligible, "a", &held(&["0", "1", "2"]), true, &never);
        assert_eq!(plan.hand_off, ["2"]);
        // A shard a is handing back already counts as free.
        let releasing = Holdings {
            held: ["0", "1"].iter().map(|s| (*s).to_owned()).collect(),
            releasing: ["2".to_owned()].into(),
            ..Holdings::default()
        };
        let plan = share(&rows, &eligible, "a", &releasing, true, &never);
        assert!(plan.hand_off.is_empty());
    }

    #[test]
    fn hand_offs_are_paced_by_the_target_and_the_excess() {
        assert_eq!(hand_off_budget(0, 1), 2);
        assert_eq!(hand_off_budget(47, 3), 4);
        assert_eq!(hand_off_budget(333, 167), 83);
        assert_eq!(hand_off_budget(50, 950), 475);
    }

    #[test]
    fn an_instance_that_cannot_work_takes_nothing_and_leaves_its_count_to_others() {
        let rows = table(vec![
            lease("0", None),
            lease("1", None),
            lease("worker:b", Some("b")),
        ]);
        let eligible: Vec<&Lease> = ["0", "1"].iter().map(|id| &rows[*id]).collect();
        let plan = share(&rows, &eligible, "a", &Holdings::default(), false, &never);
        assert_eq!((plan.live_workers, plan.target), (1, 0));
        assert!(plan.take.is_empty());
        // Seen from b: a is not counted (no row), so b's share is everything.
        let plan = share(&rows, &eligible, "b", &Holdings::default(), true, &never);
        assert_eq!(plan.target, 2);
    }

    #[test]
    fn shards_being_taken_or_released_are_not_taken_again() {
        let rows = table(vec![lease("0", None), lease("1", None), lease("2", None)]);
        let eligible: Vec<&Lease> = rows.values().collect();
        let holdings = Holdings {
            taking: ["0".to_owned()].into(),
            releasing: ["1".to_owned()].into(),
            ..Holdings::default()
        };
        let plan = share(&rows, &eligible, "a", &holdings, true, &never);
        assert_eq!(ids(&plan.take), ["2"]);
    }

    #[test]
    fn stale_rows_are_expired_workers_and_shards_unlisted_long_enough() {
        let now = Instant::now();
        let rows = table(vec![
            lease("0", None),
            lease("9", None),
            lease("8", None),
            lease("worker:a", Some("a")),
            lease("worker:b", Some("b")),
            lease("worker:c", Some("c")),
        ]);
        let listed = vec![ShardDescription {
            shard_id: "0".into(),
            parent_shard_id: None,
            adjacent_parent_shard_id: None,
            starting_hash_key: "0".into(),
            ending_hash_key: "1".into(),
            starting_sequence_number: "2".into(),
            ending_sequence_number: None,
        }];
        let unlisted: HashMap<String, Instant> = [
            ("9".to_owned(), now - Duration::from_secs(30)),
            ("8".to_owned(), now - Duration::from_secs(1)),
        ]
        .into();
        let expired = |l: &Lease| l.shard_id != "worker:c";
        let view = |holdings| View {
            rows: &rows,
            shards: &listed,
            owner: "a",
            holdings,
            expired: &expired,
            limits: WorkerLimits::default(),
        };
        let nothing = Holdings::default();
        let stale = stale_rows(&view(&nothing), &unlisted, now, Duration::from_secs(20));
        assert_eq!(ids(&stale), ["9", "worker:b"]);
        // Nothing held here is deleted.
        let holdings = Holdings {
            held: ["9".to_owned()].into(),
            ..Holdings::default()
        };
        let stale = stale_rows(&view(&holdings), &unlisted, now, Duration::from_secs(20));
        assert_eq!(ids(&stale), ["worker:b"]);
    }
}

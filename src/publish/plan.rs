//! Which records go into the next PutRecords call: the batch splitter and the ordering rule.
//!
//! The plan knows each record's key and size, never its data. A publish runs in rounds:
//! [`Plan::start_round`] makes every record not yet stored eligible (in
//! [`KeyOrder::Strict`], only the first such record of each key), [`Plan::next_call`] takes
//! the eligible records in input order up to the call limits, and the call's outcome is fed
//! back with [`Plan::stored`] and [`Plan::failed`]. A failure blocks its key for the rest of
//! the round: no later record of that key is handed out until the next round, where the
//! failed record comes first again.

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::settings::KeyOrder;

/// The most records and bytes one call may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallLimits {
    /// Records per call.
    pub(crate) records: usize,
    /// Bytes (data and partition keys) per call.
    pub(crate) bytes: usize,
}

/// The state of one publish: what is stored, what is eligible, which keys are blocked.
#[derive(Debug)]
pub(crate) struct Plan {
    order: KeyOrder,
    limits: CallLimits,
    /// The key id of each record.
    key: Vec<usize>,
    /// The size of each record.
    size: Vec<usize>,
    /// Per key, its records not stored yet, in input order.
    queues: Vec<VecDeque<usize>>,
    /// Per key, whether a record of it failed this round.
    blocked: Vec<bool>,
    /// The records that may go into the next call of this round.
    ready: BTreeSet<usize>,
    /// How many records are not stored yet.
    unstored: usize,
}

impl Plan {
    /// A plan for records with these partition keys and sizes (both in input order).
    pub(crate) fn new<'k>(
        keys: impl IntoIterator<Item = &'k str>,
        size: Vec<usize>,
        order: KeyOrder,
        limits: CallLimits,
    ) -> Self {
        let mut ids: HashMap<&str, usize> = HashMap::new();
        let mut queues: Vec<VecDeque<usize>> = Vec::new();
        let key: Vec<usize> = keys
            .into_iter()
            .enumerate()
            .map(|(index, k)| {
                let id = *ids.entry(k).or_insert_with(|| {
                    queues.push(VecDeque::new());
                    queues.len() - 1
                });
                queues[id].push_back(index);
                id
            })
            .collect();
        debug_assert_eq!(key.len(), size.len());
        Self {
            order,
            limits,
            unstored: key.len(),
            blocked: vec![false; queues.len()],
            key,
            size,
            queues,
            ready: BTreeSet::new(),
        }
    }

    /// The key id of record `index` (records share an id exactly when they share a key).
    pub(crate) fn key_of(&self, index: usize) -> usize {
        self.key[index]
    }

    /// How many records are not stored yet.
    pub(crate) fn unstored(&self) -> usize {
        self.unstored
    }

    /// Starts a round: unblocks every key and makes the records not stored yet eligible.
    pub(crate) fn start_round(&mut self) {
        self.blocked.fill(false);
        self.ready.clear();
        for queue in &self.queues {
            match self.order {
                KeyOrder::Batched => self.ready.extend(queue.iter().copied()),
                KeyOrder::Strict => self.ready.extend(queue.front().copied()),
            }
        }
    }

    /// The records of the next call of this round, in input order, or `None` when the round
    /// is over. A call is the longest run of eligible records, in input order, within the
    /// record and byte limits (at least one record, so an oversized record cannot stall it).
    pub(crate) fn next_call(&mut self) -> Option<Vec<usize>> {
        let mut call = Vec::new();
        let mut bytes = 0usize;
        for &index in &self.ready {
            let size = self.size[index];
            let full = call.len() == self.limits.records
                || (!call.is_empty() && bytes.saturating_add(size) > self.limits.bytes);
            if full {
                break;
            }
            bytes = bytes.saturating_add(size);
            call.push(index);
        }
        for index in &call {
            self.ready.remove(index);
        }
        (!call.is_empty()).then_some(call)
    }

    /// Record `index` was stored. In [`KeyOrder::Strict`] the key's next record becomes
    /// eligible (unless the key is blocked).
    pub(crate) fn stored(&mut self, index: usize) {
        let key = self.key[index];
        let queue = &mut self.queues[key];
        if queue.front() == Some(&index) {
            queue.pop_front();
        } else if let Some(at) = queue.iter().position(|&i| i == index) {
            queue.remove(at);
        } else {
            return; // already counted
        }
        self.unstored -= 1;
        if self.order == KeyOrder::Strict
            && !self.blocked[key]
            && let Some(&next) = queue.front()
        {
            self.ready.insert(next);
        }
    }

    /// Record `index` failed: its key is blocked for the rest of the round, so none of the
    /// key's later records is sent before the failed one is stored.
    pub(crate) fn failed(&mut self, index: usize) {
        let key = self.key[index];
        if std::mem::replace(&mut self.blocked[key], true) {
            return;
        }
        for later in &self.queues[key] {
            self.ready.remove(later);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::settings::{MAX_BYTES_PER_CALL, MAX_RECORD_BYTES, MAX_RECORDS_PER_CALL};

    const SERVICE: CallLimits = CallLimits {
        records: MAX_RECORDS_PER_CALL,
        bytes: MAX_BYTES_PER_CALL,
    };

    fn new_plan(keys: &[String], sizes: Vec<usize>, order: KeyOrder, limits: CallLimits) -> Plan {
        let mut plan = Plan::new(keys.iter().map(String::as_str), sizes, order, limits);
        plan.start_round();
        plan
    }

    /// Every call of one round where everything is stored.
    fn run_round(plan: &mut Plan) -> Vec<Vec<usize>> {
        let mut calls = Vec::new();
        while let Some(call) = plan.next_call() {
            for &i in &call {
                plan.stored(i);
            }
            calls.push(call);
        }
        calls
    }

    fn keys(n: usize, distinct: usize) -> Vec<String> {
        (0..n).map(|i| format!("key-{}", i % distinct)).collect()
    }

    #[test]
    fn calls_hold_at_most_500_records_in_input_order() {
        let mut plan = new_plan(&keys(1200, 7), vec![10; 1200], KeyOrder::Batched, SERVICE);
        let calls = run_round(&mut plan);
        assert_eq!(
            calls.iter().map(Vec::len).collect::<Vec<_>>(),
            [500, 500, 200]
        );
        let flat: Vec<usize> = calls.concat();
        assert_eq!(flat, (0..1200).collect::<Vec<_>>());
        assert_eq!(plan.unstored(), 0);

        let mut exact = plan_of(500, 1);
        assert_eq!(run_round(&mut exact).len(), 1, "500 records are one call");
        let mut over = plan_of(501, 1);
        assert_eq!(
            run_round(&mut over)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            [500, 1]
        );
    }

    fn plan_of(n: usize, size: usize) -> Plan {
        new_plan(&keys(n, 3), vec![size; n], KeyOrder::Batched, SERVICE)
    }

    #[test]
    fn calls_hold_at_most_5_mib() {
        // Five records of exactly 1 MiB fill a call to the byte; the sixth starts the next.
        let mut plan = plan_of(6, MAX_RECORD_BYTES);
        assert_eq!(
            run_round(&mut plan)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            [5, 1]
        );
        // Sizes summing to exactly 5 MiB are one call; one byte more is two.
        let fill = MAX_BYTES_PER_CALL - 4 * MAX_RECORD_BYTES;
        let mut exact = new_plan(
            &keys(5, 5),
            vec![
                MAX_RECORD_BYTES,
                MAX_RECORD_BYTES,
                MAX_RECORD_BYTES,
                MAX_RECORD_BYTES,
                fill,
            ],
            KeyOrder::Batched,
            SERVICE,
        );
        assert_eq!(run_round(&mut exact), [vec![0, 1, 2, 3, 4]]);
        let mut over = new_plan(
            &keys(5, 5),
            vec![
                MAX_RECORD_BYTES,
                MAX_RECORD_BYTES,
                MAX_RECORD_BYTES,
                MAX_RECORD_BYTES,
                fill + 1,
            ],
            KeyOrder::Batched,
            SERVICE,
        );
        assert_eq!(run_round(&mut over), [vec![0, 1, 2, 3], vec![4]]);
        // A call that cannot take the next record ends there: no later record jumps ahead.
        let mut ordered = new_plan(
            &keys(3, 3),
            vec![4 * MAX_RECORD_BYTES, MAX_RECORD_BYTES + 1, 1],
            KeyOrder::Batched,
            SERVICE,
        );
        assert_eq!(run_round(&mut ordered), [vec![0], vec![1, 2]]);
    }

    #[test]
    fn smaller_limits_split_smaller() {
        let limits = CallLimits {
            records: 100,
            bytes: 1_000,
        };
        let mut by_count = new_plan(&keys(250, 2), vec![1; 250], KeyOrder::Batched, limits);
        assert_eq!(
            run_round(&mut by_count)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            [100, 100, 50]
        );
        let mut by_bytes = new_plan(&keys(10, 2), vec![300; 10], KeyOrder::Batched, limits);
        assert_eq!(
            run_round(&mut by_bytes)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            [3, 3, 3, 1]
        );
        // A record bigger than the byte limit still goes, alone.
        let mut alone = new_plan(&keys(2, 2), vec![5_000, 1], KeyOrder::Batched, limits);
        assert_eq!(run_round(&mut alone), [vec![0], vec![1]]);
    }

    #[test]
    fn a_failure_holds_back_the_keys_later_records_until_the_next_round() {
        // Keys: a b a b a b ..., two records per call.
        let limits = CallLimits {
            records: 2,
            bytes: 1_000,
        };
        let keys: Vec<String> = (0..6)
            .map(|i| if i % 2 == 0 { "a" } else { "b" }.to_owned())
            .collect();
        let mut plan = new_plan(&keys, vec![1; 6], KeyOrder::Batched, limits);
        assert_eq!(plan.next_call(), Some(vec![0, 1]));
        plan.failed(0); // a's first record failed
        plan.stored(1);
        // Only b's records go on this round; a's are held back.
        assert_eq!(plan.next_call(), Some(vec![3, 5]));
        plan.stored(3);
        plan.stored(5);
        assert_eq!(plan.next_call(), None);
        assert_eq!(plan.unstored(), 3);
        // Next round: a's records in their original order, the failed one first.
        plan.start_round();
        assert_eq!(plan.next_call(), Some(vec![0, 2]));
        plan.stored(0);
        plan.stored(2);
        assert_eq!(plan.next_call(), Some(vec![4]));
        plan.stored(4);
        assert_eq!(plan.next_call(), None);
        assert_eq!(plan.unstored(), 0);
        assert_ne!(plan.key_of(0), plan.key_of(1));
        assert_eq!(plan.key_of(0), plan.key_of(4));
    }

    #[test]
    fn strict_order_sends_one_record_per_key_per_call() {
        let keys: Vec<String> = ["a", "a", "b", "a", "c", "b"]
            .iter()
            .map(|k| (*k).to_owned())
            .collect();
        let mut plan = new_plan(&keys, vec![1; 6], KeyOrder::Strict, SERVICE);
        assert_eq!(plan.next_call(), Some(vec![0, 2, 4]));
        plan.stored(0);
        plan.failed(2); // b is blocked: its record 5 waits for the next round
        plan.stored(4);
        assert_eq!(plan.next_call(), Some(vec![1]));
        plan.stored(1);
        assert_eq!(plan.next_call(), Some(vec![3]));
        plan.stored(3);
        assert_eq!(plan.next_call(), None);
        plan.start_round();
        assert_eq!(plan.next_call(), Some(vec![2]));
        plan.stored(2);
        assert_eq!(plan.next_call(), Some(vec![5]));
        plan.stored(5);
        assert_eq!(plan.next_call(), None);
        assert_eq!(plan.unstored(), 0);
    }

    #[test]
    fn a_record_stored_out_of_place_is_counted_once() {
        let keys: Vec<String> = vec!["a".into(); 3];
        let mut plan = new_plan(&keys, vec![1; 3], KeyOrder::Batched, SERVICE);
        assert_eq!(plan.next_call(), Some(vec![0, 1, 2]));
        plan.failed(0);
        plan.stored(1); // the service stored a later entry of the failed record's key
        plan.stored(1);
        plan.failed(2);
        assert_eq!(plan.unstored(), 2);
        plan.start_round();
        assert_eq!(plan.next_call(), Some(vec![0, 2]));
    }
}

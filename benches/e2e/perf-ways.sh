#!/usr/bin/env bash
# Profiles the drain's client with `perf` and cuts the samples by way: each way's timed
# windows (from `--windows`) get their own user/kernel split and top symbols, so (b) and (a)
# are compared inside one process run, without subtracting runs.
#
#   benches/e2e/perf-ways.sh                      # ways a and b, 400,000 records, 4 rounds
#   WAYS=bg ROUNDS=6 TOP=25 benches/e2e/perf-ways.sh
#   BIN=/path/to/drain benches/e2e/perf-ways.sh   # another build of the drain
#
# Needs `perf` (software event cpu-clock: works without hardware counters) and python3.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
WAYS=${WAYS:-b} ROUNDS=${ROUNDS:-4} RECORDS=${RECORDS:-400000} TOP=${TOP:-15}
BIN=${BIN:-$here/target/release/drain}
if [ ! -x "$BIN" ]; then
  cargo build --release --manifest-path "$here/Cargo.toml" --bin drain
fi
out=$(mktemp -d)
"$BIN" --records "$RECORDS" --rounds "$ROUNDS" --ways "$WAYS" --windows > "$out/drain.log" 2>&1 &
pid=$!
# Attach once the backlog is loaded, so loading is not in the profile.
until grep -q "^loaded" "$out/drain.log" 2>/dev/null; do
  kill -0 "$pid" 2>/dev/null || { cat "$out/drain.log"; exit 1; }
  sleep 0.05
done
perf record -q -k CLOCK_MONOTONIC -e cpu-clock -F 4000 -p "$pid" -o "$out/perf.data" 2>/dev/null &
perf_pid=$!
wait "$pid"
wait "$perf_pid" || true
grep "client CPU" "$out/drain.log"
perf script -i "$out/perf.data" -F time,ip,sym --ns 2>/dev/null > "$out/samples.txt"
python3 - "$out/drain.log" "$out/samples.txt" "$TOP" <<'PY'
import re, sys, collections
log, samples, top = sys.argv[1], sys.argv[2], int(sys.argv[3])
windows = []  # (from_s, to_s, way)
for line in open(log):
    m = re.match(r'\s+window \((\w)\) (\d+) (\d+)', line)
    if m:
        windows.append((int(m.group(2)) / 1e9, int(m.group(3)) / 1e9, m.group(1)))
windows.sort()
counts = {w: collections.Counter() for _, _, w in windows}
split = {w: collections.Counter() for _, _, w in windows}
for line in open(samples):
    m = re.match(r'\s*([\d.]+):\s+([0-9a-f]+)\s+(.*)$', line)
    if not m:
        continue
    t, ip, sym = float(m.group(1)), int(m.group(2), 16), m.group(3).strip() or '[unknown]'
    for start, end, way in windows:
        if start <= t <= end:
            kernel = ip >= 0xffff800000000000
            split[way]['kernel' if kernel else 'user'] += 1
            counts[way][sym] += 1
            break
ways = sorted(counts)
rounds = collections.Counter(w for _, _, w in windows)
print('\nsamples per round (4 kHz cpu-clock), user and kernel, and ratio to (a):')
base = {k: split['a'][k] / rounds['a'] for k in ('user', 'kernel')}
for w in ways:
    u, k = split[w]['user'] / rounds[w], split[w]['kernel'] / rounds[w]
    print(f'  ({w}) user {u:8.0f} ({u / base["user"]:.3f})  kernel {k:7.0f} ({k / base["kernel"]:.3f})  '
          f'total {u + k:8.0f} ({(u + k) / (base["user"] + base["kernel"]):.3f})')
for w in ways:
    if w == 'a':
        continue
    print(f'\n({w}) - (a), samples per round, the symbols adding the most:')
    diff = {s: counts[w][s] / rounds[w] - counts['a'][s] / rounds['a'] for s in set(counts[w]) | set(counts['a'])}
    for s, d in sorted(diff.items(), key=lambda x: -x[1])[:top]:
        print(f'  {d:8.1f}  {s[:110]}')
PY
rm -rf "$out"

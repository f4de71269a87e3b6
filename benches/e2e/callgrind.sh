#!/usr/bin/env bash
# The drain benchmark's client instructions per record, counted by callgrind: the raw SDK loop
# (a) against another way (default b, the Subscription acked through AckSink), with the
# functions that make up the difference. Instructions do not vary with the machine's load as
# CPU seconds do; they do vary from run to run with how the emulator's answers arrive (the SDK
# copies a body's chunks together: a few hundred instructions per record either way), so the
# figures are also given without memcpy.
#
# Three runs under valgrind, one after another (the emulator, a child process, runs natively):
#   A1 = way a, 1 round;  AR = way a, R rounds;  WR = ways a and WAY, R rounds.
# Loading the backlog and the untimed first drain are in every run, so
#   (a) per drain = (AR - A1) / (R - 1),   (WAY) per drain = (WR - AR) / R;
# what varies in that fixed part between runs is divided by R - 1 and R.
#
#   benches/e2e/callgrind.sh                 # WAY=b, N=100000 records, R=3 rounds
#   WAY=c N=50000 TOP=20 benches/e2e/callgrind.sh
#   BIN=/path/to/drain benches/e2e/callgrind.sh   # a drain binary built elsewhere (an A/B)
#
# The drain runs with --lease-duration 3600 (ARGS replaces it): under valgrind the client runs
# some 50 times slower than the clock, and with the default 4 s worker timeout a reader could
# stop mid-drain, its shard be taken again and records be read twice, counted as (b)'s work.
set -euo pipefail
[[ -z "${BIN:-}" ]] || BIN=$(realpath "$BIN")
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
command -v valgrind >/dev/null || { echo "error: valgrind is not installed" >&2; exit 1; }
WAY=${WAY:-b}
N=${N:-100000}
TOP=${TOP:-30}
R=${R:-3}
[[ "$R" -ge 2 ]] || { echo "error: R must be 2 or more (got $R)" >&2; exit 1; }
if [[ -z "${BIN:-}" ]]; then
  cargo build --release --locked --manifest-path benches/e2e/Cargo.toml >&2
  BIN=${CARGO_TARGET_DIR:-benches/e2e/target}/release/drain
fi
out=target/callgrind-e2e
mkdir -p "$out"
rm -f "$out"/*.out
read -ra extra <<<"${ARGS---lease-duration 3600}"
run() { # ways rounds name
  valgrind --tool=callgrind --callgrind-out-file="$out/$3.out" "$BIN" \
    --records "$N" --rounds "$2" --ways "$1" "${extra[@]}" >"$out/$3.log" 2>&1 ||
    { echo "error: the run $3 failed; see $out/$3.log" >&2; exit 1; }
}
# One after another, so that no run's timing (and so how the answers arrive) differs from the
# others' by sharing the machine.
run a 1 A1
run a "$R" AR
run "$WAY" "$R" WR
OUT="$out" WAY="$WAY" N="$N" TOP="$TOP" R="$R" python3 - <<'EOF'
import collections, os, re, subprocess
out, way, n, top = os.environ["OUT"], os.environ["WAY"], int(os.environ["N"]), int(os.environ["TOP"])
r = int(os.environ["R"])
def profile(name):
    text = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=no", f"{out}/{name}.out"],
                          capture_output=True, text=True, check=True).stdout
    per_function, total = collections.Counter(), 0
    for line in text.splitlines():
        m = re.match(r'^\s*([0-9,]+)\s+(?:\([^)]*\)\s+)?(.*)$', line)
        if not m:
            continue
        count, name = int(m.group(1).replace(',', '')), re.sub(r'\s*\[[^\]]*\]$', '', m.group(2).strip())
        if 'PROGRAM TOTALS' in name:
            total = count
        else:
            per_function[name] += count
    return total, per_function
(t1, a1), (t2, a2), (tw, w2) = profile("A1"), profile("AR"), profile("WR")
base = {k: (a2[k] - a1[k]) / (r - 1) for k in set(a1) | set(a2)}
other = {k: (w2[k] - a2[k]) / r for k in set(w2) | set(a2)}
ia, iw = (t2 - t1) / (r - 1), (tw - t2) / r
print(f"client instructions per record (callgrind, {n} records, {r} rounds):")
print(f"  (a) raw SDK loop  {ia / n:8.0f}")
print(f"  ({way})              {iw / n:8.0f}   ratio to (a) {iw / ia:.3f}")
copies = [k for k in set(base) | set(other) if 'memmove' in k or 'memcpy' in k]
ca, cw = sum(base.get(k, 0) for k in copies), sum(other.get(k, 0) for k in copies)
print(f"  without memcpy (mostly the HTTP body's chunks copied together, which varies with how")
print(f"  the answers arrive): (a) {(ia - ca) / n:.0f}, ({way}) {(iw - cw) / n:.0f}, "
      f"ratio {(iw - cw) / (ia - ca):.3f}; ({way}) - (a) = {(iw - cw - ia + ca) / n:.0f}")
rows = sorted(((other.get(k, 0) - base.get(k, 0), k) for k in set(base) | set(other)), reverse=True)
print(f"\nfunctions ({way}) spends more instructions in than (a), per record (self cost):")
for diff, name in rows[:top]:
    print(f"  {diff / n:7.1f}  {name[:150]}")
own = sum(d for d, k in rows if 'kinesis_dataflow::' in k)
print(f"\nthis crate's own functions, together: {own / n:.0f} per record")
EOF

#!/usr/bin/env bash
# Instructions per record of the core (see benches/per_record.rs), counted by callgrind: for
# each mode, two runs with N and 2N records, (I(2N) - I(N)) / N, counting only inside the
# `measured_*` functions (building the stream is left out) and cancelling fixed costs. Prints
# the figures and, for the 2N run of each mode, the functions that take the most instructions.
#
#   benches/callgrind.sh            # N = 20000
#   N=5000 benches/callgrind.sh     # quicker
#   MODES="shard subscription" FEATURES="--no-default-features --features broker" ARGS=--metrics \
#     benches/callgrind.sh          # some modes; other features; extra arguments to the bench
#   WHOLE=1 BENCH=per_publish MODES="batch collected direct" TOP="collected direct" benches/callgrind.sh
#                                   # the publishing bench (benches/per_publish.rs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v valgrind >/dev/null || { echo "error: valgrind is not installed" >&2; exit 1; }
N=${N:-20000}
BENCH=${BENCH:-per_record}
MODES=${MODES:-iter shard subscription durable deadline deaggregated}
TOP=${TOP:-shard subscription}
# Count only inside the `measured_*` functions, or (WHOLE=1) the whole run: what spawned tasks
# do runs outside those frames (the publishing bench's collecting task).
if [[ -n "${WHOLE:-}" ]]; then TOGGLE=""; else TOGGLE="--toggle-collect=*measured_*"; fi
# shellcheck disable=SC2086
bin=$(cargo bench --locked ${FEATURES:-} --bench "$BENCH" --no-run --message-format=json 2>/dev/null |
  BENCH="$BENCH" python3 -c 'import os, sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == os.environ["BENCH"] and m.get("executable"):
        print(m["executable"])' | tail -1)
out=target/callgrind
mkdir -p "$out"
total() { grep -m1 -E '^(summary|totals):' "$1" | awk '{print $2}'; }
declare -A per_record
for mode in $MODES; do
  for n in "$N" $((2 * N)); do
    # shellcheck disable=SC2086
    valgrind --tool=callgrind $TOGGLE \
      --callgrind-out-file="$out/$mode.$n.out" "$bin" --mode "$mode" --records "$n" ${ARGS:-} \
      >/dev/null 2>"$out/$mode.$n.log"
  done
  i1=$(total "$out/$mode.$N.out")
  i2=$(total "$out/$mode.$((2 * N)).out")
  per_record[$mode]=$(python3 -c "print(f'{($i2 - $i1) / $N:.0f}')")
done
echo "instructions per record (callgrind, N = $N):"
for mode in $MODES; do
  printf '  %-13s %s\n' "$mode" "${per_record[$mode]}"
done
for mode in $TOP; do
  echo
  echo "== $mode: top functions (inclusive of nothing; self cost) of the $((2 * N))-record run"
  callgrind_annotate --threshold=90 "$out/$mode.$((2 * N)).out" 2>/dev/null | sed -n '/^-*$/,$p' | grep -E '^\s*[0-9,]+ ' | head -15
done

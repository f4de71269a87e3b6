#!/usr/bin/env bash
# The drain benchmark on kinesis-local (the emulator the tests use) instead of ferrokinesis, for
# fidelity at a small scale: kinesis-local's PutRecords slows as a shard fills, so keep the
# backlog small. Arguments go to the drain (default: --records 10000 --rounds 2).
#
#   benches/e2e/kinesis-local.sh [--records N] [--rounds R]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ ! -f harness/node_modules/kinesis-local/main.js ]; then
  npm ci --prefix harness --no-audit --no-fund
fi
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p target/emulator-logs
log="$PWD/target/emulator-logs/drain-kinesis-local-$$.log"
# launch.js stops the emulator when its standard input closes: when this script exits.
coproc LAUNCHER { exec node harness/launch.js kinesis "$port" 0 "$log"; }
for _ in $(seq 1 150); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  sleep 0.2
done
pid=$(pgrep -n -f "harness/node_modules/kinesis-local/main.js" || true)
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--records 10000 --rounds 2)
cargo run --release --locked --manifest-path benches/e2e/Cargo.toml -- \
  --endpoint "http://127.0.0.1:$port" --emulator-pid "${pid:-0}" "${args[@]}"

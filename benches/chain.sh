#!/usr/bin/env bash
# A chain of N services (each needs the one before it), one host each, on the `local` transport,
# with hooks that are `true`: what a step costs `deploy` beyond its hooks when nothing runs
# beside it (book/src/appendix-measurements.md, "Drover with bare hooks").
#
# usage: bash benches/chain.sh [DEPLOY] [RUNS] [SERVICES] [DIR]
#   DEPLOY    the binary to time (default target/release/deploy, built if missing)
#   RUNS      timed runs, each from fresh hosts (default 5)
#   SERVICES  length of the chain (default 40)
#   DIR       where the site is generated (default a new temporary directory)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deploy=$(realpath "${1:-$root/target/release/deploy}")
runs=${2:-5}
n=${3:-40}
dir=${4:-$(mktemp -d)}
if [ ! -x "$deploy" ]; then
    (cd "$root" && cargo build --release --quiet)
fi
mkdir -p "$dir/sites" "$dir/platforms" "$dir/policies"
cat > "$dir/policies/all.kdl" <<'KDL'
policy "all" {
    batch "100%"
    pause "0s"
    max-failed 0
    on-failure "stop"
}
KDL
{
    echo 'platform "chain" {'
    echo '    transport "local"'
    echo '    inventory "static" {'
    for i in $(seq 0 $((n - 1))); do
        echo "        host \"h$i\" address=\"127.2.$((i / 250)).$((i % 250 + 1))\" class=\"c$i\""
    done
    echo '    }'
    echo '}'
} > "$dir/platforms/chain.kdl"
{
    printf 'site "chain" {\n    version "1"\n    platform "../platforms/chain.kdl"\n    policy "../policies/all.kdl"\n}\n'
    for i in $(seq 0 $((n - 1))); do echo "class \"c$i\" { service \"s$i\" }"; done
    for i in $(seq 0 $((n - 1))); do
        echo "service \"s$i\" {"
        if [ "$i" -gt 0 ]; then echo "    needs \"s$((i - 1))\""; fi
        printf '    install "true"\n    start "true"\n    check "true" timeout="30s"\n}\n'
    done
} > "$dir/sites/chain.kdl"
cd "$dir"
echo "chain of $n services in $dir, $deploy"
for r in $(seq "$runs"); do
    rm -rf platforms/hosts .drover
    start=$(date +%s%N)
    "$deploy" apply sites/chain.kdl --yes --json > run.ndjson
    end=$(date +%s%N)
    ms=$(( (end - start) / 1000000 ))
    # The rollout alone: the journal's run-started to run-finished, per step.
    rollout=$(python3 -c '
import json, sys
from datetime import datetime
ev = [json.loads(l) for l in open("run.ndjson")]
t = lambda e: datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
print("%.0f ms, %.1f ms a step" % ((t(ev[-1]) - t(ev[0])) * 1000, (t(ev[-1]) - t(ev[0])) * 1000 / int(sys.argv[1])))
' "$n")
    echo "run $r: $ms ms in all; the rollout $rollout"
done

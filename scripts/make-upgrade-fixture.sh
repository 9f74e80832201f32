#!/usr/bin/env bash
# Makes a data directory with a given build of Drover, for tests/upgrade.rs:
# one node, one partition, holding a job in every state, a worker session
# holding a job, a job schema, an idempotency key and a cancelled job; then
# stops the node and packs its data directory.
#
#   scripts/make-upgrade-fixture.sh BUILD OUT.tar.gz
#
# BUILD is the previous release's `drover` binary (build it from git at that
# commit). The windows are long so that nothing the test reads expires
# however long after this the test runs.
set -euo pipefail
drover="$1"
out="$2"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc="127.0.0.1:$(port)"
export DROVER_ADDRESS="$grpc"
ten_years=315360000
"$drover" serve --data-dir "$work/node" --grpc-addr "$grpc" --cluster-addr "127.0.0.1:$(port)" \
  --admin-addr "127.0.0.1:$(port)" --idempotency-window-secs "$ten_years" \
  --finished-retention-secs "$ten_years" >"$work/node.log" 2>&1 &
node=$!
for _ in $(seq 100); do "$drover" status >/dev/null 2>&1 && break; sleep 0.1; done

printf '{"type":"object","required":["n"],"properties":{"n":{"type":"number"}}}' >"$work/schema.json"
"$drover" schema set typed "$work/schema.json"
"$drover" job create --type typed --variables '{"n":1}' >/dev/null
"$drover" job create --type plain --variables '{"to":"ops@example.com"}' --header channel=ops --priority 5 >/dev/null
"$drover" job create --type delayed --delay $((ten_years * 1000)) >/dev/null
"$drover" job create --type keyed --idempotency-key order-77 --variables '{"order":77}' >/dev/null
done_key=$("$drover" job create --type done --variables '{"a":1}')
"$drover" job activate --type done --timeout 600000 >/dev/null
"$drover" job complete "$done_key" --attempt 1 --variables '{"sent":true}'
broken=$("$drover" job create --type broken --retries 0)
"$drover" job activate --type broken --timeout 600000 >/dev/null
"$drover" job fail "$broken" --attempt 1 --retries 0 --message "printer on fire"
gone=$("$drover" job create --type gone)
"$drover" job cancel "$gone"
"$drover" job create --type held --variables '{"long":true}' >/dev/null
"$drover" worker --type held --name fixture-worker --timeout $((ten_years * 1000)) --dead-after 3600000 \
  --heartbeat-interval 1000 --exec 'sleep 3600' >"$work/worker.log" 2>&1 &
worker=$!
for _ in $(seq 100); do
  "$drover" job list --type held --state activated 2>/dev/null | grep -q held && break
  sleep 0.1
done
"$drover" worker list | grep -q fixture-worker

kill -TERM "$node"
wait "$node" || true
kill -KILL "$worker" 2>/dev/null || true
tar -C "$work/node" -czf "$out" .
echo "wrote $out ($(du -h "$out" | cut -f1)) with $("$drover" --version)"

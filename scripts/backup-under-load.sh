#!/bin/bash
# A larger backup and restore than the CI test: three local nodes, a
# throughput bench as load, a backup taken in its middle, the nodes killed,
# the backup verified and restored into three new nodes, which start.
# Usage: DROVER=path/to/drover JOBS=200000 scripts/backup-under-load.sh [RUN_DIR]
set -u
BIN=${DROVER:-target/release/drover}
D=${1:-/tmp/drover-backup-run}; rm -rf "$D"; mkdir -p "$D"
members="0=127.0.0.1:36502,1=127.0.0.1:36512,2=127.0.0.1:36522"
start() { # id dir
  $BIN serve --node-id $1 --data-dir $2 --grpc-addr 127.0.0.1:365${1}0 --cluster-addr 127.0.0.1:365${1}2 \
    --admin-addr 127.0.0.1:365${1}4 --members $members --partitions 3 --replication-factor 3 > $2.log 2>&1 &
  echo $! > $2.pid
}
ready() { for i in 0 1 2; do until curl -sf http://127.0.0.1:365${i}4/ready >/dev/null; do sleep 0.2; done; done; }
for i in 0 1 2; do start $i $D/a-$i; done; ready
$BIN bench --address 127.0.0.1:36500,127.0.0.1:36510,127.0.0.1:36520 --workload throughput --jobs ${JOBS:-200000} > $D/bench.txt 2>&1 &
BENCH=$!
sleep 20
t0=$(date +%s.%N)
$BIN backup create --to $D/store --id big -a 127.0.0.1:36510 > $D/create.txt 2>&1; echo "create rc=$?" >> $D/create.txt
t1=$(date +%s.%N)
wait $BENCH
du -sb $D/store/big >> $D/create.txt
for i in 0 1 2; do kill -9 $(cat $D/a-$i.pid); done
t2=$(date +%s.%N)
$BIN backup verify --from $D/store --id big > $D/verify.txt 2>&1; echo "verify rc=$?" >> $D/verify.txt
t3=$(date +%s.%N)
for i in 0 1 2; do
  $BIN backup restore --from $D/store --id big --node-id $i --data-dir $D/b-$i --grpc-addr 127.0.0.1:365${i}0 \
    --cluster-addr 127.0.0.1:365${i}2 --admin-addr 127.0.0.1:365${i}4 --members $members --partitions 3 \
    --replication-factor 3 >> $D/restore.txt 2>&1
done
t4=$(date +%s.%N)
for i in 0 1 2; do start $i $D/b-$i; done; ready
t5=$(date +%s.%N)
$BIN cluster status -a 127.0.0.1:36500 > $D/status.txt 2>&1
for i in 0 1 2; do kill -TERM $(cat $D/b-$i.pid); done
echo "create_s $(echo "$t1 - $t0" | bc) verify_s $(echo "$t3 - $t2" | bc) restore_s $(echo "$t4 - $t3" | bc) ready_s $(echo "$t5 - $t4" | bc)" > $D/times.txt
cat $D/create.txt $D/verify.txt $D/restore.txt $D/times.txt; tail -30 $D/bench.txt

#!/usr/bin/env python3
"""Latency of a 3-replica NATS JetStream work queue, for docs/benchmarks.md.

Starts three nats-server processes (Debian's `nats-server`) clustered on
loopback ports in a temporary directory, makes a file-stored work-queue
stream with three replicas and a durable push consumer with explicit acks,
then publishes at a fixed rate: each message carries the time it was sent,
the consumer records send -> receive and acks it. It prints the same
percentiles `drover bench --workload latency` prints for create sent ->
worker received, and the fdatasync setting: JetStream 2.9 does not sync each
write (it syncs its files every two minutes), so this is the peer that does
not sync.

    python3 scripts/peers/nats_jetstream.py --rate 1000 --duration 20

Needs `apt-get install nats-server` and `pip install nats-py`.
"""

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(workdir):
    client_ports = [free_port() for _ in range(3)]
    cluster_ports = [free_port() for _ in range(3)]
    procs = []
    for i in range(3):
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i)
        conf = os.path.join(workdir, f"n{i}.conf")
        with open(conf, "w") as f:
            f.write(
                f"server_name: n{i}\n"
                f"listen: 127.0.0.1:{client_ports[i]}\n"
                f"jetstream {{ store_dir: \"{workdir}/n{i}\" }}\n"
                f"cluster {{ name: peers, listen: 127.0.0.1:{cluster_ports[i]}, routes: [{routes}] }}\n"
            )
        log = open(os.path.join(workdir, f"n{i}.log"), "w")
        procs.append(subprocess.Popen(["nats-server", "-c", conf], stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 30
    for port in client_ports:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"nats-server on port {port} did not start; see {workdir}/n*.log")
                time.sleep(0.05)
    return procs, client_ports


async def make_stream(js, deadline):
    last = None
    while time.monotonic() < deadline:
        try:
            await js.add_stream(
                StreamConfig(
                    name="JOBS",
                    subjects=["jobs"],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                    num_replicas=3,
                )
            )
            return
        except Exception as e:  # the meta group has no leader yet
            last = e
            await asyncio.sleep(0.2)
    raise SystemExit(f"no JetStream stream within the deadline: {last}")


def percentile(sorted_ms, q):
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


async def run(args, client_ports):
    servers = [f"nats://127.0.0.1:{p}" for p in client_ports]
    producer = await nats.connect(servers=servers)
    worker = await nats.connect(servers=servers)
    js = producer.jetstream()
    await make_stream(js, time.monotonic() + 30)
    wjs = worker.jetstream()
    latencies = []
    received = 0
    done = asyncio.Event()
    total = int(args.rate * args.duration)
    warmup = int(args.rate * args.warmup)

    async def on_message(msg):
        nonlocal received
        sent = int(msg.data[:20])
        received += 1
        if received > warmup:
            latencies.append((time.perf_counter_ns() - sent) / 1e6)
        await msg.ack()
        if received >= warmup + total:
            done.set()

    await wjs.subscribe(
        "jobs",
        durable="workers",
        manual_ack=True,
        cb=on_message,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=10_000),
    )
    pending = set()
    start = time.perf_counter()
    interval = 1.0 / args.rate
    for i in range(warmup + total):
        due = start + i * interval
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        payload = str(time.perf_counter_ns()).zfill(20).encode() + b" " + b"x" * args.payload
        task = asyncio.ensure_future(js.publish("jobs", payload))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.wait_for(done.wait(), timeout=60)
    elapsed = time.perf_counter() - start
    latencies.sort()
    print(
        f"{subprocess.run(['nats-server', '--version'], capture_output=True, text=True).stdout.strip()}, "
        f"3 replicas, file storage, no per-write sync; rate {args.rate}/s for {args.duration} s "
        f"(+{args.warmup} s warm-up), {received / elapsed:.0f} msgs/s received"
    )
    print(
        "  publish sent -> consumer received  "
        f"p50 {percentile(latencies, 0.50):.2f} ms  p99 {percentile(latencies, 0.99):.2f} ms  "
        f"p99.9 {percentile(latencies, 0.999):.2f} ms  max {latencies[-1]:.2f} ms"
    )
    await producer.close()
    await worker.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--payload", type=int, default=100, help="bytes besides the timestamp")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="nats-peer-")
    procs, ports = start_cluster(workdir)
    try:
        asyncio.run(run(args, ports))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

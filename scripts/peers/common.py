"""What the peer scripts share: loopback ports, a payload that carries its
send time, and `drover bench`'s two workloads run over a broker's publish and
consume, so every peer is measured the same way.

- `latency`: publishes at `--rate` for `--duration` seconds (after
  `--warmup`); the consumer records send -> receive of each message, as
  `drover bench --workload latency` records create sent -> worker received.
- `throughput`: publishes `--jobs` messages with up to `--in-flight`
  unconfirmed, while a consumer in a process of its own acks each; it prints
  messages per second, first publish to last receive.
"""

import asyncio
import multiprocessing
import socket
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_ports(ports, seconds, what):
    deadline = time.monotonic() + seconds
    for port in ports:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"nothing listens on port {port} after {seconds} s; see {what}")
                time.sleep(0.1)


def add_workload_args(parser):
    parser.add_argument("--workload", choices=["latency", "throughput"], default="latency")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--payload", type=int, default=256, help="bytes besides the timestamp")
    parser.add_argument("--jobs", type=int, default=40_000, help="messages of the throughput workload")
    parser.add_argument("--in-flight", type=int, default=1024, help="unconfirmed publishes (throughput)")


def payload(args):
    return str(time.perf_counter_ns()).zfill(20).encode() + b" " + b"x" * args.payload


def percentile(sorted_ms, q):
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


async def latency(args, publish, subscribe, described):
    """`publish(body)` sends one message and waits for its confirmation;
    `subscribe(on_body)` consumes, calling `on_body(body)` for each message
    (and acking it)."""
    latencies = []
    received = 0
    done = asyncio.Event()
    total = int(args.rate * args.duration)
    warmup = int(args.rate * args.warmup)

    def on_body(body):
        nonlocal received
        sent = int(body[:20])
        received += 1
        if received > warmup:
            latencies.append((time.perf_counter_ns() - sent) / 1e6)
        if received >= warmup + total:
            done.set()

    await subscribe(on_body)
    pending = set()
    start = time.perf_counter()
    interval = 1.0 / args.rate
    for i in range(warmup + total):
        due = start + i * interval
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        task = asyncio.ensure_future(publish(payload(args)))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.wait_for(done.wait(), timeout=60)
    elapsed = time.perf_counter() - start
    latencies.sort()
    print(
        f"{described}; rate {args.rate}/s for {args.duration} s "
        f"(+{args.warmup} s warm-up), {received / elapsed:.0f} msgs/s received"
    )
    print(
        "  publish sent -> consumer received  "
        f"p50 {percentile(latencies, 0.50):.2f} ms  p99 {percentile(latencies, 0.99):.2f} ms  "
        f"p99.9 {percentile(latencies, 0.999):.2f} ms  max {latencies[-1]:.2f} ms"
    )


def spawn_consumer(consume, jobs, *args):
    """Runs the throughput workload's consumer in a process of its own, so it
    and the publisher each have an interpreter: `consume(*args, jobs, tell)`
    subscribes, calls `tell("subscribed")`, acks `jobs` messages and returns
    the `time.perf_counter()` of the last (CLOCK_MONOTONIC: the publisher's
    clock too)."""
    ours, theirs = multiprocessing.Pipe()

    def main():
        theirs.send(asyncio.run(consume(*args, jobs, theirs.send)))

    process = multiprocessing.get_context("fork").Process(target=main)
    process.start()
    return process, ours


async def consume_all(jobs, subscribe, tell):
    """The body of a throughput consumer: `subscribe(on_body)` as for
    `latency`, then tells the publisher, and returns when `jobs` messages came
    (the time of the last)."""
    received = 0
    done = asyncio.Event()

    def on_body(_body):
        nonlocal received
        received += 1
        if received >= jobs:
            done.set()

    await subscribe(on_body)
    tell("subscribed")
    await asyncio.wait_for(done.wait(), timeout=600)
    return time.perf_counter()


async def throughput(args, publish, consumer, described):
    process, pipe = consumer
    loop = asyncio.get_running_loop()
    if await loop.run_in_executor(None, pipe.recv) != "subscribed":
        raise SystemExit("the consumer did not subscribe")
    window = asyncio.Semaphore(args.in_flight)
    failed = 0

    async def one():
        nonlocal failed
        try:
            await publish(payload(args))
        except Exception:
            failed += 1
        finally:
            window.release()

    start = time.perf_counter()
    tasks = []
    for _ in range(args.jobs):
        await window.acquire()
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    if failed:
        raise SystemExit(f"{failed} publishes failed")
    last = await loop.run_in_executor(None, pipe.recv)
    process.join(timeout=30)
    elapsed = last - start
    print(f"{described}; {args.jobs} messages, {args.in_flight} publishes in flight")
    print(f"  first publish -> last received  {elapsed:.2f} s, {args.jobs / elapsed:.0f} msgs/s")

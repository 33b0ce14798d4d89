"""What a publish costs the publishing process in instructions and system calls: counts that
the machine's other load does not change, where times on a shared machine do.

Each mode runs in a fresh process that publishes ``--warmup`` documents (connections, the
sender and the router's first checks), then ``N`` more; the process is counted twice, with
``N = 0`` and ``N = --documents``, and the difference divided by ``--documents`` is one
publish.  Instructions are user-space instructions counted by ``valgrind --tool=cachegrind``
(it is needed); system calls are counted by ``strace -f -c`` when it is installed.

- ``plain``: plain Celery (``workers.app`` with ``WORKERS_ROUTER=off``);
- ``floor``: the same with a ``before_task_publish`` receiver that sends one ``PING`` to the
  server the router's check would go to (``bench/floor.py``): one round trip and nothing else;
- ``router``: the router installed, checking the counter store;
- ``tuned``: the router's app with its receiver disconnected after the warm-up: its
  settings, no check.

The broker is ``--redis`` (db 14); the router's counter is its db 13, or with
``--cluster N`` a local Redis Cluster of ``N`` masters.

    python bench/publish_instructions.py [--cluster 3] [--documents 1000] [--modes plain,floor,router,tuned]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

MODES = ("plain", "floor", "router", "tuned")
TASK = "workers.hold_document"


def child(args: argparse.Namespace) -> None:
    import redis
    from celery.signals import before_task_publish

    from bench.floor import close_all, ping_receiver, pinged_servers
    from priority_router.integration import install
    from workers.app import create_app
    from workers.local_redis import RedisDatabases

    tag = uuid.uuid4().hex[:8]
    store = args.store or RedisDatabases.from_url(args.redis).counter
    env = {
        "BROKER_URL": RedisDatabases.from_url(args.redis).broker,
        "DOCUMENT_QUEUE": f"instructions-{tag}",
        "PRIORITY_ROUTER_REDIS_URL": store,
        "PRIORITY_ROUTER_KEY_PREFIX": f"instructions-{tag}:",
        "WORKERS_ROUTER": "on" if args.child in ("router", "tuned") else "off",
    }
    app = create_app(env)
    clients = [f"c{n}" for n in range(100)]
    servers = pinged_servers(store, clients)
    if args.child == "floor":
        before_task_publish.connect(ping_receiver(servers), dispatch_uid="instructions-floor", weak=False)

    def publish(count: int, name: str) -> None:
        for n in range(count):
            client = clients[n % len(clients)]
            app.send_task(TASK, (client, f"{name}{n}", 0), headers={"client_id": client})

    try:
        publish(args.warmup, "w")
        if args.child == "tuned":
            before_task_publish.disconnect(dispatch_uid=install._UID)
        publish(args.count, "d")
    finally:
        with redis.Redis.from_url(env["BROKER_URL"]) as broker:
            for pattern in (f"instructions-{tag}*", f"_kombu.binding*.instructions-{tag}"):
                for key in broker.scan_iter(match=pattern):
                    broker.unlink(key)
        for server in {id(s): s for s in servers.values()}.values():
            for key in server.scan_iter(match=f"instructions-{tag}*"):
                server.unlink(key)
        close_all(servers)
        app.close()


def counted(mode: str, count: int, args: argparse.Namespace, store: str | None) -> tuple[int, int | None]:
    """(user-space instructions, system calls or None) of one child publishing ``count``."""
    command = [sys.executable, __file__, "--child", mode, "--count", str(count), "--redis", args.redis]
    command += ["--warmup", str(args.warmup), *(["--store", store] if store else [])]
    grind = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", *command],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", grind.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{grind.stderr[-2000:]}")
    instructions = int(found.group(1).replace(",", ""))
    if shutil.which("strace") is None:
        return instructions, None
    with tempfile.NamedTemporaryFile(suffix=".strace") as out:
        subprocess.run(["strace", "-f", "-c", "-o", out.name, *command], capture_output=True, check=True)
        total = [line.split() for line in Path(out.name).read_text().splitlines() if line.endswith("total")]
    return instructions, int(total[-1][3]) if total else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--cluster", type=int, help="the router's counter on a local cluster of N masters")
    parser.add_argument("--documents", type=int, default=1000, help="publishes counted per mode")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.redis = args.redis.rstrip("/")
    if args.child:
        child(args)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is needed (apt-get install valgrind)")

    rows = {}
    with contextlib.ExitStack() as stack:
        store = None
        if args.cluster:
            from workers.cluster import running_cluster

            store = stack.enter_context(running_cluster(masters=args.cluster, replicas=0)).url
        for mode in modes:
            base_i, base_s = counted(mode, 0, args, store)
            full_i, full_s = counted(mode, args.documents, args, store)
            rows[mode] = {
                "instructions": (full_i - base_i) / args.documents,
                "syscalls": None if base_s is None or full_s is None else (full_s - base_s) / args.documents,
            }
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    where = f"a {args.cluster}-master cluster" if args.cluster else "the broker's Redis (db 13)"
    print(f"{args.documents} publishes per mode, the router's counter on {where}")
    print("| mode | instructions/publish | vs plain | system calls/publish |")
    print("|---|---|---|---|")
    plain = rows.get("plain", {}).get("instructions")
    for mode, row in rows.items():
        versus = f"{row['instructions'] / plain:.3f}x" if plain else "-"
        calls = "-" if row["syscalls"] is None else f"{row['syscalls']:.2f}"
        print(f"| {mode} | {row['instructions']:,.0f} | {versus} | {calls} |")
    if "router" in rows and "floor" in rows and plain:
        beyond = rows["router"]["instructions"] - rows["floor"]["instructions"]
        trip = rows["floor"]["instructions"] - plain
        print(
            f"router beyond the floor: {beyond:,.0f} instructions a publish; "
            f"the floor's one round trip: {trip:,.0f}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

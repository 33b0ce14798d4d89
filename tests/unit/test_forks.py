"""A prefork pool forks while the worker's gate thread holds a lock across a Redis or broker
call: the child must not inherit it held (it waited on it for good, and its client's cap
with it).  Each case forks from a process of its own, not from the threaded test process,
and uses the object in the child's main thread: a new thread there may get the dead
holder's thread id, which an RLock would let in."""

from __future__ import annotations

import subprocess
import sys

import pytest

STALL_IN_A_THREAD_THEN_FORK = """
import os, signal, threading, warnings
warnings.simplefilter("ignore", DeprecationWarning)
{setup}
stalled = threading.Event()
release = threading.Event()

def stall():
    {hold}

threading.Thread(target=stall, daemon=True).start()
assert stalled.wait(5)
pid = os.fork()
if pid == 0:
    signal.alarm(5)  # a child still waiting then is killed by SIGALRM
    {use}
    os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
print(os.waitstatus_to_exitcode(status))
"""

#: A Redis client whose GET waits, in the thread named "stall", until the test releases it.
STALLING_REDIS = """
import fakeredis

class Stalling(fakeredis.FakeRedis):
    def get(self, *args, **kwargs):
        if threading.current_thread().name == "stall":
            stalled.set()
            release.wait()
        return super().get(*args, **kwargs)
"""

CASES = {
    "limits": (
        STALLING_REDIS
        + """
from priority_router.store.limit_store import LimitStore

store = LimitStore(Stalling(), "p:", refresh=0.0)
""",
        "threading.current_thread().name = 'stall'; store.snapshot()",
        "store.snapshot()",
    ),
    "schema": (
        STALLING_REDIS
        + """
from priority_router.store.schema import StoreSchema

schema = StoreSchema(Stalling(), "p:")
""",
        "threading.current_thread().name = 'stall'; schema.check(claim=False)",
        "schema.check(claim=False)",
    ),
    "holding": (
        """
from celery import Celery
from priority_router.integration.holding import Holding

holding = Holding(Celery(broker="memory://"), "p:")
""",
        "with holding._using():\n        stalled.set()\n        release.wait()",
        "assert holding.take('acme') is None",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_child_forked_while_a_thread_holds_the_lock_goes_on(case: str) -> None:
    setup, hold, use = CASES[case]
    script = STALL_IN_A_THREAD_THEN_FORK.format(setup=setup, hold=hold, use=use)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0", f"the child waited on the lock the parent's thread held ({case})"

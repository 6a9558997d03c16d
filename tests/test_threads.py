"""labswarm.threads.thread_address_space: the address space new threads reserve (their stacks, malloc arenas), as
an RLIMIT_AS counts it; checked against a real process's VmSize."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading

import pytest

from labswarm.threads import ARENA_BYTES, STACK_BYTES, thread_address_space

#: Starts N threads that each malloc (a bytearray past pymalloc's 512 bytes: glibc's arena of that thread) and
#: wait together, then prints the VmSize before and while they live, and the stack thread_address_space counts.
_CHILD = """
import json, sys, threading
from concurrent.futures import ThreadPoolExecutor
from labswarm.threads import thread_address_space
def vmsize():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
n = int(sys.argv[1])
before, barrier = vmsize(), threading.Barrier(n + 1)
def work(_):
    kept = bytearray(4096)
    barrier.wait(60)
    barrier.wait(60)
    return len(kept)
with ThreadPoolExecutor(n) as pool:
    futures = [pool.submit(work, i) for i in range(n)]
    barrier.wait(60)
    during = vmsize()
    barrier.wait(60)
print(json.dumps({"added": during - before, "counted": thread_address_space(n)}))
"""


def _stack() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return threading.stack_size() or (STACK_BYTES if soft == resource.RLIM_INFINITY else soft)


def test_threads_count_their_stacks_and_the_arenas_malloc_arena_max_allows() -> None:
    stack = _stack()
    assert thread_address_space(0, {}) == 0
    assert thread_address_space(8, {"MALLOC_ARENA_MAX": "2"}) == 8 * stack + ARENA_BYTES  # the launcher's cap
    assert thread_address_space(8, {"MALLOC_ARENA_MAX": "4"}) == 8 * stack + 3 * ARENA_BYTES
    assert thread_address_space(2, {"MALLOC_ARENA_MAX": "4"}) == 2 * stack + 2 * ARENA_BYTES
    assert thread_address_space(8, {"MALLOC_ARENA_MAX": "1"}) == 8 * stack  # the main arena only
    for uncapped in ({}, {"MALLOC_ARENA_MAX": "0"}, {"MALLOC_ARENA_MAX": "x"}):  # glibc's default: 8 per core
        assert thread_address_space(8, uncapped) == 8 * stack + 8 * ARENA_BYTES, uncapped
    previous = threading.stack_size(4 * 2**20)  # set for threads started from now on: their size, not the rlimit
    try:
        assert thread_address_space(3, {"MALLOC_ARENA_MAX": "2"}) == 3 * 4 * 2**20 + ARENA_BYTES
    finally:
        threading.stack_size(previous)


@pytest.mark.parametrize("arenas", ["2", None])
def test_a_real_processs_threads_add_no_more_address_space_than_counted(arenas: str | None) -> None:
    """8 live threads that malloc, in a fresh process (MALLOC_ARENA_MAX is read at its start), with the launcher's
    cap and without: VmSize grows by at most what thread_address_space(8) counts (plus 8 MiB for what the
    interpreter maps meanwhile: its small-object arenas, the pool's objects) and by at least their stacks'
    and arenas' half (a count far too high would starve a learner of fetch threads)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if arenas is not None:
        env["MALLOC_ARENA_MAX"] = arenas
    done = subprocess.run([sys.executable, "-c", _CHILD, "8"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["counted"] // 2 <= figures["added"] <= figures["counted"] + 8 * 2**20, figures

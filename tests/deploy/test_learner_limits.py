"""A local learner's resources enforced on a real manager with real learner processes, by a cgroup of its own
(labswarm.deploy.cgroups, v1 on this machine) or, forced (learner_cgroups off) or where none can be created, by
affinity and RLIMIT_AS (labswarm.deploy.resource_limits): a ``command`` learner's program runs pinned to ceil(cpus)
cores in its cgroup, or under an address-space limit of memory_mb (plus the threads' allowance); a training learner
whose memory_mb is below what it needs fails with the user error C107 and says so in its log, not as an unexplained
kill (the OOM killer's SIGKILL in its cgroup, or its own exit past RLIMIT_AS), and no cgroup is left behind.
In real processes with 256 PyTorch threads:
the threads' allowance lets them start under memory_mb 3000, and without it libgomp's exit(1) ("Thread creation
failed") becomes the over-memory exit with its message; Python's own exit keeps its status under the watch."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest

from labswarm.deploy.cgroups import own_folders
from labswarm.deploy.resource_limits import MEMORY_ENV, THREAD_MIB, apply_memory_limit, out_of_memory, pick_cores
from labswarm.jobs.spec.errors import EXIT_MEMORY, ErrorCode, classify_exit

_REPORT = ("import json, os, resource; print('limits', json.dumps({'cores': sorted(os.sched_getaffinity(0)), "
           "'as': resource.getrlimit(resource.RLIMIT_AS)[0], 'arenas': os.environ.get('MALLOC_ARENA_MAX'), "
           "'cgroup': open('/proc/self/cgroup').read()}), flush=True)")


def _cgroups(cgroups: bool) -> None:
    """Skip a cgroup case where this process has no writable memory cgroup v1 (a property of the machine's kernel
    and mounts that no setup script can install, so a skip in CI too; the v2 branch: tests/deploy/test_cgroups.py)."""
    memory = own_folders().get("memory")
    if cgroups and (memory is None or not os.access(memory, os.W_OK)):
        pytest.skip("no writable memory cgroup v1 here")


def _left(job_id: str) -> list[str]:
    """The job's learner cgroups still there."""
    folders = own_folders()
    return [str(child) for key in ("memory", "cpu", "v2") if key in folders
            for child in folders[key].glob(f"labswarm-{job_id}-*")]


def _logs(m, job_id: str) -> list[str]:
    return [line["line"] for line in m.http.get(f"/v1/jobs/{job_id}/logs", params={"pagesize": 5000}).json()["lines"]]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores to be seen")
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "fallback"])
def test_a_command_learner_runs_pinned_to_its_cpus_under_its_memory_limit(tmp_path: Path, cgroups: bool) -> None:
    _cgroups(cgroups)
    manifest = tiny_manifest(tmp_path, name="limits", resources={"cpus": 1, "memory_mb": 3000},
                             framework={"name": "command", "command": [sys.executable, "-c", _REPORT]})
    with manager(tmp_path, job_slots=2, learner_cgroups=cgroups) as m:
        job = m.submit(manifest)
        assert statuses(read_events(m.http, job["id"]))[-1] == "completed"
        lines = _logs(m, job["id"])
    [line] = [line for line in lines if line.startswith("limits ")]
    seen = json.loads(line.removeprefix("limits "))
    assert len(seen["cores"]) == 1 and set(seen["cores"]) <= os.sched_getaffinity(0)
    name = f"labswarm-{job['id']}-1-0"
    how = "cgroup v1 memory 3000 MiB (memory.limit_in_bytes), 1 CPUs" if cgroups else "CPU affinity and RLIMIT_AS"
    assert any(f"resources enforced by {how}" in line for line in lines), lines
    if cgroups:  # its program in the learner's memory cgroup, no address-space limit
        assert f"/{name}\n" in seen["cgroup"], seen["cgroup"]
        assert seen["as"] == resource.RLIM_INFINITY and seen["arenas"] is None
    else:
        assert name not in seen["cgroup"]
        assert seen["as"] == (3000 + THREAD_MIB) * 1024 * 1024  # memory_mb and one thread's allowance (1 core)
        assert seen["arenas"] == "2"
    assert _left(job["id"]) == []


@pytest.mark.slow
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "fallback"])
def test_a_learner_over_its_memory_limit_fails_with_its_user_error_code(tmp_path: Path, cgroups: bool) -> None:
    _cgroups(cgroups)
    manifest = tiny_manifest(tmp_path, name="greedy", resources={"cpus": 1, "memory_mb": 64})
    with manager(tmp_path, learner_cgroups=cgroups) as m:
        job = m.submit(manifest)
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
        lines = _logs(m, job["id"])
    assert statuses(stream)[-1] == "failed"
    assert shown["error_code"] == "C107" and shown["fault"] == "user", shown
    assert "resources.memory_mb" in shown["error"]
    assert any("over its memory limit (resources.memory_mb: 64 MiB)" in line for line in lines), lines[-20:]
    how = ("OOM killer ended it (cgroup v1 memory 64 MiB" if cgroups  # killed before it could log its start
           else "resources enforced by CPU affinity and RLIMIT_AS")
    assert any(how in line for line in lines), lines
    assert _left(job["id"]) == []


def test_cores_go_to_the_least_used_and_the_codes_are_classified() -> None:
    cores = [0, 1, 2, 3]
    assert pick_cores(1, [], cores) == [0]
    assert pick_cores(1, [[0]], cores) == [1]
    assert pick_cores(2, [[0], [1], [0, 2]], cores) == [1, 3]
    assert pick_cores(0.5, [[0, 1, 2]], cores) == [3]
    assert pick_cores(4, [], cores) is None and pick_cores(6.5, [], cores) is None
    verdict = classify_exit(EXIT_MEMORY, killed_by_platform=False, user_exit_codes=[1, 2])
    assert verdict is not None and verdict.code is ErrorCode.LEARNER_OVER_MEMORY and verdict.fault.value == "user"
    assert out_of_memory(MemoryError()) and out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert out_of_memory(OSError("libtorch_global_deps.so: failed to map segment from shared object"))
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(OSError(2, "No such file"))
    try:
        raise ValueError("wrapped") from MemoryError()
    except ValueError as exc:
        assert out_of_memory(exc)


def test_the_memory_limit_makes_a_large_allocation_fail_in_a_child(tmp_path: Path) -> None:
    pid = os.fork()
    if pid == 0:  # the child limits itself as a learner does, then asks for more than the limit
        code = 1
        try:
            limit = apply_memory_limit({MEMORY_ENV: "1024"}, threads=0)  # no threads' allowance
            assert limit == 1024 * 1024 * 1024 and resource.getrlimit(resource.RLIMIT_AS)[0] == limit
            try:
                bytearray(2 * 1024 * 1024 * 1024)
            except MemoryError:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


#: A learner's start: PyTorch's pool of argv[1] threads, the limit (argv[2]: the threads allowed for, "" the
#: default), the watch (its handler prints the message and returns EXIT_MEMORY), then a parallel convolution.
_THREADS = f"""
import os, sys, torch
from labswarm.deploy.resource_limits import apply_memory_limit, watch_native_exit
torch.set_num_threads(int(sys.argv[1]))
apply_memory_limit(threads=int(sys.argv[2]) if sys.argv[2] else None)
watch_native_exit(lambda message: print("over memory:", message, file=sys.stderr, flush=True) or {EXIT_MEMORY})
if sys.argv[3] == "exit":
    sys.exit(3)
m = torch.nn.Conv2d(1, 64, 3)
for _ in range(2):
    m(torch.randn(32, 1, 128, 128)).sum().backward()
print("trained", flush=True)
"""


def _threads(threads: int, allowed: str, then: str = "train") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, MEMORY_ENV: "3000", "MALLOC_ARENA_MAX": "2"}
    env.pop("OMP_NUM_THREADS", None)
    return subprocess.run([sys.executable, "-c", _THREADS, str(threads), allowed, then], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_many_threads_start_under_the_limit_and_a_native_exit_past_it_is_the_over_memory_exit() -> None:
    pytest.importorskip("torch")
    allowed = _threads(256, "")  # the default allowance: 256 threads x THREAD_MIB over memory_mb
    assert allowed.returncode == 0 and "trained" in allowed.stdout, allowed.stderr[-2000:]
    starved = _threads(256, "1")  # an allowance of one thread: the reviewer's failure (exit 1, reported S101)
    assert starved.returncode == EXIT_MEMORY, (starved.returncode, starved.stderr[-2000:])
    assert "Thread creation failed" in starved.stderr and "over memory: a native library ended the process " \
        "(exit status 1) with its address space full" in starved.stderr, starved.stderr[-2000:]
    assert classify_exit(starved.returncode, killed_by_platform=False, user_exit_codes=()).code \
        is ErrorCode.LEARNER_OVER_MEMORY
    plain = _threads(1, "", then="exit")  # Python's own exit under the watch: its status, no crash
    assert plain.returncode == 3, plain.stderr[-2000:]

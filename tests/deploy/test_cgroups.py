"""labswarm.deploy.cgroups' v2 branch on a fake cgroup tree (a folder in tmp_path standing for /sys/fs/cgroup and a
file for /proc/self/cgroup): what it writes (memory.max, memory.swap.max, cpu.max, the controllers it enables),
where (a child of this process's own cgroup), how the learner joins it, how the OOM count and the limit are read
back, and that a cgroup which cannot delegate memory is refused; a learner's shell that cannot join its cgroup
(real processes): the fallback, or with cgroups required no learner and a start failure (S105) that says why;
required cgroups that cannot be made: a DeployError; a new manager's sweep of the empty cgroups a previous one
left (fake tree, and the real v1 memory hierarchy where writable). The v1 branch runs on real processes in
tests/deploy/test_learner_limits.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from labswarm.deploy import cgroups
from labswarm.deploy.learners import LearnerLaunch
from labswarm.deploy.local_learners import LocalLearners
from labswarm.deploy.resource_limits import LIMITS_ENV, MEMORY_ENV
from labswarm.errors import DeployError
from labswarm.jobs.spec.errors import EXIT_MEMORY


def _tree(tmp_path: Path, subtree: str) -> tuple[Path, Path, Path]:
    """A v2 mount at ``root`` with this process in ``/jobs/mine`` (memory and cpu available there)."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    own = root / "jobs" / "mine"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text(subtree)
    proc.write_text("0::/jobs/mine\n")
    return root, proc, own


def test_the_v2_branch_writes_its_limits_in_a_child_of_its_own_cgroup(tmp_path: Path) -> None:
    root, proc, own = _tree(tmp_path, "")
    assert cgroups.own_folders(root, proc) == {"v2": own}
    made = cgroups.create(cgroups.cgroup_name("job1", 2, 0), 512, 1.5, root=root, proc=proc)
    assert made is not None and made.version == 2
    child = own / "labswarm-job1-2-0"
    assert made.folders == [child] and made.memory == child
    assert (child / "memory.max").read_text() == str(512 * 2**20)
    assert (child / "cpu.max").read_text() == "150000 100000"
    assert (own / "cgroup.subtree_control").read_text() == "+cpu"  # memory, then cpu enabled for the children
    shell, flag, script, *argv = made.wrap(["python", "-m", "x"])  # joins, then runs (the join: test below)
    assert (shell, flag, argv) == ("/bin/sh", "-c", ["sh", "python", "-m", "x"])
    assert script.startswith(f"{{ echo $$ > {child}/cgroup.procs; }} || ") and script.endswith('exec "$@"')
    assert "cgroup v2 memory 512 MiB (memory.max), 1.5 CPUs (cpu.max)" in made.describe()
    (child / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    found = cgroups.existing("labswarm-job1-2-0", root=root, proc=proc)  # a restarted manager's view
    assert found is not None and found.oom_kills() == 1 and found.memory_mb == 512
    assert cgroups.existing("labswarm-job1-3-0", root=root, proc=proc) is None
    assert cgroups.EXIT_MEMORY == EXIT_MEMORY  # the launcher's C107 exit is the learner's


def test_no_cgroup_where_memory_cannot_be_delegated(tmp_path: Path) -> None:
    root, proc, own = _tree(tmp_path, "")
    (own / "cgroup.subtree_control").unlink()
    (own / "cgroup.subtree_control").mkdir()  # unreadable, unwritable: as EBUSY on a cgroup holding processes
    assert cgroups.create("labswarm-j-1-0", 512, 1, root=root, proc=proc) is None
    assert sorted(p.name for p in own.iterdir()) == ["cgroup.controllers", "cgroup.subtree_control"]
    (own / "cgroup.controllers").write_text("cpu pids\n")  # no memory controller at all
    (own / "cgroup.subtree_control").rmdir()
    (own / "cgroup.subtree_control").write_text("cpu")
    assert cgroups.create("labswarm-j-1-0", 512, 1, root=root, proc=proc) is None
    assert cgroups.create("labswarm-j-1-0", None, None, root=root, proc=proc) is None


def test_a_leftover_cgroup_of_the_same_name_is_never_killed_and_an_empty_one_is_made_again(tmp_path: Path) -> None:
    root, proc, own = _tree(tmp_path, "+memory +cpu")
    leftover = own / "labswarm-job1-1-0"
    leftover.mkdir()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as stranger:
        try:
            (leftover / "cgroup.procs").write_text(f"{stranger.pid}\n")  # a process still in it
            assert cgroups.create("labswarm-job1-1-0", 512, 1, root=root, proc=proc) is None  # the fallback
            assert stranger.poll() is None, "a cgroup this call did not make had its process killed"
            assert (leftover / "cgroup.procs").read_text() == f"{stranger.pid}\n"
        finally:
            stranger.kill()
    (leftover / "cgroup.procs").unlink()  # (real cgroupfs: its files go with rmdir; the fake's folder must be empty)
    made = cgroups.create("labswarm-job1-1-0", 512, 1, root=root, proc=proc)
    assert made is not None and made.folders == [leftover] and (leftover / "memory.max").read_text() == str(512 * 2**20)


def test_a_learner_restarted_alone_is_not_killed_by_the_retried_removal_of_its_predecessors_cgroup(
        tmp_path: Path) -> None:
    """An asynchronous framework's learner restarted alone gets the cgroup name of the one it replaces (same job,
    attempt and rank); a removal of that cgroup left to retry (its killed process not gone yet) must not kill the
    new learner once it has joined (CI: a downpour learner's successor killed -9 a second after it started)."""
    root, proc, _own = _tree(tmp_path, "+memory +cpu")
    learners = LocalLearners(root=root, proc=proc)
    launch = LearnerLaunch("job1", 1, 0, {}, tmp_path / "spec.json", tmp_path / "learner-0.out", "token",
                           resources={"cpus": 1, "memory_mb": 512})
    first = learners._cgroup(launch)
    assert first is not None
    learners._unremoved.append((first, None))  # its removal left to retry: a process in it not gone yet
    for file in first.folders[0].iterdir():  # (the fake's folder must be empty to be made again; cgroupfs: its
        file.unlink()                        # files go with rmdir)
    again = learners._cgroup(launch)
    assert again is not None and again.folders == first.folders
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as successor:
        try:
            (again.folders[0] / "cgroup.procs").write_text(f"{successor.pid}\n")  # the new learner joined
            learners._remove_unremoved()
            assert not learners._unremoved  # the predecessor's removal is over: nothing retried on this folder
            with pytest.raises(subprocess.TimeoutExpired):  # (a SIGKILL it got would end it within this wait)
                successor.wait(timeout=2)
        finally:
            successor.kill()


#: A learner stand-in: its pid, the cgroup it sees and the limit variables it was given.
_PROGRAM = ("import os; print('ran', os.getpid(), os.environ.get('LABSWARM_MEMORY_LIMIT_MB'), "
            "os.environ.get('LABSWARM_MEMORY_CGROUP'), os.environ.get('LABSWARM_LEARNER_LIMITS'), flush=True)")


@dataclass
class _Record:
    """A learner's record as the launcher reads it (LearnerRecord)."""

    job_id: str
    attempt: int
    rank: int
    workdir: str
    pid: int | None
    pid_created: float | None = None
    service_id: str | None = None


def _run(argv: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, cgroups.CGROUP_ENV: "/the/cgroup"}
    with open(out, "w") as handle:
        return subprocess.run(argv, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True, timeout=60)


def test_a_learner_that_cannot_join_its_cgroup_falls_back_or_with_cgroups_required_fails_to_start(
        tmp_path: Path) -> None:
    root, proc, own = _tree(tmp_path, "+memory +cpu")
    made = cgroups.create("labswarm-job1-1-0", 64, 1, root=root, proc=proc)
    assert made is not None
    base = tmp_path / "jobs" / "job1" / "attempt-1"
    joined = _run(made.wrap([sys.executable, "-c", _PROGRAM]), base / "joined.out")  # the fake tree takes the pid
    assert joined.returncode == 0
    ran = (base / "joined.out").read_text().split()
    assert ran[:2] == ["ran", (own / "labswarm-job1-1-0" / "cgroup.procs").read_text().strip()]  # exec kept it
    assert ran[3] == "/the/cgroup"
    (own / "labswarm-job1-1-0" / "cgroup.procs").unlink()
    (own / "labswarm-job1-1-0" / "cgroup.procs").mkdir()  # the join's write fails ("Is a directory")
    fallback = {MEMORY_ENV: "64", LIMITS_ENV: "the fallback"}
    assert _run(made.wrap([sys.executable, "-c", _PROGRAM], fallback), base / "fallback.out").returncode == 0
    lines = (base / "fallback.out").read_text()
    assert cgroups.JOIN_FAILED in lines and "the fallback instead" in lines
    assert "ran" in lines and " 64 None the fallback" in lines, lines  # the fallback's limit, no cgroup variable

    required = _run(made.wrap([sys.executable, "-c", _PROGRAM]), base / "learner-0.out")
    text = (base / "learner-0.out").read_text()
    assert required.returncode == cgroups.EXIT_JOIN and "ran" not in text, text  # the learner never started
    assert cgroups.JOIN_FAILED in text and "cgroup.procs" in text, text  # and the shell's own error
    record = _Record("job1", 1, 0, str(base / "rank-0"), pid=os.getpid() + 10**6)  # gone: read as a restarted one
    status = LocalLearners(True, root=root, proc=proc).poll(record)
    assert not status.alive and status.deploy_failed, status
    assert status.reason is not None and "could not join its cgroup" in status.reason
    (base / "learner-0.out").write_text("a command learner's own exit 125\n")  # no marker: its own exit code
    assert not LocalLearners(True, root=root, proc=proc).poll(record).deploy_failed


def test_required_cgroups_that_cannot_be_made_fail_the_start_with_the_reason(tmp_path: Path) -> None:
    root, proc, own = _tree(tmp_path, "")
    (own / "cgroup.controllers").write_text("cpu pids\n")  # no memory controller to delegate
    launch = LearnerLaunch("job1", 1, 0, {}, tmp_path / "spec.json", tmp_path / "learner-0.out", "token",
                           resources={"cpus": 1, "memory_mb": 512})
    with pytest.raises(DeployError, match=r"LABSWARM_LEARNER_CGROUPS=true.*memory_mb 512.*unset it to fall back"):
        LocalLearners(True, root=root, proc=proc).start(launch)
    assert not (tmp_path / "learner-0.out").exists()  # nothing started


def _sweep_case(folder: Path, job: str, process: int) -> tuple[list[str], set[str]]:
    """Under ``folder``: the learner cgroups of ``job`` (empty; ``process`` in one; one still named by a live
    learner), another manager's job's and a folder of another name; returns (all names, the names kept live)."""
    names = [f"labswarm-{job}-1-0", f"labswarm-{job}-2-0", f"labswarm-{job}-3-0", "labswarm-theirs-1-0",
             f"other-{job}-1-0"]
    for name in names:
        (folder / name).mkdir()
    (folder / names[1] / "cgroup.procs").write_text(f"{process}\n")
    return names, {names[2]}


def test_a_new_manager_sweeps_the_empty_cgroups_of_its_learners_and_nothing_else(tmp_path: Path) -> None:
    root, proc, own = _tree(tmp_path, "+memory")
    names, live = _sweep_case(own, "job1", os.getpid())
    LocalLearners(root=root, proc=proc).sweep(live, lambda job: job == "job1")
    assert sorted(p.name for p in own.iterdir() if p.is_dir()) == sorted(names[1:])  # only the empty, not live one


def test_the_sweep_on_the_real_memory_cgroup_v1_removes_the_empty_one_only() -> None:
    memory = cgroups.own_folders().get("memory")
    if memory is None or not os.access(memory, os.W_OK):
        pytest.skip("no writable memory cgroup v1 here")  # the machine's kernel and mounts (as test_learner_limits)
    job = f"sweep{uuid.uuid4().hex[:8]}"
    names = [f"labswarm-{job}-1-0", f"labswarm-{job}-2-0", f"labswarm-{job}-3-0"]
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as stranger:
        try:
            for name in names:
                (memory / name).mkdir()
            (memory / names[1] / "cgroup.procs").write_text(f"{stranger.pid}\n")  # a process in it
            LocalLearners().sweep({names[2]}, lambda owner: owner == job)
            assert not (memory / names[0]).exists()  # the empty one, of this manager's job, not live: removed
            assert (memory / names[1]).is_dir() and (memory / names[2]).is_dir()
            assert stranger.poll() is None and str(stranger.pid) in (memory / names[1] / "cgroup.procs").read_text()
        finally:
            stranger.kill()
            stranger.wait()
            for name in names:
                if (memory / name).is_dir():
                    cgroups.LearnerCgroup(1, [memory / name]).remove()

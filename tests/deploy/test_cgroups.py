"""labswarm.deploy.cgroups' v2 branch on a fake cgroup tree (a folder in tmp_path standing for /sys/fs/cgroup and a
file for /proc/self/cgroup): what it writes (memory.max, memory.swap.max, cpu.max, the controllers it enables),
where (a child of this process's own cgroup), how the learner joins it, how the OOM count and the limit are read
back, and that a cgroup which cannot delegate memory is refused. The v1 branch runs on real processes in
tests/deploy/test_learner_limits.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from labswarm.deploy import cgroups
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
    assert made.wrap(["python", "-m", "x"]) == ["/bin/sh", "-c", f'echo $$ > {child}/cgroup.procs && exec "$@"',
                                                "sh", "python", "-m", "x"]
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

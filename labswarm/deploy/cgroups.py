"""A local learner's ``resources.memory_mb`` and ``resources.cpus`` enforced by a cgroup of its own (issue 26 item 4).

Where this process may write its own cgroup's folder (read from ``/proc/self/cgroup``), each local learner gets a
child cgroup there, named after its job, attempt and rank (:func:`cgroup_name`), its limits written before the
learner runs any code of its own (:meth:`LearnerCgroup.wrap`: a shell writes its own pid into the cgroup, then
``exec``\\ s the learner):

- **cgroup v2** (a delegated subtree: ``memory`` in the folder's ``cgroup.subtree_control``, or enabled there):
  ``memory.max`` = ``memory_mb`` MiB, ``memory.swap.max`` = 0, ``cpu.max`` = ``cpus`` x 100 ms per 100 ms
  (the kernel's documented default period, ``Documentation/admin-guide/cgroup-v2.rst``).
- **cgroup v1** (writable ``memory`` / ``cpu`` hierarchies): ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes``, no swap, where the kernel accounts swap), ``cpu.cfs_quota_us`` over
  ``cpu.cfs_period_us`` = 100,000 us.

The limit is *resident* memory of the learner and every process it starts (data loaders, a ``command`` learner's
program) together, not one process's address space as the ``RLIMIT_AS`` fallback
(:mod:`labswarm.deploy.resource_limits`). Past it the kernel's OOM killer ends a process of the cgroup with
SIGKILL; :meth:`LearnerCgroup.oom_kills` reads how often (v2 ``memory.events`` ``oom_kill``, v1
``memory.oom_control`` ``oom_kill``, or ``memory.failcnt`` on kernels before 4.13), and the launcher reports such
a learner as over its memory limit (``C107``). The cgroup is removed when the learner ends
(:meth:`LearnerCgroup.remove`, which kills what is still in it); a new manager removes the empty ones a previous
one left (:func:`sweep`). A shell that cannot join its cgroup runs the learner under the fallback, or with cgroups
required exits with :data:`EXIT_JOIN` (:meth:`LearnerCgroup.wrap`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: Where the cgroup file systems are mounted.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The variable that tells a learner its memory cgroup's folder (its headroom:
#: :func:`labswarm.train.distributed.data.memory_headroom`).
CGROUP_ENV = "LABSWARM_MEMORY_CGROUP"
#: The exit status a learner over its memory limit ends with: ``labswarm.jobs.spec.errors.EXIT_MEMORY`` (``C107``;
#: the deploy layer may not import the jobs layer, a test checks they agree).
EXIT_MEMORY = 71
#: CPU quota period, microseconds (both versions' default).
PERIOD_US = 100_000
#: The exit status of a learner's shell that could not move itself into the cgroup(s) it was given
#: (:meth:`LearnerCgroup.wrap` with cgroups required); its output then holds :data:`JOIN_FAILED`.
EXIT_JOIN = 125
#: The line a learner's shell prints when it cannot join its cgroup(s).
JOIN_FAILED = "labswarm: the learner could not join its cgroup"
#: The prefix of every learner cgroup's name (:func:`cgroup_name`).
PREFIX = "labswarm-"


def cgroup_name(job_id: str, attempt: int, rank: int) -> str:
    """The child cgroup's folder name of a learner: one per job, attempt and rank (a restarted manager finds it)."""
    return f"{PREFIX}{job_id}-{attempt}-{rank}"


def own_folders(root: Path = CGROUP_ROOT, proc: Path = Path("/proc/self/cgroup")) -> dict[str, Path]:
    """This process's cgroup folders: ``{"v2": folder}`` for the unified hierarchy (mounted at ``root`` or at
    ``root/unified``) and ``{controller: folder}`` for each v1 hierarchy (``root/<controllers>`` or
    ``root/<controller>``); only folders that exist. Empty where ``proc`` cannot be read."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return {}
    out: dict[str, Path] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        relative = path.lstrip("/")
        if not controllers:
            for mount in (root, root / "unified"):
                if (mount / "cgroup.controllers").is_file() and (mount / relative).is_dir():
                    out["v2"] = mount / relative
                    break
            continue
        for controller in controllers.split(","):
            for mount in (root / controllers, root / controller):
                if (mount / relative).is_dir():
                    out.setdefault(controller, mount / relative)
                    break
    return out


def _write(path: Path, value: str) -> None:
    path.write_text(value)


@dataclass
class LearnerCgroup:
    """A learner's cgroup(s) once created with their limits (:func:`create`).

    Attributes:
        version: 1 or 2.
        folders: the child folders created (v2: one; v1: the memory and/or cpu hierarchy's).
        memory: the folder holding the memory files (``None``: no memory limit).
        memory_mb: the memory limit, MiB (``None``: none).
        cpus: the CPU quota, in CPUs (``None``: none).
    """

    version: int
    folders: list[Path] = field(default_factory=list)
    memory: Path | None = None
    memory_mb: int | None = None
    cpus: float | None = None

    def describe(self) -> str:
        """One line for the learner's log: the path applied and its limits."""
        limits, v2 = [], self.version == 2
        if self.memory_mb is not None:
            limits.append(f"memory {self.memory_mb} MiB ({'memory.max' if v2 else 'memory.limit_in_bytes'})")
        if self.cpus is not None:
            limits.append(f"{self.cpus:g} CPUs ({'cpu.max' if v2 else 'cpu.cfs_quota_us'})")
        return f"cgroup v{self.version} {', '.join(limits)} at {', '.join(str(f) for f in self.folders)}"

    def wrap(self, argv: list[str], fallback: Mapping[str, str] | None = None) -> list[str]:
        """``argv`` started by ``/bin/sh``, which first moves itself into the cgroup(s) (``cgroup.procs``), then
        ``exec``\\ s ``argv``: the learner's first instruction already runs under its limits.

        Where a join fails (the shell's own error names the file and the reason), with ``fallback`` ``None``
        (cgroups required) the shell prints :data:`JOIN_FAILED` and exits with :data:`EXIT_JOIN`, ``argv`` never
        run; else it says so, drops :data:`CGROUP_ENV`, exports ``fallback`` (the affinity and ``RLIMIT_AS``
        fallback's variables) and runs ``argv``."""
        joins = " && ".join(f"echo $$ > {shlex.quote(str(folder / 'cgroup.procs'))}" for folder in self.folders)
        where = shlex.quote(f"{JOIN_FAILED} ({', '.join(str(folder) for folder in self.folders)})")
        if fallback is None:
            otherwise = f"echo {where} >&2; exit {EXIT_JOIN}"
        else:
            exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in fallback.items())
            otherwise = (f"echo {where}: {shlex.quote('the fallback instead')} >&2; unset {CGROUP_ENV}"
                         + (f"; export {exports}" if exports else ""))
        return ["/bin/sh", "-c", f'{{ {joins}; }} || {{ {otherwise}; }}; exec "$@"', "sh", *argv]

    def oom_kills(self) -> int:
        """How many times the kernel's OOM killer ended a process of the cgroup (v2 ``memory.events``, v1
        ``memory.oom_control``'s ``oom_kill``, else ``memory.failcnt``: times the limit was hit); 0 where unreadable."""
        if self.memory is None:
            return 0
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
            if self.version == 1:
                return int((self.memory / "memory.failcnt").read_text())
        return 0

    def remove(self, timeout: float = 5.0) -> bool:
        """Kill what is still in the cgroup(s) (SIGKILL) and remove the folders, waiting up to ``timeout`` s for
        the processes to leave; returns whether every folder is gone."""
        deadline = time.monotonic() + timeout
        for folder in self.folders:
            while folder.is_dir():
                with contextlib.suppress(OSError, ValueError):
                    for pid in (folder / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(int(pid), signal.SIGKILL)
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: a killed process not yet gone
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
        return True


def _fresh(folder: Path) -> None:
    """Make a learner's cgroup folder. A leftover of the same name (a removal that timed out, a manager that
    crashed before it recorded its learner) is made again when no process is in it; one that still holds
    processes is left alone: ``FileExistsError``, and the caller falls back, killing nothing it did not make."""
    try:
        folder.mkdir()
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if (folder / "cgroup.procs").read_text().split():
                raise
        folder.rmdir()
        folder.mkdir()


def _v2(base: Path, name: str, memory_mb: int | None, cpus: float | None) -> LearnerCgroup | None:
    """The learner's v2 cgroup under ``base``, or ``None`` where memory (and cpu) cannot be delegated there."""
    try:
        available = (base / "cgroup.controllers").read_text().split()
        enabled = (base / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    wanted = [c for c, need in (("memory", memory_mb), ("cpu", cpus)) if need is not None and c in available]
    if memory_mb is not None and "memory" not in available:
        return None
    for controller in wanted:
        if controller not in enabled:
            try:  # EBUSY where this cgroup holds processes itself (no internal processes): not delegated
                _write(base / "cgroup.subtree_control", f"+{controller}")
            except OSError:
                return None
    if not wanted:
        return None
    folder = base / name
    cgroup = LearnerCgroup(2)
    try:
        _fresh(folder)
        cgroup.folders.append(folder)
        if memory_mb is not None:
            _write(folder / "memory.max", str(memory_mb * 2**20))
            if (folder / "memory.swap.max").exists():
                _write(folder / "memory.swap.max", "0")
            cgroup.memory, cgroup.memory_mb = folder, memory_mb
        if cpus is not None and "cpu" in wanted:
            _write(folder / "cpu.max", f"{max(1000, round(cpus * PERIOD_US))} {PERIOD_US}")
            cgroup.cpus = cpus
    except OSError:
        cgroup.remove(0)
        return None
    return cgroup


def _v1(folders: dict[str, Path], name: str, memory_mb: int | None, cpus: float | None) -> LearnerCgroup | None:
    """The learner's v1 cgroups (memory, cpu) under this process's own, or ``None`` where memory cannot be."""
    cgroup = LearnerCgroup(1)
    try:
        if memory_mb is not None:
            if "memory" not in folders or not os.access(folders["memory"], os.W_OK):
                return None
            folder = folders["memory"] / name
            _fresh(folder)
            cgroup.folders.append(folder)
            _write(folder / "memory.limit_in_bytes", str(memory_mb * 2**20))
            with contextlib.suppress(OSError):  # swap accounting off: no such file
                _write(folder / "memory.memsw.limit_in_bytes", str(memory_mb * 2**20))
            cgroup.memory, cgroup.memory_mb = folder, memory_mb
        if cpus is not None and "cpu" in folders and os.access(folders["cpu"], os.W_OK):
            folder = folders["cpu"] / name
            _fresh(folder)
            cgroup.folders.append(folder)
            _write(folder / "cpu.cfs_period_us", str(PERIOD_US))
            _write(folder / "cpu.cfs_quota_us", str(max(1000, round(cpus * PERIOD_US))))
            cgroup.cpus = cpus
    except OSError:
        cgroup.remove(0)
        return None
    return cgroup if cgroup.folders else None


def create(name: str, memory_mb: int | None, cpus: float | None, *, root: Path = CGROUP_ROOT,
           proc: Path = Path("/proc/self/cgroup")) -> LearnerCgroup | None:
    """A child cgroup ``name`` of this process's own with the limits written: ``memory_mb`` MiB (``None``: none)
    and ``cpus`` CPUs of quota (``None``: none); v2 where a delegated subtree allows it, else v1.

    Returns:
        The cgroup, or ``None`` where neither version can be written here (the caller falls back to affinity and
        ``RLIMIT_AS``); nothing is left behind then.
    """
    if memory_mb is None and cpus is None:
        return None
    folders = own_folders(root, proc)
    if "v2" in folders and (made := _v2(folders["v2"], name, memory_mb, cpus)) is not None:
        return made
    return _v1(folders, name, memory_mb, cpus)


def existing(name: str, *, root: Path = CGROUP_ROOT, proc: Path = Path("/proc/self/cgroup")) -> LearnerCgroup | None:
    """The cgroup ``name`` a learner was given, found again (a restarted manager's, for its OOM count and its
    removal); ``None`` where there is none under this process's cgroups."""
    folders = own_folders(root, proc)
    if "v2" in folders and (folders["v2"] / name).is_dir():
        folder = folders["v2"] / name
        return _with_limit(LearnerCgroup(2, [folder], folder if (folder / "memory.max").exists() else None))
    found = [folders[c] / name for c in ("memory", "cpu") if c in folders and (folders[c] / name).is_dir()]
    if not found:
        return None
    memory = folders["memory"] / name if "memory" in folders and folders["memory"] / name in found else None
    return _with_limit(LearnerCgroup(1, found, memory))


def _with_limit(cgroup: LearnerCgroup) -> LearnerCgroup:
    """``cgroup`` with ``memory_mb`` read back from its memory limit file (where readable and not unlimited)."""
    if cgroup.memory is not None:
        name = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            limit = int((cgroup.memory / name).read_text())
            cgroup.memory_mb = limit // 2**20 if limit < 2**62 else None
    return cgroup


def sweep(keep: set[str], owns: Callable[[str], bool], *, root: Path = CGROUP_ROOT,
          proc: Path = Path("/proc/self/cgroup")) -> list[Path]:
    """Remove the learner cgroups a previous manager left under this process's own (a removal that timed out, a
    manager that crashed before it recorded its learner): the folders named :data:`PREFIX` ``<job>-<attempt>-
    <rank>`` whose job ``owns`` says is this manager's, whose name is not in ``keep`` (the learners not ended:
    a restarted manager reads their OOM count), and that hold no process. Anything else is left alone: another
    manager's jobs, a cgroup with a process in it, a folder of another name. Returns the folders removed.
    Call it under the lock that serializes the learners' starts: a cgroup just made is empty until its learner
    joins it."""
    removed: list[Path] = []
    for folder in {f for key, f in own_folders(root, proc).items() if key in ("v2", "memory", "cpu")}:
        with contextlib.suppress(OSError):
            for child in folder.iterdir():
                parts = child.name.removeprefix(PREFIX).rsplit("-", 2)
                if (not child.name.startswith(PREFIX) or len(parts) != 3 or child.name in keep
                        or not child.is_dir() or not owns(parts[0])):
                    continue
                try:
                    if (child / "cgroup.procs").read_text().split():
                        continue  # a process in it: not this call's to end
                except FileNotFoundError:
                    pass
                except OSError:
                    continue
                with contextlib.suppress(OSError):
                    child.rmdir()
                    removed.append(child)
    return removed

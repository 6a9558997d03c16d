"""Learners as local processes (``LABSWARM_JOB_LAUNCHER=local``, the embedded default launcher of learners).

A local learner runs ``python -m labswarm.jobs.learner.entry SPEC.json`` in a session (and process group) of its
own, so it outlives a manager that stops or restarts, and its data-loading children can be killed with it. A
learner is identified by its pid together with its process start time (psutil's ``create_time``), so a pid reused
by another program is never taken for the learner: a restarted manager re-attaches to a learner that is still
alive and never starts a second copy of it.

Its ``resources`` are enforced by a cgroup of its own where this process may create one
(:mod:`labswarm.deploy.cgroups`: ``memory_mb`` of resident memory, ``cpus`` of CPU quota; a learner the OOM killer
ends there is reported as over its memory limit, the user error ``C107``), else (or with ``learner_cgroups`` off)
by its own ``RLIMIT_AS`` (:mod:`labswarm.deploy.resource_limits`: it limits its address space to ``memory_mb`` and
exits with ``C107`` past it). Either way it is pinned to ``ceil(cpus)`` cores (the least used by the other local
learners) right after it starts, so its thread pools fit its CPUs. The path applied is logged by the learner as it
starts (``resources enforced by ...``) and named in the reason of a learner the OOM killer ended.

A halt signals the learner's pid only (SIGTERM: it checkpoints and exits; its process group holds the
data-loading processes, which must not be stopped under it); a kill (watchdog, grace over, delete) sends SIGKILL
to the whole group.

With ``learner_cgroups`` unset a learner that cannot get a cgroup, or whose shell cannot join it, falls back to
affinity and ``RLIMIT_AS`` (and says so in its log); with ``learner_cgroups: true`` it fails to start instead
(``S105``, the reason in the job's log). The cgroups are made, removed and swept (at a manager's first pass: the
empty ones of its jobs' learners that are not running, :func:`~labswarm.deploy.cgroups.sweep`) only in
:meth:`LocalLearners.start`, :meth:`~LocalLearners.poll` and :meth:`~LocalLearners.sweep`, which the lifecycle
calls under its runtime lock: a sweep never removes the cgroup of a learner being started, which is empty until
it joins. A removal never waits under that lock: a cgroup whose processes are not gone yet is retried at the
next calls.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from labswarm.deploy.cgroups import (
    CGROUP_ENV,
    CGROUP_ROOT,
    EXIT_JOIN,
    EXIT_MEMORY,
    JOIN_FAILED,
    LearnerCgroup,
    cgroup_name,
    create,
    existing,
    own_folders,
    sweep,
)
from labswarm.deploy.learners import (
    EXIT_FILE,
    PROGRAM_FILE,
    LearnerHandle,
    LearnerLaunch,
    LearnerLauncher,
    LearnerRecord,
    LearnerStatus,
    learner_environment,
)
from labswarm.deploy.resource_limits import LIMITS_ENV, memory_limit_env, pick_cores
from labswarm.deploy.warm import WarmStarter
from labswarm.errors import DeployError

log = logging.getLogger(__name__)

#: How the fallback is named in a learner's log and in the job's.
FALLBACK = "CPU affinity and RLIMIT_AS (labswarm.deploy.resource_limits)"
#: Seconds a learner's cgroup may stay unremovable (a process in it not gone) before a warning is logged.
REMOVE_WARN_S = 60.0


class LocalLearners(LearnerLauncher):
    """Starts, watches and stops learner processes on this machine.

    Attributes:
        place: where each learner runs: called with the launch, the learner's command line (argv) and environment,
            it returns the command line to start instead (``labswarm compare --hosts``:
            :mod:`labswarm.compare.hosts`, the learner on another host; no cgroup then); ``None``: here.
        cgroups: the ``learner_cgroups`` setting: ``None`` a cgroup where possible, else the affinity and
            ``RLIMIT_AS`` fallback; ``True`` a cgroup or a failed start; ``False`` always the fallback.
        root, proc: where the cgroup file systems are mounted and this process's ``/proc/self/cgroup``.
        warm: learners forked by a warm process that has their modules imported (the ``learner_warm_start``
            setting, :mod:`labswarm.deploy.warm`), started with this launcher; ``False``: a new interpreter each.
    """

    def __init__(self, cgroups: bool | None = None, *, root: Path = CGROUP_ROOT,
                 proc: Path = Path("/proc/self/cgroup"), warm: bool = False) -> None:
        self.place: Callable[[LearnerLaunch, list[str], dict[str, str]], list[str]] | None = None
        self.cgroups = cgroups
        self.root, self.proc = root, proc
        self.warm = warm
        self._warm: WarmStarter | None = self._warm_process() if warm else None
        self._forked: set[int] = set()  # the learners the warm process forked
        self._groups: dict[int, LearnerCgroup] = {}  # each child learner's cgroup
        self._unremoved: list[tuple[LearnerCgroup, float | None]] = []  # cgroups whose processes were not gone yet
        self._children: dict[int, subprocess.Popen] = {}
        self._cores: dict[int, list[int]] = {}  # the cores each child learner is pinned to

    def start(self, launch: LearnerLaunch) -> LearnerHandle:
        """Write the spec to ``launch.spec_path`` and start ``python -m labswarm.jobs.learner.entry SPEC`` with the
        manager's environment less its secrets, plus the attempt's token, ``CUDA_VISIBLE_DEVICES`` and ``launch.env``
        (:func:`~labswarm.deploy.learners.learner_environment`), its raw output into ``launch.out``; pinned to
        ``ceil(resources.cpus)`` cores, its address space limited to ``resources.memory_mb``
        (:mod:`labswarm.deploy.resource_limits`).

        Returns:
            The pid and the process's create time (Unix seconds).

        Raises:
            OSError: the spec could not be written or the process could not be started.
            DeployError: ``cgroups`` is ``True`` and no cgroup could be made for the learner.
        """
        self._remove_unremoved()
        launch.spec_path.parent.mkdir(parents=True, exist_ok=True)
        launch.spec_path.write_text(json.dumps(launch.spec))
        env = learner_environment(os.environ, launch.token)  # none of the manager's secrets; the attempt's token
        if launch.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = launch.gpus
        env.update(launch.env)  # a distributed learner's place in the job and the per-job shard secret
        cgroup = self._cgroup(launch)
        fallback = {**memory_limit_env(launch.resources, env), LIMITS_ENV: FALLBACK}
        if cgroup is None:
            env.update(fallback)  # the learner limits itself once imported
            how = FALLBACK
        else:
            if cgroup.memory is not None:
                env[CGROUP_ENV] = str(cgroup.memory)
            how = cgroup.describe()
        env[LIMITS_ENV] = how  # the learner logs it as it starts
        # where the learner cannot join its cgroup: the fallback, or (cgroups required) no learner
        join_fallback = None if self.cgroups else {
            **fallback, LIMITS_ENV: f"{FALLBACK}: the learner could not join its cgroup"}
        launch.out.parent.mkdir(parents=True, exist_ok=True)
        if self.warm and self.place is None:
            return self._fork(launch, env, cgroup, join_fallback)
        with open(launch.out, "ab") as handle:
            argv = [sys.executable, "-m", "labswarm.jobs.learner.entry", str(launch.spec_path)]
            if self.place is not None:
                argv = self.place(launch, argv, env)
            if cgroup is not None:  # its shell joins it
                argv = cgroup.wrap(argv, join_fallback)
            try:
                process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            except OSError:
                if cgroup is not None:
                    self._remove(cgroup)
                raise
        self._children[process.pid] = process
        if cgroup is not None:
            self._groups[process.pid] = cgroup
        self._pin(process.pid, float(launch.resources.get("cpus") or 1.0))
        if self.on_exit is not None:
            threading.Thread(target=self._wait, args=(process, self.on_exit), daemon=True,
                             name=f"labswarm-learner-{process.pid}-exit").start()
        try:
            created = psutil.Process(process.pid).create_time()
        except psutil.Error:  # already gone: its exit is found by poll
            created = 0.0
        return LearnerHandle(pid=process.pid, pid_created=created)

    def _warm_process(self) -> WarmStarter:
        return WarmStarter(learner_environment(os.environ, ""), on_exit=lambda: self.on_exit and self.on_exit())

    def _fork(self, launch: LearnerLaunch, env: dict[str, str], cgroup: LearnerCgroup | None,
              join_fallback: dict[str, str] | None) -> LearnerHandle:
        """Start the learner through the warm process (:meth:`start` with ``warm``): the same environment, output
        file, cores and cgroup (joined by the child itself, with the same fallback) as a new interpreter gets."""
        if self._warm is None or not self._warm.alive():
            self._warm = self._warm_process()
        cores = pick_cores(float(launch.resources.get("cpus") or 1.0),
                           [c for child, c in self._cores.items() if child in self._children or child in self._forked])
        try:
            pid = self._warm.start({
                "spec": str(launch.spec_path), "env": env, "out": str(launch.out), "cwd": os.getcwd(),
                "cores": cores, "join": [str(f / "cgroup.procs") for f in cgroup.folders] if cgroup else [],
                "fallback": join_fallback})
        except OSError:
            if cgroup is not None:
                self._remove(cgroup)
            raise
        self._forked.add(pid)
        if cores is not None:
            self._cores[pid] = cores
        if cgroup is not None:
            self._groups[pid] = cgroup
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:  # already gone: its exit is found by poll
            created = 0.0
        return LearnerHandle(pid=pid, pid_created=created)

    def close(self) -> None:
        """End the warm process, if any (the learners it forked go on)."""
        if self._warm is not None:
            self._warm.close()
            self._warm = None

    def _cgroup(self, launch: LearnerLaunch) -> LearnerCgroup | None:
        """The learner's cgroup with its limits written (:func:`~labswarm.deploy.cgroups.create`), or ``None``:
        cgroups off, the learner placed on another host, no limits asked, or no writable cgroup here.

        Raises:
            DeployError: cgroups are required (``cgroups`` ``True``) and none could be made.
        """
        if self.cgroups is False or self.place is not None:
            return None
        memory, cpus = launch.resources.get("memory_mb"), launch.resources.get("cpus")
        if not memory and not cpus:
            return None
        made = create(cgroup_name(launch.job_id, launch.attempt, launch.rank), int(memory) if memory else None,
                      float(cpus) if cpus else None, root=self.root, proc=self.proc)
        if made is None and self.cgroups:
            folders = own_folders(self.root, self.proc)
            raise DeployError(
                f"LABSWARM_LEARNER_CGROUPS=true, but no cgroup with the learner's limits (resources.memory_mb "
                f"{memory}, resources.cpus {cpus}) could be made under this manager's cgroups "
                f"({', '.join(f'{k}: {v}' for k, v in sorted(folders.items())) or 'none found'}): no writable "
                f"memory controller there; unset it to fall back to {FALLBACK}")
        if made is not None:
            # a removal of the same name left to retry (the learner this one replaces in its attempt, restarted
            # alone, whose processes were not gone yet) is over: create() makes a folder afresh only once no
            # process is in it, and retrying that removal would kill this learner once it joins
            self._unremoved = [(c, since) for c, since in self._unremoved if not set(c.folders) & set(made.folders)]
        return made

    def _pin(self, pid: int, cpus: float) -> None:
        """Pin the new learner ``pid`` to its cores (:func:`~labswarm.deploy.resource_limits.pick_cores`: the
        least used by the live children), before it starts its threads (Python takes longer to start)."""
        live = [cores for child, cores in self._cores.items() if child in self._children]
        cores = pick_cores(cpus, live)
        if cores is None:
            return
        try:
            os.sched_setaffinity(pid, cores)
        except OSError:  # already gone: its exit is found by poll
            return
        self._cores[pid] = cores

    @staticmethod
    def _wait(process: subprocess.Popen, on_exit: Callable[[], None]) -> None:
        """Wait for the process to exit (its status stays in ``process``: :meth:`poll` reads it), then call
        ``on_exit``."""
        process.wait()
        on_exit()

    def poll(self, learner: LearnerRecord) -> LearnerStatus:
        """Alive, or its exit code (``None``: unknown, e.g. killed while this manager was not its parent)."""
        self._remove_unremoved()
        pid, created = learner.pid, learner.pid_created
        if pid is None:
            return LearnerStatus(False)
        child = self._children.get(pid)
        if child is not None:
            code = child.poll()
            if code is None:
                return LearnerStatus(True)
            del self._children[pid]
            self._cores.pop(pid, None)
            return self._ended(learner, LearnerStatus(False, code), self._groups.pop(pid, None))
        if pid in self._forked and (forked := self._poll_forked(learner, pid)) is not None:
            return forked
        if self._alive(pid, created):
            return LearnerStatus(True)
        cgroup = (None if self.cgroups is False else
                  existing(cgroup_name(learner.job_id, learner.attempt, learner.rank), root=self.root, proc=self.proc))
        try:
            status = LearnerStatus(False, int(json.loads((Path(learner.workdir) / EXIT_FILE).read_text())["code"]))
        except (OSError, ValueError, KeyError, TypeError):
            status = LearnerStatus(False)
        return self._ended(learner, status, cgroup)

    def _poll_forked(self, learner: LearnerRecord, pid: int) -> LearnerStatus | None:
        """:meth:`poll` of a learner the warm process forked: alive, or ended with the code it reported; ``None``
        where its end was not heard (the warm process gone): read as any other learner's."""
        code = self._warm.exit_code(pid) if self._warm is not None else None
        if code is None and self._alive(pid, learner.pid_created):
            return LearnerStatus(True)
        self._forked.discard(pid)
        self._cores.pop(pid, None)
        if code is None:
            self._groups.pop(pid, None)
            return None
        return self._ended(learner, LearnerStatus(False, code), self._groups.pop(pid, None))

    def sweep(self, live: set[str], owns: Callable[[str], bool]) -> None:
        """A manager's first pass: remove the empty cgroups of its jobs' learners that ``live`` does not name
        (:func:`~labswarm.deploy.cgroups.sweep`; ``live``: the handles of the learners not ended, a local
        learner's being its cgroup's name, :func:`~labswarm.deploy.cgroups.cgroup_name`)."""
        self._remove_unremoved()
        for folder in sweep(live, owns, root=self.root, proc=self.proc):
            log.info("removed the empty cgroup %s a previous manager's learner left", folder)

    def _ended(self, learner: LearnerRecord, status: LearnerStatus, cgroup: LearnerCgroup | None) -> LearnerStatus:
        """The status of a learner that ended, its cgroup (if any) removed: killed (SIGKILL, or of unknown status)
        while its cgroup's OOM killer had struck, it ended over its memory limit (:data:`EXIT_MEMORY`: ``C107``);
        its shell could not join the cgroup (:data:`EXIT_JOIN` and :data:`JOIN_FAILED` in its output), it never
        started (``S105``)."""
        if cgroup is None:
            return status
        killed = status.exit_code in (None, -signal.SIGKILL, 128 + signal.SIGKILL)
        if killed and cgroup.oom_kills() > 0:
            status = LearnerStatus(False, EXIT_MEMORY, reason=(
                f"the learner went over its memory limit (resources.memory_mb: {cgroup.memory_mb} MiB) and the "
                f"kernel's OOM killer ended it ({cgroup.describe()}): raise resources.memory_mb or use less memory"))
        elif status.exit_code in (None, EXIT_JOIN) and any(JOIN_FAILED in line
                                                           for line in self.output_tail(learner, 20)):
            status = LearnerStatus(False, status.exit_code, deploy_failed=True, reason=(
                f"it could not join its cgroup ({cgroup.describe()}), which LABSWARM_LEARNER_CGROUPS=true "
                f"requires; its shell's error is in the learner's raw output"))
        self._remove(cgroup)
        return status

    def _remove(self, cgroup: LearnerCgroup) -> None:
        """Remove ``cgroup`` without waiting (its processes killed); where one is not gone yet, later calls
        retry (:meth:`_remove_unremoved`)."""
        if not cgroup.remove(timeout=0):
            self._unremoved.append((cgroup, time.monotonic()))

    def _remove_unremoved(self) -> None:
        """Try again to remove the cgroups whose processes were not gone; warn once of one left a minute."""
        still = []
        for cgroup, since in self._unremoved:
            if cgroup.remove(timeout=0):
                continue
            if since is not None and time.monotonic() - since > REMOVE_WARN_S:
                log.warning("a learner's cgroup could not be removed for %.0f s (a process still in it): %s",
                            REMOVE_WARN_S, ", ".join(str(f) for f in cgroup.folders))
                since = None
            still.append((cgroup, since))
        self._unremoved = still

    def terminate(self, learner: LearnerRecord) -> None:
        """SIGTERM to the learner only (a cooperative halt)."""
        if learner.pid is not None and self._alive(learner.pid, learner.pid_created):
            with contextlib.suppress(ProcessLookupError):
                os.kill(learner.pid, signal.SIGTERM)

    def kill(self, learner: LearnerRecord) -> None:
        """SIGKILL to the learner's whole process group (its data-loading children too) and to the groups of its
        other descendants (a ``command`` learner's program runs in a group of its own: :data:`PROGRAM_FILE`, read
        also when the learner is already gone); also cleans up what a dead learner left behind in its group."""
        if learner.pid is None:
            return
        groups = {learner.pid}  # its session's group: pgid == pid
        if self._alive(learner.pid, learner.pid_created):
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(learner.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error, OSError):
                        groups.add(os.getpgid(child.pid))
        if (program := _program(Path(learner.workdir) / PROGRAM_FILE)) is not None:
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(program))
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(learner.pid, signal.SIGKILL)

    def output_tail(self, learner: LearnerRecord, lines: int) -> list[str]:
        """The last lines of ``learner-<rank>.out`` beside its working folder."""
        out = Path(learner.workdir).parent / f"learner-{learner.rank}.out"
        try:
            return out.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        except OSError:
            return []

    def _alive(self, pid: int, created: float | None) -> bool:
        try:
            process = psutil.Process(pid)
            if created and abs(process.create_time() - created) > 0.05:
                return False  # the pid now belongs to another process
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


def _program(path: Path) -> int | None:
    """The pid of the program :data:`PROGRAM_FILE` names, if that very process (same start time) still runs."""
    try:
        pid, created = path.read_text().split()
        process = psutil.Process(int(pid))
        return process.pid if abs(process.create_time() - float(created)) < 0.01 else None
    except (OSError, ValueError, psutil.Error):
        return None

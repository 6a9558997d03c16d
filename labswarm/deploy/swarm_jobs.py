"""What a job's docker swarm services share, the learners' (:mod:`labswarm.deploy.swarm_learners`) and the
parameter-server shards' (:mod:`labswarm.deploy.swarm_shards`): their labels and names, the engine client, the
removal of a labelled set (service, secret, config) of one job only, and a learner's or shard's status read from
its service's tasks.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from labswarm.deploy.learners import LearnerStatus
from labswarm.deploy.swarm_secrets import LABEL_MANAGED
from labswarm.deploy.swarm_spec import docker_sdk, translate_errors
from labswarm.errors import DeployError

if TYPE_CHECKING:
    from labswarm.settings import Settings

#: Labels of a learner's service, secret and config (besides ``labswarm.managed``).
LABEL_JOB = "labswarm.job"
LABEL_ATTEMPT = "labswarm.attempt"
LABEL_RANK = "labswarm.rank"
#: Label of a parameter-server shard's service and secret (:mod:`labswarm.deploy.swarm_shards`): its index.
LABEL_SHARD = "labswarm.shard"
#: Seconds a removed learner's container gets between SIGTERM and SIGKILL (a kill; a halt had its grace).
KILL_GRACE_S = 5.0
#: Task states of a learner that has not ended (docker's, before and while running).
ALIVE_STATES = frozenset({"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting",
                          "running"})

def learner_service_name(job_id: str, attempt: int | str, rank: int | str) -> str:
    """``labswarm-job-<job>-<attempt>-<rank>`` (a job id is 12 hex digits: well within a service name's 63);
    ``attempt`` and ``rank`` as numbers or as a service's labels hold them."""
    return f"labswarm-job-{job_id}-{attempt}-{rank}"


def ps_service_name(job_id: str, index: int | str) -> str:
    """``labswarm-job-<job>-ps-<index>``: the service of a job's parameter-server shard (its address on the
    overlay network)."""
    return f"labswarm-job-{job_id}-ps-{index}"


class JobServices:
    """The Docker engine as a job's services see it: the client, and the removal of one job's labelled sets.

    Args:
        settings: the ``swarm_*`` settings (image, network, data mount, constraints, the manager's URL as the
            containers reach it).
        client: a ``docker.DockerClient``; default ``docker.from_env()`` on first use.
    """

    def __init__(self, settings: Settings, client: Any = None) -> None:
        self.settings = settings
        self._client = client

    @property
    def client(self) -> Any:
        """The docker client.

        Raises:
            DeployError: the docker SDK is missing or the engine cannot be reached.
        """
        if self._client is None:
            docker = docker_sdk()
            with translate_errors("connect to the Docker engine (DOCKER_HOST or /var/run/docker.sock)"):
                self._client = docker.from_env()
        return self._client

    def exists(self, name: str) -> bool:
        """Whether a service of this name exists."""
        try:
            self.client.services.get(name)
        except docker_sdk().errors.NotFound:
            return False
        return True

    def remove_named(self, name: str, job_id: str, service_id: str | None = None, check: bool = False) -> None:
        """Remove the service (by id when known, else by name), the secret and the config of a learner, those of
        ``job_id`` only (``check``: one of another owner raises :class:`DeployError`)."""
        errors = docker_sdk().errors
        for kind, collection, key in (("service", self.client.services, service_id or name),
                                      ("secret", self.client.secrets, f"{name}-env"),
                                      ("config", self.client.configs, f"{name}-spec")):
            try:
                item = collection.get(key)
            except errors.NotFound:
                continue
            labels = (item.attrs.get("Spec") or {}).get("Labels") or {}
            if labels.get(LABEL_MANAGED) != "true" or labels.get(LABEL_JOB) != job_id:
                if check:
                    raise DeployError(f"a docker {kind} named {key} exists and is not labswarm's for job {job_id}; "
                                      f"remove it (docker {kind} rm)")
                continue
            with contextlib.suppress(errors.NotFound):
                item.remove()


def task_status(tasks: list[dict[str, Any]]) -> LearnerStatus:
    """A learner's status from its service's tasks (the latest one's state; none yet: being created).

    ``running`` and the states before it: alive; ``complete``: exit 0 (or the container's code); ``failed`` and
    ``shutdown``: the container's exit code (``None`` when it has none); ``rejected``: a deploy failure;
    ``orphaned``, ``remove`` and any other: exit status unknown.
    """
    if not tasks:
        return LearnerStatus(True)
    task = max(tasks, key=lambda t: (t.get("CreatedAt") or "", (t.get("Version") or {}).get("Index", 0)))
    status = task.get("Status") or {}
    state = status.get("State", "")
    if state in ALIVE_STATES:
        return LearnerStatus(True)
    code = (status.get("ContainerStatus") or {}).get("ExitCode")
    why = status.get("Err") or status.get("Message") or ""
    reason = f"its task is {state}" + (f": {why}" if why else "")
    if state == "complete":
        return LearnerStatus(False, 0 if code is None else int(code), reason=None)
    if state in ("failed", "shutdown"):
        return LearnerStatus(False, None if code is None else int(code), reason=reason)
    if state == "rejected":
        return LearnerStatus(False, None, deploy_failed=True, reason=reason)
    return LearnerStatus(False, None, reason=reason)

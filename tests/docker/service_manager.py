"""A manager that is itself a swarm service, for the contract test of a killed manager container
(tests/docker/test_swarm_manager.py): the image's ``manager`` role as a one-replica service on the host network,
its state (the SQLite ledger) in the test's shared folder, the engine's socket mounted so that its swarm launcher
makes the sessions' worker services, restarted by swarm when its container dies (restart condition on-failure).

Everything else (the experiment, the sessions' worker service, the checks) is :class:`HostManager`'s.
"""

from __future__ import annotations

import json
import os
import uuid

import httpx
from engine import BROKER, LABEL, TOKEN, docker, wait_for
from host_manager import HostManager, task_states

#: The engine's socket; the manager runs as the image's user with the socket's group.
SOCKET = "/var/run/docker.sock"


class ServiceManager(HostManager):
    """:class:`HostManager` whose manager is the service :attr:`manager_service` (created by :meth:`serve`)."""

    def serve(self) -> None:
        shared = self.settings.swarm_data_volume
        home = self.settings.home
        home.mkdir(parents=True, exist_ok=True)
        home.chmod(0o777)  # the manager runs as the image's user (uid 1000)
        self.manager_service = f"labswarm-test-manager-{uuid.uuid4().hex[:8]}"
        env = {"LABSWARM_HOME": str(home), "LABSWARM_BROKER_URL": BROKER, "LABSWARM_API_TOKEN": TOKEN,
               "LABSWARM_RECONCILE_AFTER": str(self.settings.reconcile_after),
               "LABSWARM_DATA_ROOTS": json.dumps([shared]),
               "LABSWARM_SWARM_IMAGE": self.settings.swarm_image, "LABSWARM_SWARM_NETWORK": "host",
               "LABSWARM_SWARM_MANAGER_URL": self.url, "LABSWARM_SWARM_DATA_VOLUME": shared,
               "LABSWARM_SWARM_DATA_TARGET": self.settings.swarm_data_target,
               "LABSWARM_SWARM_STOP_GRACE": str(self.settings.swarm_stop_grace)}
        options = ["--detach", "--name", self.manager_service, "--network", "host", "--label", LABEL,
                   "--restart-condition", "on-failure", "--restart-delay", "1s", "--init",
                   "--group", str(os.stat(SOCKET).st_gid),
                   "--mount", f"type=bind,source={shared},target={shared}",
                   "--mount", f"type=bind,source={SOCKET},target={SOCKET}"]
        for key, value in env.items():
            options += ["--env", f"{key}={value}"]
        docker("service", "create", *options, self.settings.swarm_image,
               "manager", "--host", "127.0.0.1", "--port", str(self.port))
        self.wait_answers()

    def answers(self) -> bool:
        """The manager's ``/health`` answers 200."""
        try:
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_answers(self, timeout: float = 300.0) -> None:
        try:
            wait_for(f"the manager service {self.manager_service} answering on {self.url}", self.answers, timeout)
        except BaseException:
            print(docker("service", "logs", "--tail", "40", self.manager_service, check=False).stdout)
            print(task_states(self.manager_service))
            raise

    def manager_containers(self) -> list[str]:
        """Ids of the manager service's running containers."""
        return docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={self.manager_service}",
                      "--filter", "status=running").stdout.split()

    def stop_serving(self) -> None:
        docker("service", "rm", self.manager_service, check=False)
        wait_for(f"{self.manager_service}'s containers gone", lambda: not docker(
            "ps", "-aq", "--filter", f"label=com.docker.swarm.service.name={self.manager_service}").stdout.strip(),
            120)

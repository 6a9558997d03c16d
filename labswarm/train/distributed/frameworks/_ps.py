"""The shared part of the parameter-server frameworks (``sandblaster``, ``downpour``, ``easgd``)."""

from __future__ import annotations

from typing import Any

from labswarm.train.distributed.frameworks.base import Framework


def optimizer_spec(optimizer: Any) -> dict[str, Any]:
    """The learner optimizer's class name and its scalar defaults, for the shards to build the same one."""
    defaults = {k: (list(v) if isinstance(v, tuple) else v) for k, v in optimizer.defaults.items()
                if isinstance(v, int | float | bool | tuple) and k not in ("foreach", "fused", "capturable",
                                                                             "differentiable")}
    return {"kind": type(optimizer).__name__, "defaults": defaults}


class ParameterServerFramework(Framework):
    """Connects to the shards at :meth:`attach` (proving the job's secret, ``LABSWARM_PS_SECRET``, when set), offers
    the learner's starting parameters and optimizer (the first learner's win), then pulls: every learner starts from
    the same parameters. :meth:`finish` pulls the server's parameters into the model (the model a parameter-server
    job delivers is the server's)."""

    needs_parameter_server = True

    def _attach(self) -> Any:
        import os

        from labswarm.train.distributed.ps.auth import SECRET_ENV
        from labswarm.train.distributed.ps.client import ParameterServerClient

        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self._names = [n for n, _ in named]
        self.client = ParameterServerClient(self.context.ps_addresses, self._names, [p.numel() for _, p in named],
                                            timeout_s=self.context.timeout_s,
                                            secret=os.environ.get(SECRET_ENV) or None)
        self.client.init([p.detach() for _, p in named], optimizer_spec(self.optimizer))
        self._load(self.client.pull())
        self._count()
        return self.model

    def _count(self) -> None:
        """Move the client's byte count into the stats."""
        self.stats.bytes_sent = self.client.bytes_sent

    def _load(self, arrays: list[Any]) -> None:
        """Copy arrays (``names`` order) into the model's parameters."""
        import torch

        for p, a in zip(self._params(), arrays, strict=True):
            p.data.copy_(torch.from_numpy(a).reshape(p.shape))

    def _grads(self) -> list[Any]:
        import torch

        return [p.grad.detach() if p.grad is not None else torch.zeros_like(p) for p in self._params()]

    def finish(self) -> None:
        """Pull the server's parameters (the center variable for ``easgd``) into the model."""
        self._load(self.client.pull())
        self._count()

    def close(self) -> None:
        """Remove the hook and close the shard connections."""
        super().close()
        if getattr(self, "client", None) is not None:
            self.client.close()

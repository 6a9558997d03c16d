"""``easgd``: elastic averaging SGD through the parameter server.

Source: Zhang, Choromanska & LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015 (arXiv 1412.6651),
Algorithm 1 (asynchronous EASGD): every ``tau`` steps worker ``i`` computes ``d = alpha (x_i - x_center)``,
sets ``x_i -= d`` and the master sets ``x_center += d``; between those, local SGD steps.
"""

from __future__ import annotations

from pydantic import Field

from labswarm.train.distributed.frameworks._ps import ParameterServerFramework
from labswarm.train.distributed.frameworks.base import FrameworkConfig, register_framework


class EASGDConfig(FrameworkConfig):
    """Parameters of :class:`EASGD`.

    Attributes:
        alpha: the moving rate, in (0, 1) (the paper's ``alpha = eta * rho``; it recommends
            ``beta = p * alpha = 0.9`` for ``p`` workers: with 2 learners, 0.45; default 0.1, a gentle pull).
        tau: the communication period in local steps (the paper tries 1 to 64; default 4).
    """

    alpha: float = Field(0.1, gt=0.0, lt=1.0)
    tau: int = Field(4, ge=1)


@register_framework
class EASGD(ParameterServerFramework):
    """Every ``tau`` steps the learner sends its parameters to the shards, which move the center variable by
    ``d = alpha (x_i - center)`` in one atomic step and answer ``d``; the learner subtracts it. The model a job
    delivers is the center (:meth:`finish` pulls it).

    Failure semantics: asynchronous; a dead learner is restarted alone, pulls the center and goes on; a shard
    that restarts loses the center's moves after its last checkpoint.
    """

    name = "easgd"
    config_model = EASGDConfig
    config: EASGDConfig
    synchronous = False

    def after_step(self) -> None:
        """Every ``tau`` steps: the elastic exchange."""
        import torch

        if self.steps % self.config.tau:
            return
        diffs = self.client.elastic([p.detach() for p in self._params()], self.config.alpha)
        for p, d in zip(self._params(), diffs, strict=True):
            p.data.sub_(torch.from_numpy(d).reshape(p.shape))
        self.stats.syncs += 1
        self._count()

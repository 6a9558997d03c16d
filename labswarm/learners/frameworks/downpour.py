"""``downpour``: asynchronous parameter server: learners pull every ``n_fetch`` steps and push every ``n_push``
steps without waiting for each other.

Sources: Dean et al., "Large Scale Distributed Deep Networks" (NIPS 2012: Downpour SGD, its ``n_fetch`` and
``n_push``); SINGA's Downpour framework (Wang et al., ACM MM 2015).
"""

from __future__ import annotations

from pydantic import Field

from labswarm.learners.frameworks._ps import ParameterServerFramework
from labswarm.learners.frameworks.base import FrameworkConfig, register_framework


class DownpourConfig(FrameworkConfig):
    """Parameters of :class:`Downpour`.

    Attributes:
        n_fetch: steps between two pulls of the server's parameters (Dean et al.'s ``n_fetch``; default 1).
        n_push: steps between two pushes of the gradients accumulated since the last push (``n_push``;
            default 1).
    """

    n_fetch: int = Field(1, ge=1)
    n_push: int = Field(1, ge=1)


@register_framework
class Downpour(ParameterServerFramework):
    """Each learner steps its own replica with its own optimizer, sums its gradients, pushes the sum every
    ``n_push`` steps (the shards apply it at once with the learner's optimizer class and settings) and replaces
    its replica with the server's parameters every ``n_fetch`` steps. Staleness (``CommStats.staleness``): per
    push, the updates the server applied since this learner's last pull.

    Not built yet: SINGA's synchronous worker groups inside Downpour (groups of learners all-reducing among
    themselves, one push per group).

    Failure semantics: asynchronous; a dead learner is restarted alone and pulls the current parameters; the
    others never wait for it. A shard that restarts loses the updates after its last checkpoint.
    """

    name = "downpour"
    config_model = DownpourConfig
    config: DownpourConfig
    synchronous = False

    def after_step(self) -> None:
        """Accumulate; push every ``n_push`` steps; pull every ``n_fetch`` steps."""
        grads = self._grads()
        acc = getattr(self, "_acc", None)
        self._acc = [g.clone() for g in grads] if acc is None else [a.add_(g) for a, g in zip(acc, grads,
                                                                                                strict=True)]
        if self.steps % self.config.n_push == 0:
            self.stats.staleness.append(self.client.push(self._acc))
            self._acc = None
            self.stats.syncs += 1
        if self.steps % self.config.n_fetch == 0:
            self._load(self.client.pull())
            self.stats.syncs += 1
        self._count()

    def finish(self) -> None:
        """Push the gradients accumulated since the last push (fewer than ``n_push`` steps' worth), then pull
        the server's parameters: the last steps count in the model the job delivers."""
        if getattr(self, "_acc", None) is not None:
            self.stats.staleness.append(self.client.push(self._acc))
            self._acc = None
            self.stats.syncs += 1
        super().finish()

"""``sandblaster``: synchronous parameter server: every learner's gradients reach the server each step, the
server applies their mean, every learner gets the new parameters.

Sources: Dean et al., "Large Scale Distributed Deep Networks" (NIPS 2012: Sandblaster L-BFGS's coordinator and
parameter-server shards); SINGA's Sandblaster framework (Wang et al., ACM MM 2015; Ooi et al. 2015).
"""

from __future__ import annotations

from labswarm.train.distributed.frameworks._ps import ParameterServerFramework
from labswarm.train.distributed.frameworks.base import GlobalBatchConfig, register_framework


@register_framework
class Sandblaster(ParameterServerFramework):
    """After each local step the learner pushes its gradients to a synchronous round on every shard; the last
    learner in completes the round, the shard applies the mean gradient with the learner's optimizer (the same
    class and settings), and every learner loads the new parameters. The learner's own optimizer step is thus
    overwritten (it keeps the trainer unchanged; its cost is one local update per step). With equal per-learner
    batches this is one learner on the concatenated batch (``tests/learners/test_ps.py`` checks it).

    Parameters: ``batch`` (``global``, the default: each learner steps on the experiment's batch size / N, so a
    round's mean gradient is that of the experiment's batch; ``per_learner``: each learner a whole batch, the
    behaviour before it; :class:`~labswarm.train.distributed.frameworks.base.GlobalBatchConfig`). The shards'
    ``ps_shards`` and the round timeout are the job's. No learning-rate scaling: the shards apply the mean with
    the learners' optimizer settings as sent.

    Failure semantics: synchronous; a round a learner never joins times out on the shards (``--round-timeout``),
    the others' steps fail, and the learners restart together from the last checkpoint.
    """

    name = "sandblaster"
    equal_replicas = True
    config_model = GlobalBatchConfig

    def after_step(self) -> None:
        """Push this step's gradients into the round; load the parameters the round produced."""
        self._load(self.client.push_sync(self._grads()))
        self.stats.syncs += 1
        self._count()

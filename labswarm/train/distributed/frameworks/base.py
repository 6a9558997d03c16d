"""The training-framework base class and registry: how a learner's steps meet the other learners'.

A framework is a hook on the one trainer, not a fork of it (torchft's ``LocalSGD`` shape, STYLE.md rule 12):
:meth:`Framework.attach` takes the learner's model and optimizer, registers an optimizer step post-hook and
returns the module the trainer must run its forward pass through (``DistributedDataParallel`` for ``allreduce``,
the model itself otherwise). After every ``optimizer.step()`` the hook calls :meth:`Framework.after_step`, where
a framework averages, pushes or pulls. The trainer loop is unchanged::

    framework = Framework.from_spec({"name": "model_averaging", "period": 4})
    module = framework.attach(model, optimizer, LearnerContext.from_env())
    for x, y in batches:                      # the trainer's loop, as today
        optimizer.zero_grad(); loss_fn(module(x), y).backward(); optimizer.step()   # -> after_step()
    framework.close()

Frameworks whose class says ``needs_parameter_server`` talk to the shards in ``LearnerContext.ps_addresses``;
the others to the process group the context joins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field

from labswarm.config.topology import Topology
from labswarm.errors import ConfigError
from labswarm.plugin import PluginConfig, build_plugin
from labswarm.registry import FRAMEWORKS
from labswarm.train.distributed.context import DEFAULT_TIMEOUT_S, LearnerContext


class FrameworkConfig(PluginConfig):
    """Base config of a framework; subclasses add their parameters.

    Attributes:
        timeout_s: seconds any one collective operation, parameter-server request or round, or coordinator store
            wait may take (> 0, at most 3600; default :data:`~labswarm.train.distributed.context.DEFAULT_TIMEOUT_S`,
            30):
            a learner whose peer hangs fails its step within it and the job restarts, where torch's own default
            (``default_pg_timeout``) waits 30 minutes. The learners' first join of their process group may take
            longer (:data:`~labswarm.train.distributed.context.JOIN_TIMEOUT_S`: they start seconds apart); it
            bounds the wait for rank 0's checkpoint on a halt (rank 0's validation alone is
            waited for in the store instead: :mod:`labswarm.train.distributed.rank0_wait`). It reaches
            the learners as ``LABSWARM_COLLECTIVE_TIMEOUT_S`` and the shards as ``--round-timeout``.
        topology: the SINGA cluster topology the framework runs (:mod:`labswarm.config.topology`; a job fills it
            in, :meth:`labswarm.config.frameworks.DistributedFramework.resolve`); carried, not read, here.
    """

    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, le=3600)
    topology: Topology | None = None


class LrScalingConfig(FrameworkConfig):
    """The learning-rate scaling of a framework whose update averages the batches of several learners
    (:mod:`labswarm.train.distributed.lr_scaling`; Goyal et al. 2017, arXiv 1706.02677). Applied by the trainer's
    distributed mode, on top of the trainer's epoch schedule.

    Attributes:
        lr_scaling: ``linear`` (the rate × N learners after the warm-up), ``sqrt`` (× √N, for adaptive optimizers)
            or ``none``. Each framework documents its default.
        lr_warmup_epochs: epochs of the linear ramp from the base rate to the scaled one (>= 0; default 1: Goyal
            et al. ramp over 5 of 90 epochs, the demo experiment trains 2-6); ignored with ``lr_warmup_steps``.
        lr_warmup_steps: the ramp in optimizer steps instead (>= 0; ``None``: ``lr_warmup_epochs``).
    """

    lr_scaling: Literal["linear", "sqrt", "none"] = "none"
    lr_warmup_epochs: float = Field(1.0, ge=0, le=1000)
    lr_warmup_steps: int | None = Field(None, ge=0, le=10**9)


class GlobalBatchConfig(FrameworkConfig):
    """The batch setting of a synchronous data-parallel framework, whose every update averages the gradients of
    all ``N`` learners' batches (``allreduce``, ``sandblaster``).

    Attributes:
        batch: ``global`` (the default): the experiment's batch size (its pipeline's ``batch`` block ``size``) is
            the **global** batch, the samples of one update: each learner steps on ``size / N`` samples (the
            cursor's chunks), so ``N`` learners take the same optimizer steps per epoch on the same batches'
            worth of samples as one learner, and the rate tuned for one learner still fits (the rate scaling's
            ``k`` is 1). ``size`` must divide by ``N``: refused otherwise (naming ``framework.batch``), as
            TensorFlow's ``tf.distribute.InputContext.get_per_replica_batch_size`` ("the global batch size which
            should be divisible by num_replicas_in_sync", ``ValueError`` otherwise) and DeepSpeed
            (``train_batch_size`` must equal the per-GPU micro batch × accumulation steps × GPUs) refuse it,
            rather than train unequal batches that the mean of the learners' mean gradients would weigh wrong.
            ``per_learner``: the batch size is each learner's, as PyTorch ``DistributedDataParallel``'s
            ``batch_size`` is per process (the global batch ``N × size``, the behaviour before this setting);
            the framework's ``lr_scaling`` then multiplies the rate for the ``N`` times larger batch (Goyal et
            al., "Accurate, Large Minibatch SGD", 2017, arXiv 1706.02677: "when the minibatch size is multiplied
            by k, multiply the learning rate by k", their ``k`` workers of ``n`` samples each).
            Why ``global`` is the default: measured (``docs/benchmarks/frameworks.md``, issue 23 item 6), 2
            ``allreduce`` learners of ``per_learner`` batches reached the demo's 0.8 accuracy 1.12x later than
            one learner, whatever the warm-up (half the updates per epoch), and 1.47x sooner on the global batch
            (one round; that run still ramped the rate to 2x, which ``global`` no longer does: its global batch
            is the experiment's, so the rule's ``k`` is 1).
    """

    batch: Literal["global", "per_learner"] = "global"


@dataclass
class CommStats:
    """What a learner's framework sent and how stale its parameters were.

    Attributes:
        bytes_sent: payload bytes this learner sent (tensor data only: gradients, parameters, deltas).
        syncs: communication rounds (an all-reduce, an average, a push or a pull).
        staleness: for asynchronous frameworks, per push: how many server updates happened between this
            learner's last pull and the push (0: fresh); ``distributed_hogwild``: per exchange, the steps this
            learner took beyond its neighbour's replica.
        divergence: ``distributed_hogwild``, per exchange: the root-mean-square difference between this learner's
            replica and its neighbour's, before they are averaged (parameter units).
    """

    bytes_sent: int = 0
    syncs: int = 0
    staleness: list[int] = field(default_factory=list)
    divergence: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-serializable summary (staleness as p50 / p99 / max; divergence: the first and the last)."""
        out: dict[str, Any] = {"bytes_sent": self.bytes_sent, "syncs": self.syncs}
        if self.staleness:
            ordered = sorted(self.staleness)
            out["staleness_p50"] = ordered[len(ordered) // 2]
            out["staleness_p99"] = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
            out["staleness_max"] = ordered[-1]
        if self.divergence:
            out["divergence_first"], out["divergence_last"] = self.divergence[0], self.divergence[-1]
        return out


class Framework(ABC):
    """Base of every framework; owns the hook plumbing, subclasses implement :meth:`_attach` and
    :meth:`after_step`.

    Class attributes:
        name: the registry name used in a manifest (``framework: {name: ...}``).
        config_model: the pydantic model of the parameters.
        synchronous: learners wait for each other every step (``True``): after a learner dies they restart
            together from the last checkpoint; asynchronous ones (``False``) restart the dead learner alone,
            which pulls the current parameters.
        needs_parameter_server: the lifecycle deploys ``ps_shards`` parameter-server processes first.
        equal_replicas: after every step all learners hold the same parameters (``allreduce``, ``sandblaster``), so
            the trainer's distributed mode shards validation over them (each validates a disjoint part of the
            validation split, the sums are all-reduced); otherwise rank 0 validates its own replica alone.
    """

    name: ClassVar[str]
    config_model: ClassVar[type[FrameworkConfig]] = FrameworkConfig
    synchronous: ClassVar[bool] = True
    needs_parameter_server: ClassVar[bool] = False
    equal_replicas: ClassVar[bool] = False

    def __init__(self, config: FrameworkConfig | None = None) -> None:
        self.config = config if config is not None else self.config_model(name=self.name)
        self.stats = CommStats()
        self.steps = 0
        self.model: Any = None
        self.optimizer: Any = None
        self.context = LearnerContext()
        self._handle: Any = None
        self._owns_process_group = False  # joined by :meth:`_join_own_group`, destroyed by :meth:`close`

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | FrameworkConfig) -> Framework:
        """Build the registered framework a spec (``{name: ..., **params}`` or a config) names.

        Raises:
            ConfigError: unknown name (the message lists the known names) or invalid parameters.
        """
        return build_plugin(FRAMEWORKS, spec)

    def attach(self, model: Any, optimizer: Any, context: LearnerContext) -> Any:
        """Hook into a learner's training: after this, every ``optimizer.step()`` calls :meth:`after_step`.

        Args:
            model: the learner's ``torch.nn.Module`` (parameters already on their device).
            optimizer: its ``torch.optim.Optimizer``.
            context: the learner's rank, peers and addresses; the process group is joined by the caller
                (:meth:`LearnerContext.init_process_group`) for frameworks that use one.

        Returns:
            The module to run the forward pass through (the model, or a wrapper such as DDP).
        """
        self.model, self.optimizer, self.context = model, optimizer, context
        module = self._attach()
        self._handle = optimizer.register_step_post_hook(lambda _opt, _args, _kwargs: self._stepped())
        return module

    @property
    def group_size(self) -> int:
        """Learners per worker group when the groups are asynchronous to each other (SINGA's worker groups:
        ``downpour``'s and ``distributed_hogwild``'s ``group_size``): the trainer steps in lockstep inside a group
        only, each group in its own process group (:meth:`LearnerContext.join_group`), and a dead group restarts
        alone, its members agreeing on one checkpoint. 1 (the default): no such groups (a :attr:`synchronous`
        framework steps all its learners together)."""
        return 1

    def _stepped(self) -> None:
        self.steps += 1
        self.after_step()

    def check_learners(self, learners: int) -> None:  # noqa: B027  (an optional hook)
        """Check the parameters against a job of ``learners`` learners (a no-op here; ``downpour``'s
        ``group_size`` must divide it).

        Raises:
            ConfigError: a parameter does not fit (the error names it, e.g. ``framework.group_size``).
        """

    def learner_batch(self, batch_size: int, learners: int) -> int:
        """A learner's batch (the cursor's chunk size) when the experiment's batch size is ``batch_size`` and
        ``learners`` learners step together: ``batch_size / learners`` under a ``batch: global`` setting
        (:class:`GlobalBatchConfig`), else ``batch_size`` (every other framework: each learner's steps are its
        own, the batch is each learner's).

        Raises:
            ConfigError: ``batch: global`` and ``batch_size`` does not divide by ``learners`` (names
                ``framework.batch``).
        """
        if getattr(self.config, "batch", "per_learner") != "global" or learners <= 1:
            return batch_size
        if batch_size % learners:
            raise ConfigError([("framework.batch", (
                f"global: the experiment's batch size {batch_size} (its pipeline's batch block's `size`) does not "
                f"divide across {learners} learners; give a size divisible by {learners}, another number of "
                "learners, or batch: per_learner (each learner a batch of that size)"))])
        return batch_size // learners

    def batch_factor(self, learners: int) -> int:
        """How many times the experiment's batch one update of ``learners`` lock-stepped learners averages: 1
        under ``batch: global``, ``learners`` otherwise (the ``k`` of the learning-rate scaling rule,
        :mod:`labswarm.train.distributed.lr_scaling`)."""
        return 1 if getattr(self.config, "batch", "per_learner") == "global" else learners

    @abstractmethod
    def _attach(self) -> Any:
        """Set up with ``self.model`` / ``self.optimizer`` / ``self.context``; return the module to train."""

    @abstractmethod
    def after_step(self) -> None:
        """Called after each optimizer step (``self.steps`` counts them, from 1)."""

    def finish(self) -> None:  # noqa: B027  (an optional hook: dramatiq's middleware shape)
        """Training ended: a final synchronisation where the framework has one (a pull of the server's
        parameters); a no-op here."""

    def state_dict(self) -> dict[str, Any]:
        """What the framework adds to a learner's checkpoint (its step count; subclasses add theirs)."""
        return {"name": self.name, "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (after :meth:`attach`)."""
        self.steps = int(state["steps"])

    def _join_own_group(self) -> bool:
        """A worker group's member joins its group's own process group (gloo, :attr:`group_size` members:
        :meth:`LearnerContext.join_group`) unless a process group is initialized already (the caller's); returns
        whether it joined (that group is then this framework's, destroyed by :meth:`close`)."""
        import torch.distributed as dist

        if dist.is_initialized():
            return False
        self.context.join_group(self.group_size, "gloo")
        self._owns_process_group = True
        return True

    def close(self) -> None:
        """Remove the hook and release connections, and the process group this framework joined
        (:meth:`_join_own_group`); any other process group is the caller's to destroy."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._owns_process_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_process_group = False

    def _params(self) -> list[Any]:
        """The model's trainable parameters, in ``named_parameters`` order."""
        return [p for p in self.model.parameters() if p.requires_grad]


def register_framework(cls: type[Framework]) -> type[Framework]:
    """Class decorator: register a :class:`Framework` under its ``name``."""
    return FRAMEWORKS.register(cls)


def tensor_bytes(tensors: Any) -> int:
    """Bytes of tensor data in an iterable of tensors."""
    return sum(t.numel() * t.element_size() for t in tensors)

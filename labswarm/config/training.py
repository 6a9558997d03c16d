"""The ``training`` section of an experiment (torch-free)."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from labswarm.config.optim import (
    CosineSchedule,
    EarlyStopping,
    InitFrom,
    OptimizerConfig,
    Schedule,
    schedule_spec,
)


class TrainingConfig(BaseModel):
    """How a model is trained on an experiment's features.

    Attributes:
        epochs: passes over the training split.
        learning_rate: the optimizer's (peak) learning rate.
        weight_decay: the optimizer's weight decay (AdamW's is decoupled: Loshchilov & Hutter 2019); ``0`` for an
            optimizer without one (``rprop``).
        optimizer: a ``torch.optim`` optimizer by name with its keyword arguments
            (:class:`~labswarm.config.optim.OptimizerConfig`; default ``adamw``).
        schedule: the learning rate per epoch: ``constant``, ``step``, ``cosine`` (default: down to 0 over all
            epochs), ``one_cycle``, ``reduce_on_plateau``, by name or ``{name: ..., **its parameters}``
            (:mod:`labswarm.config.optim`).
        early_stopping: stop when a metric stops improving, keeping the best epoch's model
            (:class:`~labswarm.config.optim.EarlyStopping`); ``None``: train every epoch.
        init_from: fine-tune: the weights to start from (:class:`~labswarm.config.optim.InitFrom`); ``None``: a
            seeded random initialization.
        freeze: parameter name prefixes (``features.``) not trained (each must match a parameter).
        validation: share of each class's source recordings held out for validation, in [0, 1)
            (see :mod:`labswarm.pipeline.split`).
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        threads: torch intra-op threads on CPU; ``None`` keeps torch's default.
        keep_bytes: bytes of full-length training features a distributed learner keeps in memory; a split whose
            features take more is streamed from the store, one chunk read ahead of the step (0: always stream).
            ``None``: the learner's environment variable ``LABSWARM_LEARNER_KEEP_BYTES``, else 1 GiB, at most half
            of what a memory limit (``resources.memory_mb``) leaves once the learner has started
            (:mod:`labswarm.train.distributed.data`). The crops trained are the same either way.
        seed: the training seed, an int >= 0: what training draws (each epoch's sample order and its share per
            learner, the random crops, the initial weights, dropout) and nothing else: the features (each sample's
            transformation seed) and the validation split stay the experiment's ``seed``'s, so another training
            seed reuses every stored feature. ``None`` (default): the experiment's ``seed``, which trains exactly as
            before the field existed (:attr:`~labswarm.config.experiment.ExperimentConfig.training_seed`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(6, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-3, ge=0)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: Schedule = Field(default_factory=CosineSchedule)
    early_stopping: EarlyStopping | None = None
    init_from: InitFrom | None = None
    freeze: list[str] = Field(default_factory=list)
    validation: float = Field(0.2, ge=0.0, lt=1.0)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    threads: int | None = Field(None, ge=1)
    keep_bytes: int | None = Field(None, ge=0)  # issue 24
    seed: int | None = Field(None, ge=0, strict=True)  # issue 23: a bool or "3" is no seed

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Without ``keep_bytes`` and ``seed`` while unset, so that the fingerprints of experiments written before
        they existed do not change."""
        data = handler(self)
        for key in ("keep_bytes", "seed"):
            if getattr(self, key) is None:
                data.pop(key, None)
        return data

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, value: Any) -> Any:
        return schedule_spec(value)

    @model_validator(mode="after")
    def _together(self) -> TrainingConfig:
        if self.weight_decay and not self.optimizer.takes_weight_decay:
            raise ValueError(f"weight_decay: optimizer {self.optimizer.name!r} has none: set training.weight_decay: 0")
        for field, metric in (("schedule", getattr(self.schedule, "metric", None)),
                              ("early_stopping", self.early_stopping and self.early_stopping.metric)):
            if metric and metric.startswith("val_") and not self.validation:
                raise ValueError(f"{field}.metric: {metric!r} needs a validation split (training.validation > 0)")
        return self

    @property
    def watch(self) -> EarlyStopping:
        """What the ``plateau`` events watch: :attr:`early_stopping`'s metric, else the validation loss (the
        training loss without a validation split) with :class:`~labswarm.config.optim.EarlyStopping`'s
        defaults."""
        if self.early_stopping is not None:
            return self.early_stopping
        return EarlyStopping(metric="val_loss" if self.validation else "train_loss")

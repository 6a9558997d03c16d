"""The optimizer, learning-rate schedule and early stopping of a ``training`` section (torch-free).

Names are checked here, against :data:`OPTIMIZERS` (``torch.optim``'s optimizers with their keyword arguments, as
of torch 2.13; ``tests/train/test_optim.py`` checks the table against the installed torch) and the schedules'
config models, so a manifest with a misspelt optimizer or argument is refused at submission, naming the field,
by a manager without torch. The values are torch's to check: :func:`labswarm.train.optim.build_optimizer`
turns its refusal into a :class:`~labswarm.errors.ConfigError` naming ``training.optimizer``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The metrics an epoch's record holds that a schedule or early stopping can watch.
METRICS = ("val_loss", "val_accuracy", "val_macro_f1", "train_loss", "train_accuracy")
Metric = Literal["val_loss", "val_accuracy", "val_macro_f1", "train_loss", "train_accuracy"]

#: ``torch.optim`` optimizers by lower-case name: (class name, keyword arguments besides ``lr`` and
#: ``weight_decay``, whether it takes ``weight_decay``). Left out: ``LBFGS`` (its ``step`` needs a closure that
#: re-evaluates the loss), ``SparseAdam`` (sparse gradients only), ``Muon`` (2-D parameters only).
OPTIMIZERS: dict[str, tuple[str, frozenset[str], bool]] = {
    name.lower(): (name, frozenset(kwargs.split()), decay) for name, kwargs, decay in (
        ("Adadelta", "rho eps foreach capturable maximize differentiable", True),
        ("Adafactor", "beta2_decay eps d foreach maximize", True),
        ("Adagrad", "lr_decay initial_accumulator_value eps foreach maximize differentiable fused", True),
        ("Adam", "betas eps amsgrad foreach maximize capturable differentiable fused decoupled_weight_decay", True),
        ("AdamW", "betas eps amsgrad maximize foreach capturable differentiable fused", True),
        ("Adamax", "betas eps foreach maximize differentiable capturable", True),
        ("ASGD", "lambd alpha t0 foreach maximize differentiable capturable", True),
        ("NAdam", "betas eps momentum_decay decoupled_weight_decay foreach maximize capturable differentiable",
         True),
        ("RAdam", "betas eps decoupled_weight_decay foreach maximize capturable differentiable", True),
        ("RMSprop", "alpha eps momentum centered capturable foreach maximize differentiable", True),
        ("Rprop", "etas step_sizes capturable foreach maximize differentiable", False),
        ("SGD", "momentum dampening nesterov maximize foreach differentiable fused", True),
    )
}

#: A keyword argument's value: a number, a flag, a string, or a list of numbers (``betas: [0.9, 0.99]``).
KwargValue = bool | int | float | str | list[float] | None


class OptimizerConfig(BaseModel):
    """``optimizer: {name: sgd, momentum: 0.9, nesterov: true}``: a ``torch.optim`` optimizer by name (any case),
    with its keyword arguments; its learning rate and weight decay are ``training.learning_rate`` and
    ``training.weight_decay``.

    Attributes:
        name: a key of :data:`OPTIMIZERS`.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = "adamw"

    @model_validator(mode="before")
    @classmethod
    def _known(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = {"name": value}
        if not isinstance(value, dict):
            return value
        name = str(value.get("name", "adamw")).lower()
        if name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {value.get('name')!r}; known: {', '.join(sorted(OPTIMIZERS))}")
        allowed = OPTIMIZERS[name][1]
        for key in value:
            if key in ("lr", "weight_decay"):
                raise ValueError(f"{key}: set training.{'learning_rate' if key == 'lr' else key} instead")
            if key != "name" and key not in allowed:
                raise ValueError(f"{key}: not an argument of {OPTIMIZERS[name][0]}; its arguments: "
                                 f"{', '.join(sorted(allowed))}")
        return {**value, "name": name}

    @model_validator(mode="after")
    def _values(self) -> OptimizerConfig:
        for key, value in self.kwargs.items():
            if not isinstance(value, bool | int | float | str | list | type(None)):
                raise ValueError(f"{key}: a number, a flag, a string or a list of numbers, not {type(value).__name__}")
        return self

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments besides ``lr`` and ``weight_decay``."""
        return dict(self.model_extra or {})

    @property
    def takes_weight_decay(self) -> bool:
        """The optimizer has a ``weight_decay`` argument."""
        return OPTIMIZERS[self.name][2]


class _Schedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConstantSchedule(_Schedule):
    """The learning rate as given, every epoch."""

    name: Literal["constant"] = "constant"


class StepSchedule(_Schedule):
    """``lr × gamma^(epoch // step_size)`` (torch's ``StepLR``).

    Attributes:
        step_size: epochs between two decays.
        gamma: the decay factor.
    """

    name: Literal["step"] = "step"
    step_size: int = Field(1, ge=1)
    gamma: float = Field(0.1, gt=0.0, le=1.0)


class CosineSchedule(_Schedule):
    """From ``lr`` down to ``eta_min`` along half a cosine over the epochs (Loshchilov & Hutter, SGDR, 2017,
    without restarts).

    Attributes:
        eta_min: the learning rate the cosine ends at.
    """

    name: Literal["cosine"] = "cosine"
    eta_min: float = Field(0.0, ge=0.0)


class OneCycleSchedule(_Schedule):
    """Smith & Topin's one cycle ("Super-convergence", 2018), per epoch: from ``lr / div_factor`` up to ``lr``
    over the first ``pct_start`` of the epochs, then down to ``lr / (div_factor × final_div_factor)``.

    Attributes:
        pct_start: share of the epochs spent rising.
        div_factor: the starting learning rate is ``lr / div_factor``.
        final_div_factor: the last one is the starting one divided by this.
        anneal_strategy: ``cos`` or ``linear`` interpolation.
    """

    name: Literal["one_cycle"] = "one_cycle"
    pct_start: float = Field(0.3, gt=0.0, lt=1.0)
    div_factor: float = Field(25.0, gt=0.0)
    final_div_factor: float = Field(1e4, gt=0.0)
    anneal_strategy: Literal["cos", "linear"] = "cos"


class PlateauSchedule(_Schedule):
    """The learning rate times ``factor`` when ``metric`` has not improved for ``patience`` epochs (torch's
    ``ReduceLROnPlateau``, relative threshold).

    Attributes:
        metric: the epoch record's figure watched.
        mode: ``min`` (a loss) or ``max`` (an accuracy).
        factor: the decay factor.
        patience: epochs without improvement before a decay.
        threshold: a relative improvement smaller than this does not count.
        min_lr: the learning rate is not decayed below this.
    """

    name: Literal["reduce_on_plateau"] = "reduce_on_plateau"
    metric: Metric = "val_loss"
    mode: Literal["min", "max"] = "min"
    factor: float = Field(0.1, gt=0.0, lt=1.0)
    patience: int = Field(2, ge=0)
    threshold: float = Field(1e-4, ge=0.0)
    min_lr: float = Field(0.0, ge=0.0)


#: A schedule's names as a user may spell them.
SCHEDULE_ALIASES = {"one-cycle": "one_cycle", "onecycle": "one_cycle", "reduce-on-plateau": "reduce_on_plateau",
                    "plateau": "reduce_on_plateau"}

Schedule = Annotated[ConstantSchedule | StepSchedule | CosineSchedule | OneCycleSchedule | PlateauSchedule,
                     Field(discriminator="name")]


def schedule_spec(value: Any) -> Any:
    """``cosine`` or ``{name: one-cycle, ...}`` as the mapping the :data:`Schedule` union validates."""
    if isinstance(value, str):
        value = {"name": value}
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        value = {**value, "name": SCHEDULE_ALIASES.get(value["name"], value["name"])}
    return value


class EarlyStopping(BaseModel):
    """``early_stopping: {metric: val_loss, mode: min, patience: 3, min_delta: 0.0}``: the training ends, as
    completed, when ``metric`` has not improved by more than ``min_delta`` for ``patience`` epochs; the model kept
    is the best epoch's.

    Attributes:
        metric: the epoch record's figure watched.
        mode: ``min`` (a loss) or ``max`` (an accuracy, an F1).
        patience: epochs without improvement before the training stops.
        min_delta: an improvement of at most this (absolute) does not count.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Metric = "val_loss"
    mode: Literal["min", "max"] = "min"
    patience: int = Field(3, ge=1)
    min_delta: float = Field(0.0, ge=0.0)


class InitFrom(BaseModel):
    """``init_from: {model: PATH}`` or ``{job: ID}``: start from a trained model's weights (fine-tuning) instead of
    a random initialization; the output layer starts afresh when the classes differ (``labswarm.train.finetune``).

    Attributes:
        model: a labswarm model file (``labswarm train``'s, or a job's downloaded ``model.pt``).
        job: a completed training job whose model the submitter may read (their own; an admin: any), on the
            manager the job is submitted to (``labswarm.jobs.service.parent``); the learner downloads it.
        store: set by the manager for ``job``, never by the user: the parent job's results store.
        sha256: set by the manager for ``job``: the SHA-256 of the parent's model file (hex), checked by the
            learner after its download and recorded in the job's bundle (``versions.json``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, min_length=1)
    job: str | None = Field(None, min_length=1, max_length=64)
    store: dict[str, Any] | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _one(self) -> InitFrom:
        if self.model is None and self.job is None:
            raise ValueError("give model: PATH (a model file) or job: ID (a completed training job)")
        return self

"""The ``training`` section of an experiment (torch-free)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TrainingConfig(BaseModel):
    """How a model is trained on an experiment's features.

    Attributes:
        epochs: passes over the training split.
        learning_rate: peak learning rate of AdamW (Loshchilov & Hutter 2019), decayed to 0 by a cosine
            schedule over all epochs (``schedule: cosine``) or kept (``constant``).
        weight_decay: AdamW's decoupled weight decay.
        schedule: learning-rate schedule.
        validation: share of each class's source recordings held out for validation, in [0, 1)
            (see :mod:`labswarm.pipeline.split`).
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        threads: torch intra-op threads on CPU; ``None`` keeps torch's default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(6, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-3, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    validation: float = Field(0.2, ge=0.0, lt=1.0)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    threads: int | None = Field(None, ge=1)

"""Fine-tuning: a new model started from a trained one's weights (``training.init_from``), parts of it frozen
(``training.freeze``).

Every parameter and buffer of the new model whose name and shape the parent's model file has is copied; the
output layer (the module of the network's last weight) starts afresh when the parent's classes differ from the new
ones (other classes, or another order: its rows would mean other classes), and so does any tensor whose shape
differs. Frozen parameters (``requires_grad`` off) keep the values they started with; the batch-norm statistics
of a frozen part still follow the new data in training mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labswarm.config.training import TrainingConfig
from labswarm.errors import ConfigError
from labswarm.train import checkpoint


def init_from(model: Any, training: TrainingConfig, classes: Sequence[str]) -> dict[str, Any] | None:
    """Load ``training.init_from``'s weights into ``model`` (in place) and freeze ``training.freeze``.

    Returns:
        What was done, for the model file: ``path``, the parent's ``fingerprint`` and ``experiment``, ``copied``
        and ``fresh`` tensor names, ``frozen`` parameter names; ``None`` without ``init_from`` or ``freeze``.

    Raises:
        ConfigError: the file is not a model file, no tensor fits (``training.init_from.model``), or a prefix
            matches no parameter (``training.freeze``).
    """
    if training.init_from is None and not training.freeze:
        return None
    done: dict[str, Any] = {}
    source = training.init_from
    if source is not None:
        if source.model is None:  # {job: ID} the manager resolved and no learner downloaded: not in a job
            raise ConfigError([("training.init_from.job", f"job {source.job}: a job's model is fetched by the "
                                "learners of a job submitted to its manager; here, download it (labswarm jobs "
                                "download) and give init_from: {model: PATH}")])
        done = _load(model, Path(source.model), list(classes))
        if source.job is not None:
            done.update(job=source.job, sha256=source.sha256)
    frozen = [name for name, p in model.named_parameters() if any(name.startswith(f) for f in training.freeze)]
    for prefix in training.freeze:
        if not any(name.startswith(prefix) for name in frozen):
            known = sorted({name.split(".")[0] + "." for name, _ in model.named_parameters()})
            raise ConfigError([("training.freeze", f"{prefix!r} matches no parameter; the model's: {known}")])
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    return {**done, "frozen": frozen}


def _load(model: Any, path: Path, classes: list[str]) -> dict[str, Any]:
    from labswarm.train.checkpoint import CheckpointError

    try:
        parent = checkpoint.load(path)
    except CheckpointError as exc:
        raise ConfigError([("training.init_from.model", str(exc))]) from exc
    weights = parent.get("state_dict")
    if not isinstance(weights, dict):
        raise ConfigError([("training.init_from.model", f"{path} is not a labswarm model file")])
    own = model.state_dict()
    head = _head(own) if parent.get("classes") != classes else None
    copied = {k: v for k, v in weights.items()
              if k in own and tuple(v.shape) == tuple(own[k].shape) and (head is None or not k.startswith(head))}
    if not copied:
        raise ConfigError([("training.init_from.model", f"no tensor of {path} fits this model")])
    model.load_state_dict(copied, strict=False)
    return {"path": str(path), "fingerprint": parent.get("fingerprint"), "experiment": parent.get("experiment"),
            "copied": sorted(copied), "fresh": sorted(set(own) - set(copied))}


def _head(state: dict[str, Any]) -> str:
    """The prefix (``head.2.``) of the module of the state's last ``weight``: the output layer."""
    last = [k for k in state if k.endswith("weight")][-1]
    return last[: -len("weight")]

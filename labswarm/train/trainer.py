"""The trainer: an experiment's model trained on its features, epoch by epoch, with a checkpoint after each.

Extensions plug in through hooks, never through more arguments of the trainer: :class:`TrainerHooks` observe the
training (a training job's learner reporting to the manager, a halt request checked between steps); one
:class:`~labswarm.train.loop.LoopHooks` says where the steps come from and how the work is shared (the single
process by default; the distributed frameworks, :mod:`labswarm.train.distributed.training`, hand theirs in).

Files of a run (``<home>/train/<experiment>-<fingerprint>/``): ``metrics.jsonl`` (one JSON line per epoch),
``checkpoint.pt`` (model, optimizer, schedule and pipeline state after the last finished epoch). The trained
model is written to ``<home>/models/<experiment>-<fingerprint>.pt``: the experiment's name with the hash of its
whole configuration, so a changed configuration never overwrites another's model.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import ConfigError
from labswarm.pipeline.base import Block
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train import checkpoint
from labswarm.train.checkpoint import CheckpointError
from labswarm.train.finetune import init_from
from labswarm.train.loop import LoopHooks
from labswarm.train.metrics import accuracy, confusion, f1_per_class, macro_f1
from labswarm.train.models.base import Model, ModelConfig, feature_bins, import_torch
from labswarm.train.optim import EpochSchedule, build_optimizer
from labswarm.train.watch import Watch

log = logging.getLogger(__name__)

#: Version of the model file layout written by :meth:`Trainer.fit`.
MODEL_FORMAT = 1


class TrainerHooks:
    """Extension points of :class:`Trainer`; every hook is a no-op here: subclass and override the ones you need
    (dramatiq's middleware shape). Hooks run in the training process, between steps: keep them cheap.

    A hook that raises stops the training with that exception (nothing is caught).
    """

    def before_fit(self, trainer: Trainer, start_epoch: int) -> None:
        """Training starts (or resumes) at ``start_epoch`` (from 0: the epochs already done)."""

    def before_epoch(self, trainer: Trainer, epoch: int, optimizer: Any, schedule: Any) -> None:
        """Epoch ``epoch`` (from 0) starts: live changes go in here (:mod:`labswarm.train.live`)."""

    def after_step(self, trainer: Trainer, epoch: int, step: int, loss: float) -> None:
        """One optimizer step ended: ``epoch`` from 0, ``step`` counts the steps of that epoch from 1 (a resumed
        epoch goes on counting), ``loss`` the batch's mean cross-entropy."""

    def should_stop(self, trainer: Trainer) -> bool:
        """Asked after every step: ``True`` stops the training there (a halt). The trainer then writes a mid-epoch
        checkpoint that :meth:`Trainer.fit` with ``resume=True`` continues from, and returns a stopped result."""
        return False

    def after_checkpoint(self, trainer: Trainer, path: Path, epochs_done: int, step: int | None) -> None:
        """A checkpoint was written at ``path``: after epoch ``epochs_done`` (``step`` ``None``), or in the middle
        of the next epoch after its ``step``-th step (a stop)."""

    def after_epoch(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """An epoch ended; ``record`` is its metrics record, already in the log and covered by the checkpoint."""


@dataclass
class TrainResult:
    """What a training run produced.

    Attributes:
        metrics: one record per finished epoch (the metrics log).
        model_path: the trained model file (not written when ``stopped``).
        run_dir: the folder of the metrics log and the checkpoint.
        resumed_from: the epoch the run resumed after (0: from scratch).
        seconds: wall time of this call.
        stopped: a hook stopped the training (:meth:`TrainerHooks.should_stop`); the checkpoint holds where.
    """

    metrics: list[dict[str, Any]]
    model_path: Path
    run_dir: Path
    resumed_from: int
    seconds: float
    stopped: bool = False

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's record."""
        return self.metrics[-1]


class Trainer:
    """Trains ``experiment.model`` as ``experiment.training`` says, reading batches through the experiment's
    pipeline (train split, shuffled) and validating on the held-out sources after every epoch.

    Args:
        experiment: an experiment with ``model`` and ``training`` sections.
        home: labswarm's state folder (``Settings.home``).
        on_epoch: called with each epoch's metrics record (a shorthand for a hook's ``after_epoch``).
        hooks: :class:`TrainerHooks`, called in this order.
        distributed: the loop hooks: one learner's of several
            (:class:`~labswarm.train.distributed.training.DistributedTraining`: rank ``r``'s metrics and checkpoint
            in ``<run dir>/rank-<r>/``), or a single process's (``None``, the default: :class:`LoopHooks`; a job's
            learner: :class:`~labswarm.train.distributed.producers.UnforkedLoop`).

    Raises:
        ConfigError: the experiment has no ``training`` or ``model`` section.
    """

    def __init__(self, experiment: ExperimentConfig, home: Path,
                 on_epoch: Callable[[dict[str, Any]], None] | None = None,
                 hooks: Sequence[TrainerHooks] = (), distributed: LoopHooks | None = None) -> None:
        if experiment.training is None or experiment.model is None:
            raise ConfigError([("training", "the experiment has no `training` and `model` sections to train")])
        if not isinstance(experiment.model, ModelConfig):  # validated through the models' registry: always one
            raise ConfigError([("model", f"not a model's config: {type(experiment.model).__name__}")])
        if distributed is not None and distributed.several and (experiment.training.early_stopping
                                                                 or experiment.training.freeze):
            raise ConfigError([("training", "early_stopping and freeze: not yet supported with several learners")])
        self.experiment = experiment
        self.training = experiment.training
        self.model_config: ModelConfig = experiment.model
        self.spec = Model.from_spec(self.model_config)
        self.input = self.model_config.input
        tag = f"{experiment.name}-{experiment.fingerprint()}"
        self.distributed = distributed
        self.loop = distributed if distributed is not None else LoopHooks()
        self.run_dir = self.loop.run_folder(Path(home) / "train" / tag)
        self.model_path = Path(home) / "models" / f"{tag}.pt"
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.checkpoint_path = self.run_dir / "checkpoint.pt"
        self.on_epoch = on_epoch
        self.hooks = list(hooks)

    def _pipelines(self, validation_shard: tuple[int, int] = (0, 1)) -> tuple[Pipeline, Pipeline]:
        """Train and validation pipelines, the latter reading shard ``(rank, world)`` of the split (a shared
        validation, :mod:`labswarm.train.distributed.training`); a features block that reads every output reads only the
        model's."""
        specs = []
        for spec in self.experiment.pipeline:
            block = Block.from_spec(spec)
            if block.name == "features" and block.config.outputs is None:
                block = Block.from_spec({**block.spec(), "outputs": [self.input]})
            specs.append(self.loop.pipeline_block(block))
        rank, world = validation_shard
        train = Pipeline(self.experiment, split="train", blocks=specs)
        validation = Pipeline(self.experiment, split="validation", train=False, blocks=specs, rank=rank, world=world)
        return train, validation

    def _device(self, torch: Any) -> Any:
        wanted = self.training.device
        if wanted == "auto":
            wanted = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.device(wanted)

    def fit(self, resume: bool = False) -> TrainResult:
        """Train for ``training.epochs`` epochs, or, with ``resume``, the epochs left after the last checkpoint.

        Returns:
            The :class:`TrainResult`; the metrics records hold ``train_loss``, ``train_accuracy``, ``val_loss``,
            ``val_accuracy``, ``val_f1`` (per class), ``val_macro_f1``, ``samples_per_s`` (training samples per
            second of wall time), ``data_wait_s`` (seconds the trainer waited for batches), ``data_wait_share``,
            ``lr``, ``best_epoch``, and ``plateau`` and ``early_stop`` where they happen (:mod:`labswarm.train.watch`).

        Raises:
            CheckpointError: ``resume`` found a checkpoint of another configuration, or an unreadable one.
            PipelineError: a producer failed (e.g. the store is unreadable), or an epoch had no sample whose
                features could be read.
            ImportError: torch is not installed.
        """
        torch = import_torch()
        threads = torch.get_num_threads()
        device = self._device(torch)
        cuda = [device.index or 0] if device.type == "cuda" else []
        try:  # the caller's random state and thread count are theirs: restored afterwards
            with torch.random.fork_rng(devices=cuda):
                if self.training.threads:
                    torch.set_num_threads(self.training.threads)
                return self._fit(torch, device, resume)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, torch: Any, device: Any, resume: bool) -> TrainResult:
        started = time.perf_counter()
        loop = self.loop
        train, validation = self._pipelines(loop.validation_shard)
        classes = train.classes
        n_bins = feature_bins(self.experiment, self.input)
        torch.manual_seed(train.context.seed("init"))  # the same initial weights for the same configuration
        model = self.spec.build(n_bins, len(classes))
        self.init = init_from(model, self.training, classes)  # fine-tuning (the checkpoint's weights win on resume)
        model = model.to(device)
        optimizer = build_optimizer(torch, [p for p in model.parameters() if p.requires_grad], self.training)
        epochs = self.training.epochs
        schedule = EpochSchedule(torch, optimizer, self.training)
        self.watch = Watch(self.training, self.run_dir)
        start, partial = self._restore(resume, model, optimizer, schedule, train)
        module = loop.attach(torch, model, optimizer, train, self.input, self.run_dir)
        if self._restored is not None and "distributed" in self._restored:
            loop.load_state_dict(self._restored["distributed"])
        records = checkpoint.read_metrics(self.metrics_path)
        for hook in self.hooks:
            hook.before_fit(self, start)
        for epoch in range(start, epochs):
            if self.watch.stopped:  # early stopping ended the training (a resumed run too)
                break
            for hook in self.hooks:
                hook.before_epoch(self, epoch, optimizer, schedule)
            torch.manual_seed(train.context.with_(epoch=epoch).seed("torch"))
            if partial is not None:  # a mid-epoch checkpoint: the random state where the stop left it
                torch.set_rng_state(partial.pop("rng"))
            record = self._train_epoch(torch, module, optimizer, epoch, device, partial)
            partial = None
            if "stopped" in record:
                self._save_checkpoint(model, optimizer, schedule, train, epoch, {**record["stopped"],
                                      "rng": torch.get_rng_state()})
                return TrainResult(records, self.model_path, self.run_dir, start, time.perf_counter() - started,
                                   stopped=True)
            if loop.validates:  # its shard of the split, the sums reduced; rank 0 reports them
                loop.validation_start(torch, model)
                metrics = self._validate(torch, model, validation, device, reduce=loop.reduce_validation)
                if loop.rank == 0:
                    record.update(metrics)
            record["lr"] = optimizer.param_groups[0]["lr"]
            schedule.step(record)
            self.watch.update(record, model)
            record["time"] = datetime.now(UTC).isoformat(timespec="seconds")
            checkpoint.append_metrics(self.metrics_path, record)  # the log first: a crash before the checkpoint
            self._save_checkpoint(model, optimizer, schedule, train, epoch + 1)  # replays this epoch, truncating
            records.append(record)                                                # its line
            if self.on_epoch is not None:
                self.on_epoch(record)
            for hook in self.hooks:
                hook.after_epoch(self, record)
        loop.finish()
        if loop.rank != 0:
            return TrainResult(records, self.model_path, self.run_dir, start, time.perf_counter() - started)
        checkpoint.save({
            "format": MODEL_FORMAT, "experiment": self.experiment.name,
            "fingerprint": self.experiment.fingerprint(), "model": self.model_config.model_dump(mode="json"),
            "classes": list(classes), "input": self.input, "n_bins": n_bins,
            "state_dict": self.watch.best_weights(model), "metrics": self.watch.best_record(records),
            "config": self.experiment.model_dump(mode="json"), "init_from": self.init,
        }, self.model_path)
        return TrainResult(records, self.model_path, self.run_dir, start, time.perf_counter() - started)

    def _save_checkpoint(self, model: Any, optimizer: Any, schedule: Any, train: Pipeline, epochs_done: int,
                         partial: dict[str, Any] | None = None) -> None:
        """Checkpoint after ``epochs_done`` epochs, or, with ``partial`` (the stopped epoch's running sums, step
        count and random state), in the middle of the next one; then the hooks' ``after_checkpoint``."""
        pipeline = (train.state_dict() if partial is not None  # where the stopped epoch stands
                    else {"epoch": epochs_done, "prefetch": None})  # Pipeline.state_dict() of the next epoch
        mode = self.loop.state_dict()
        checkpoint.save({
            "epoch": epochs_done, "fingerprint": self.experiment.fingerprint(), "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), "pipeline": pipeline,
            "partial": partial, "watch": self.watch.state_dict(), **({} if mode is None else {"distributed": mode}),
        }, self.checkpoint_path)
        for hook in self.hooks:
            hook.after_checkpoint(self, self.checkpoint_path, epochs_done,
                                  None if partial is None else int(partial["steps"]))

    def _restore(self, resume: bool, model: Any, optimizer: Any, schedule: Any,
                 train: Pipeline) -> tuple[int, dict[str, Any] | None]:
        """Load the checkpoint when resuming (the one the loop hooks' ``agree`` settles on), else start a fresh run
        dir. Returns the epochs it covers and, mid-epoch, the stopped epoch's running sums (else ``None``)."""
        found = resume and self.checkpoint_path.is_file()
        if resume and not found:
            log.info("no checkpoint in %s: training from the start", self.run_dir)
        state = self._restored = self.loop.agree(checkpoint.load(self.checkpoint_path) if found else None)
        if state is None:  # a fresh start (a worker group's members: when the group's newest is one too)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            return 0, None
        if state.get("fingerprint") != self.experiment.fingerprint():
            raise CheckpointError(f"{self.checkpoint_path} belongs to another configuration of the experiment")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        self.watch.load_state_dict(state.get("watch"))
        train.load_state_dict(state["pipeline"])
        done = int(state["epoch"])
        checkpoint.truncate_metrics(self.metrics_path, done)
        partial = state.get("partial")
        if partial is not None:
            log.info("resuming %s in epoch %d after step %d", self.experiment.name, done + 1, partial["steps"])
        else:
            log.info("resuming %s after epoch %d", self.experiment.name, done)
        return done, partial

    def _train_epoch(self, torch: Any, module: Any, optimizer: Any, epoch: int, device: Any,
                     partial: dict[str, Any] | None = None) -> dict[str, Any]:
        """One epoch of the loop hooks' steps (continuing ``partial``'s running sums when resuming it); its
        metrics record, or ``{"stopped": sums}`` when a hook stopped it."""
        module.train()
        stop = self.loop.stops_between_epochs and self._should_stop()
        with self.loop.epoch(torch, epoch, device, partial) as steps:
            sums = steps.sums
            while (batch := steps.before_step(stop)) is not None:
                x, y = batch
                optimizer.zero_grad(set_to_none=True)
                logits = module(x)
                loss = torch.nn.functional.cross_entropy(logits, y)
                (loss * 0.0 if steps.filler else loss).backward()  # a filler joins the collectives, trains nothing
                optimizer.step()
                sums["steps"] += 1
                if steps.after_step():
                    value = float(loss.detach())
                    sums["loss_sum"] += value * len(y)
                    sums["correct"] += int((logits.argmax(1) == y).sum())
                    sums["seen"] += len(y)
                    for hook in self.hooks:
                        hook.after_step(self, epoch, sums["steps"], value)
                stop = self._should_stop()
        sums["seconds"] += time.perf_counter() - steps.started
        if steps.halted:
            return {"stopped": steps.halt()}
        seen, seconds, waited = sums["seen"], sums["seconds"], sums.get("waited", 0.0)
        record = {
            "epoch": epoch + 1, "epochs": self.training.epochs, "samples": seen,
            "train_loss": sums["loss_sum"] / max(seen, 1), "train_accuracy": sums["correct"] / max(seen, 1),
            "samples_per_s": seen / seconds if seconds else 0.0, "data_wait_s": waited,
            "data_wait_share": waited / seconds if seconds else 0.0, "epoch_s": seconds,
        }
        steps.after_epoch(record)
        return record

    def _should_stop(self) -> bool:
        """A hook asks to stop (:meth:`TrainerHooks.should_stop`)."""
        return any(hook.should_stop(self) for hook in self.hooks)

    def validate(self, model: Any) -> dict[str, Any]:
        """The validation figures of ``model`` (a module of this experiment's model) over the whole validation split,
        in this process, on the trainer's device: what each epoch's record holds (``val_samples``, ``val_loss``
        (mean cross-entropy, nats), ``val_accuracy``, ``val_f1`` per class, ``val_macro_f1``, ``val_confusion``
        ``(n_classes, n_classes)`` counts, rows the true class); ``{"val_samples": 0}`` for an empty split.

        Raises:
            PipelineError: the split's features cannot be read.
        """
        import torch

        device = self._device(torch)
        return self._validate(torch, model.to(device), self._pipelines()[1], device)

    def _validate(self, torch: Any, model: Any, validation: Pipeline, device: Any,
                  reduce: Callable[[Any, np.ndarray, float], tuple[np.ndarray, float]] | None = None,
                  ) -> dict[str, Any]:
        """The validation figures of ``model`` over ``validation``'s samples; ``reduce(torch, matrix, loss_sum)``
        (a shared validation's all-reduce) turns this shard's confusion matrix and loss sum into the whole
        split's before the figures are taken from them."""
        model.eval()
        labels, predictions, loss_sum = [], [], 0.0
        with torch.no_grad(), validation.epoch(0) as batches:
            for batch in batches:
                if not len(batch):
                    continue
                x = torch.from_numpy(batch.features[self.input]).to(device)
                y = torch.from_numpy(batch.labels).to(device)
                logits = model(x)
                loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
                labels.append(batch.labels)
                predictions.append(logits.argmax(1).cpu().numpy())
        n_classes = len(validation.classes)
        matrix = (confusion(np.concatenate(labels), np.concatenate(predictions), n_classes) if labels
                  else np.zeros((n_classes, n_classes), dtype=np.int64))
        if reduce is not None:
            matrix, loss_sum = reduce(torch, matrix, loss_sum)
        n = int(matrix.sum())
        if not n:
            return {"val_samples": 0}
        f1 = f1_per_class(matrix, validation.classes)
        return {"val_samples": n, "val_loss": loss_sum / n, "val_accuracy": accuracy(matrix), "val_f1": f1,
                "val_macro_f1": macro_f1(f1), "val_confusion": matrix.tolist()}


def load_model(path: Path, map_location: Any = "cpu") -> tuple[Any, dict[str, Any]]:
    """A trained model file back as ``(torch module in eval mode, metadata)``; the metadata holds
    ``classes``, ``input``, ``experiment``, ``fingerprint`` and the last ``metrics``.

    Raises:
        CheckpointError: unreadable, or not a labswarm model file of a known format.
    """
    state = checkpoint.load(Path(path), map_location)
    if state.get("format") != MODEL_FORMAT:
        raise CheckpointError(f"{path} is not a labswarm model file (format {state.get('format')!r})")
    model = Model.from_spec(state["model"]).build(state["n_bins"], len(state["classes"]))
    model.load_state_dict(state["state_dict"])
    model.eval()
    return model, {k: v for k, v in state.items() if k != "state_dict"}

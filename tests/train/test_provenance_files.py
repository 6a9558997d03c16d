"""The files a configuration names by path are part of a training's reuse key (labswarm.train.provenance;
reviewer's defect: editing a model's Python file left the key unchanged, so ``labswarm train`` and
``POST /v1/jobs?reuse=true`` answered with a model of the old code). No training: the keys only."""

from __future__ import annotations

from pathlib import Path

from three_classes import training_experiment, write_three_classes

from labswarm.config.experiment import ExperimentConfig
from labswarm.train.provenance import of_experiment, of_job

_NET = "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    pass\n"


def _config(root: Path, tmp_path: Path, **training: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate(training_experiment(
        root, tmp_path / "store", model={"code": f"{tmp_path / 'my_net.py'}:Net", "input": "mel"},
        training={"epochs": 1, "validation": 0.34, **training}))


def test_editing_the_model_s_code_file_changes_the_key(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=2)
    net = tmp_path / "my_net.py"
    net.write_text(_NET)
    config = _config(root, tmp_path)
    manifest = {"name": "a", "experiment": config.model_dump(mode="json"), "learners": 1,
                "training": config.training.model_dump(mode="json") if config.training else {}}
    before, job_before = of_experiment(config), of_job(manifest, config)
    assert of_experiment(_config(root, tmp_path)) == before  # nothing edited: the same key
    net.write_text(_NET.replace("pass", "width = 64  # widened"))
    after, job_after = of_experiment(_config(root, tmp_path)), of_job(manifest, config)
    assert after.files != before.files and after.key != before.key
    assert (after.configuration, after.data, after.code) == (before.configuration, before.data, before.code)
    assert job_after.key != job_before.key
    net.unlink()
    assert of_experiment(_config(root, tmp_path)).key not in (before.key, after.key)


def test_the_model_file_a_training_starts_from_is_part_of_the_key(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=2)
    (tmp_path / "my_net.py").write_text(_NET)
    parent = tmp_path / "parent.pt"
    parent.write_bytes(b"weights, version 1")
    config = _config(root, tmp_path, init_from={"model": str(parent)})
    base = of_experiment(config)
    manifest = {"name": "a", "experiment": config.model_dump(mode="json"), "learners": 1,
                "training": config.training.model_dump(mode="json") if config.training else {}}
    job_base = of_job(manifest, config)
    parent.write_bytes(b"weights, version 2")  # the same path, another model
    assert of_experiment(config).key != base.key and of_job(manifest, config).key != job_base.key
    # a job whose manifest's training has no init_from takes the experiment's
    assert of_job({**manifest, "training": {}}, config).files == of_job(manifest, config).files

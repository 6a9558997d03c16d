"""What a training is made of (labswarm.train.provenance): equal for the same configuration, data and code,
different when any of them changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from three_classes import training_experiment, write_three_classes

from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import DatasetError
from labswarm.train.provenance import code_version, data_fingerprint, of_experiment, of_job


def _config(root: Path, tmp_path: Path, **training: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate(training_experiment(
        root, tmp_path / "store", training={"epochs": 1, "validation": 0.34, **training}))


def test_the_same_training_has_the_same_key_and_each_change_another(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=2)
    base = of_experiment(_config(root, tmp_path))
    assert of_experiment(_config(root, tmp_path)) == base and len(base.key) == 32
    changed = of_experiment(_config(root, tmp_path, learning_rate=0.5))
    assert changed.configuration != base.configuration and changed.data == base.data
    assert changed.key != base.key

    wav = root / "high" / "high_1.wav"
    st = wav.stat()
    os.utime(wav, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched: same bytes, another time
    touched = of_experiment(_config(root, tmp_path))
    assert touched.data != base.data and touched.configuration == base.configuration

    labels = root / "labels.csv"
    labels.write_text("\n".join(labels.read_text().splitlines()[:-1]) + "\n")  # a clip less
    assert data_fingerprint(_config(root, tmp_path)) not in (base.data, touched.data)


def test_a_jobs_name_and_priority_are_not_its_configuration(tmp_path: Path) -> None:
    config = _config(write_three_classes(tmp_path / "data", per_class=2), tmp_path)
    manifest = {"name": "a", "priority": 0, "experiment": config.model_dump(mode="json"), "learners": 1,
                "results_store": {"name": "local", "path": str(tmp_path / "r1")}}
    renamed = {**manifest, "name": "b", "priority": 5, "results_store": {"name": "local", "path": "elsewhere"}}
    assert of_job(manifest, config).key == of_job(renamed, config).key
    assert of_job({**manifest, "learners": 2}, config).key != of_job(manifest, config).key


def test_the_code_version_names_labswarm_its_sources_and_torch() -> None:
    version = code_version()
    assert version.startswith("labswarm ") and "(sources " in version and "torch " in version


def test_an_unreadable_labels_file_is_a_dataset_error(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=2)
    config = _config(root, tmp_path)
    (root / "labels.csv").unlink()
    with pytest.raises(DatasetError, match="labels"):
        data_fingerprint(config)

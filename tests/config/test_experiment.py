from __future__ import annotations

from pathlib import Path

import pytest
from helpers import experiment_dict

from labswarm.config.experiment import ExperimentConfig, load_experiment, parse_experiment
from labswarm.errors import ConfigError

VALID = {
    "name": "exp-1",
    "dataset": {"root": "data", "sample_rate": 16000, "segment": {"start": 0.5, "duration": 4.0}},
    "transformations": [{"name": "identity"}, {"name": "pitch_shift", "semitones": 2}],
    "features": [{"name": "mel", "n_mels": 64}, {"name": "mfcc"}],
    "store": {"root": "store"},
}


def _errors(data) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_experiment(data)
    return dict(info.value.errors)


def test_valid_config_keeps_plugin_params() -> None:
    config = parse_experiment(VALID)
    assert isinstance(config, ExperimentConfig)
    assert config.transformations[1].semitones == 2.0
    assert config.features[0].n_mels == 64
    dumped = config.model_dump(mode="json")
    assert dumped["transformations"][1]["semitones"] == 2.0
    assert parse_experiment(dumped) == config  # round trip through JSON
    assert len(config.fingerprint()) == 16


@pytest.mark.parametrize(
    "patch,path,reason",
    [
        ({"name": "Has Spaces"}, "name", "pattern"),
        ({"extra_key": 1}, "extra_key", "unknown key 'extra_key'"),
        ({"dataset": {"root": "d", "sample_rate": 10}}, "dataset.sample_rate", "greater than"),
        ({"dataset": {"root": "d", "segment": {"duration": -1}}}, "dataset.segment.duration", "greater than"),
        ({"dataset": {"root": "d", "bogus": 1}}, "dataset.bogus", "unknown key 'bogus' (known: root,"),
        ({"dataset": {"sample_rate": 16000}}, "dataset.root", "Field required"),
        ({"transformations": [{"name": "warp"}]}, "transformations.0.name", "unknown transformation 'warp'"),
        ({"transformations": [{"name": "identity"}, {"name": "pitch_shift", "semitones": "up"}]},
         "transformations.1.semitones", "valid number"),
        ({"transformations": [{"name": "pitch_shift", "semitones": 2, "octave": 1}]},
         "transformations.0.octave", "unknown key 'octave' (known: name, semitones"),
        ({"transformations": [{"name": "identity"}, {"name": "identity"}]}, "transformations", "repeats"),
        ({"transformations": "identity"}, "transformations", "must be a list"),
        ({"transformations": [3]}, "transformations.0", "must be a mapping"),
        ({"features": []}, "features", "at least 1"),
        ({"features": [{"name": "mel", "n_mels": 0}]}, "features.0.n_mels", "greater than"),
        ({"features": [{"name": "mel"}, {"name": "mel", "n_mels": 64}]}, "features", "same output name"),
        ({"store": {}}, "store.root", "Field required"),
    ],
)
def test_invalid_field_is_named(patch: dict, path: str, reason: str) -> None:
    errors = _errors({**VALID, **patch})
    assert path in errors, errors
    assert reason in errors[path]


def test_unknown_name_lists_known_names() -> None:
    errors = _errors({**VALID, "features": [{"name": "chroma"}]})
    assert "known:" in errors["features.0.name"] and "mel" in errors["features.0.name"]


def test_yaml_syntax_error_gives_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("name: x\ndataset: [1,\n")
    with pytest.raises(ConfigError, match="line 3"):
        load_experiment(path)


def test_non_mapping_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        parse_experiment("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_experiment(tmp_path / "nope.yml")


def test_relative_paths_resolve_against_the_yaml_folder(tmp_path: Path) -> None:
    import yaml

    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "e.yml").write_text(yaml.safe_dump(VALID))
    config = load_experiment(folder / "e.yml")
    assert config.dataset.root == (folder / "data").resolve()
    assert config.store.root == (folder / "store").resolve()
    assert config.dataset.labels_path == (folder / "data" / "labels.csv").resolve()


def test_shipped_example_is_valid() -> None:
    config = load_experiment(Path(__file__).parents[2] / "examples" / "music_speech_noise.yml")
    assert len(config.transformations) == 9
    assert [f.name for f in config.features] == ["mel", "mfcc"]


@pytest.mark.parametrize(("changes", "path", "reason"), [
    ({"pipeline": [{"name": "source"}, {"name": "batch"}, {"name": "features"}]}, "pipeline",
     "must come before the `batch` block"),
    ({"pipeline": [{"name": "source"}, {"name": "features", "outputs": ["nope"]}, {"name": "batch"}]}, "pipeline",
     "reads ['nope'], which the experiment does not compute"),
    ({"pipeline": [{"name": "source"}, {"name": "features", "outputs": ["mfcc"]}, {"name": "batch"}],
      "model": {"name": "cnn", "input": "mel"}}, "model", "not among the outputs the pipeline's features block reads"),
    ({"pipeline": [{"name": "source"}, {"name": "features"}, {"name": "batch", "eval_frames": 0}]},
     "pipeline.2.eval_frames.constrained-int", "greater than or equal to 1"),
])
def test_training_sections_are_checked_together(tmp_path: Path, changes: dict, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_experiment(experiment_dict(tmp_path, tmp_path / "store", **changes))
    assert any(p == path and reason in r for p, r in caught.value.errors), caught.value.errors

"""``labswarm predict`` (labswarm/predict.py, labswarm/cli/predict.py) with a model trained here on real audio
(the training tests' three-class set) and, for a job id, a real manager running a real learner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from train.three_classes import training_experiment, write_three_classes
from typer.testing import CliRunner

from labswarm.cli.main import app
from labswarm.config.experiment import ExperimentConfig, parse_experiment
from labswarm.pipeline.pipeline import Pipeline
from labswarm.predict import Prediction, predict
from labswarm.train.checkpoint import CheckpointError
from labswarm.train.trainer import Trainer, load_model


@dataclass
class Trained:
    root: Path
    config: ExperimentConfig
    model: Path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The three-class model (4 epochs, in this process, no prefetch processes: a few seconds)."""
    tmp = tmp_path_factory.mktemp("predict")
    root = write_three_classes(tmp / "data")
    config = parse_experiment(training_experiment(root, tmp / "store", pipeline=[
        {"name": "source"}, {"name": "shuffle"}, {"name": "features"},
        {"name": "batch", "size": 8, "frames": 24, "eval_frames": 32}]))  # 44 frames a clip: evaluation crops
    return Trained(root, config, Trainer(config, tmp / "home").fit().model_path)


def _evaluation(trained: Trained) -> dict[Path, np.ndarray]:
    """The trainer's way of evaluating (the experiment's pipeline in evaluation mode, features from the store):
    softmax of the model per clip, for the clean (identity) sample of every clip of the dataset."""
    model, _ = load_model(trained.model)
    out = {}
    with torch.no_grad():
        for batch in Pipeline(trained.config, split="all", train=False).epoch(0):
            probabilities = torch.softmax(model(torch.from_numpy(batch.features["mel"])).double(), 1).numpy()
            for sample_id, p in zip(batch.ids, probabilities, strict=True):
                clip, _, index = sample_id.rpartition("#")
                if index == "0":
                    out[trained.root / clip] = p
    return out


def _cli(*args: str, env: dict[str, str | None] | None = None):
    return CliRunner().invoke(app, ["predict", *args], env={"COLUMNS": "200", **(env or {})})


def test_predicting_the_dataset_clips_gives_the_trainers_own_evaluation(trained: Trained) -> None:
    expected = _evaluation(trained)
    assert len(expected) == 24
    predictions = predict(trained.model, list(expected))
    classes = ["high", "low", "noise"]
    for prediction, (path, p) in zip(predictions, expected.items(), strict=True):
        assert prediction.path == str(path) and prediction.error is None and prediction.windows == 1
        assert list(prediction.probabilities) == classes
        got = np.array(list(prediction.probabilities.values()))
        np.testing.assert_allclose(got, p, atol=1e-6)
        assert got.sum() == pytest.approx(1.0) and prediction.label == classes[int(np.argmax(p))]
    # the model did learn: the labels are mostly right (so the agreement above is not one of constant outputs)
    truth = [path.parent.name for path in expected]
    assert np.mean([p.label == t for p, t in zip(predictions, truth, strict=True)]) >= 0.9


def test_a_long_file_averages_its_segments_and_a_short_one_fails_its_row(trained: Trained, tmp_path: Path) -> None:
    low, sr = sf.read(trained.root / "low" / "low_0.wav", dtype="float32")
    noise, _ = sf.read(trained.root / "noise" / "noise_0.wav", dtype="float32")
    tail = noise[: sr // 2]  # half a segment: left out
    sf.write(tmp_path / "long.wav", np.concatenate([low, noise, tail]), sr)
    sf.write(tmp_path / "short.wav", low[: sr // 2], sr)
    long, short, *parts = predict(trained.model, [tmp_path / "long.wav", tmp_path / "short.wav",
                                                  trained.root / "low" / "low_0.wav",
                                                  trained.root / "noise" / "noise_0.wav"])
    assert long.windows == 2
    mean = np.mean([list(p.probabilities.values()) for p in parts], axis=0)
    np.testing.assert_allclose(list(long.probabilities.values()), mean, atol=1e-6)
    assert short.label is None and "ends past the end of the file" in short.error and "short.wav" in short.error


def test_a_file_that_cannot_be_decoded_fails_its_row_and_the_others_are_classified(trained: Trained,
                                                                                     tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4)
    empty = tmp_path / "empty.flac"
    empty.touch()
    good = [trained.root / "high" / "high_1.wav", trained.root / "noise" / "noise_2.wav"]
    answer = _cli(str(trained.model), str(good[0]), str(corrupt), str(empty), str(good[1]), "--json")
    assert answer.exit_code == 1, answer.output
    rows = json.loads(answer.output)
    assert [r["path"] for r in rows] == [str(good[0]), str(corrupt), str(empty), str(good[1])]
    assert [r["label"] for r in rows] == ["high", None, None, "noise"]
    assert rows[1]["error"].startswith("AudioError: ") and "corrupt.wav" in rows[1]["error"]
    assert "empty file" in rows[2]["error"] and rows[1]["probabilities"] == {}
    assert sum(rows[0]["probabilities"].values()) == pytest.approx(1.0)
    table = _cli(str(trained.model), str(good[0]), str(corrupt), "--top", "1")
    assert table.exit_code == 1
    lines = table.output.splitlines()
    assert any("high_1.wav" in line and " high " in line and "noise" not in line for line in lines), table.output
    assert any("corrupt.wav" in line and "failed" in line and "AudioError" in line for line in lines), table.output
    assert _cli(str(trained.model), str(good[0])).exit_code == 0


def test_a_file_that_is_not_a_model_is_a_clear_error(trained: Trained, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(trained.model.read_bytes()[:5000])
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    broken = tmp_path / "broken.pt"
    state = torch.load(trained.model, weights_only=True)
    del state["config"]
    torch.save(state, broken)
    audio = trained.root / "low" / "low_0.wav"
    for path, reason in ((text, "not a labswarm model file"), (truncated, "not a labswarm model file"),
                         (audio, "not a labswarm model file"), (other, "not a labswarm model file"),
                         (broken, "not a usable labswarm model file"), (tmp_path / "gone.pt", "no such model file")):
        with pytest.raises(CheckpointError, match=reason) as caught:
            predict(path, [audio])
        assert str(path) in str(caught.value) and "\n" not in str(caught.value)
        answer = _cli(str(path), str(audio))
        assert answer.exit_code == 2 and reason in answer.output.replace("\n", " "), answer.output


def test_a_job_id_downloads_the_jobs_model_from_the_manager(tmp_path: Path) -> None:
    """~15 s: a real learner process (torch and librosa imports) trains the job's one epoch."""
    token = "predict-test-token"
    (tmp_path / "token").write_text(token + "\n")
    files = [tmp_path / "data" / "low" / "low_3.wav", tmp_path / "data" / "noise" / "noise_5.wav"]
    with manager(tmp_path, api_token=token) as m:
        m.http.headers["Authorization"] = f"Bearer {token}"
        job = m.submit(tiny_manifest(tmp_path, epochs=1))
        assert statuses(read_events(m.http, job["id"]))[-1] == "completed"
        (tmp_path / "model.pt").write_bytes(m.http.get(f"/v1/jobs/{job['id']}/model").content)
        env = {"LABSWARM_MANAGER_URL": m.server.url}
        by_job = _cli(job["id"], *map(str, files), "--json", env={**env, "LABSWARM_API_TOKEN": token})
        by_file = _cli(job["id"][:6], *map(str, files), "--json", "--token-file", str(tmp_path / "token"), env=env)
        unknown = _cli("0123456789ab", str(files[0]), env={**env, "LABSWARM_API_TOKEN": token})
        no_token = _cli(job["id"], str(files[0]), env={**env, "LABSWARM_API_TOKEN": None,
                                                       "LABSWARM_API_TOKEN_FILE": None})
    assert by_job.exit_code == 0, by_job.output
    expected = [p.to_dict() for p in predict(tmp_path / "model.pt", files)]
    assert json.loads(by_job.output) == json.loads(by_file.output) == expected
    assert all(isinstance(Prediction(**row).label, str) for row in expected)
    assert unknown.exit_code == 2 and "0123456789ab" in unknown.output and "404" in unknown.output, unknown.output
    assert no_token.exit_code == 2 and "401" in no_token.output, no_token.output


def test_labswarm_predict_runs_its_maths_libraries_on_one_thread(trained: Trained) -> None:
    """A process of its own (the limit is process-wide), started with 3-thread pools: after ``labswarm predict``
    every pool threadpoolctl sees (numpy's BLAS, torch's OpenMP) has one thread, as in a feature worker."""
    code = ("import json, sys, typer; from threadpoolctl import threadpool_info; from labswarm.cli.main import app\n"
            "try:\n    typer.main.get_command(app).main(sys.argv[1:], standalone_mode=False)\n"
            "except SystemExit:\n    pass\n"
            "print(json.dumps({i['filepath']: i['num_threads'] for i in threadpool_info()}))")
    env = {**os.environ, "OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    clip = next((trained.root / "low").glob("*.wav"))
    done = subprocess.run([sys.executable, "-c", code, "predict", str(trained.model), str(clip), "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    *answer, pools = done.stdout.strip().splitlines()
    assert json.loads("\n".join(answer))[0]["error"] is None
    threads = json.loads(pools)
    assert threads and set(threads.values()) == {1}, threads

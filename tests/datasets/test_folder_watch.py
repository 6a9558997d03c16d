"""A watched folder (labswarm/datasets/watch.py): new complete audio files become labels-CSV rows that a followed
session's reader takes, once, with their label from a rule; and `labswarm watch` on a real folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from labswarm.cli.main import app
from labswarm.datasets.folder import read_clips
from labswarm.datasets.watch import FolderWatch, LabelRule, parse_rule
from labswarm.errors import DatasetError
from labswarm.paths import DataRoots
from labswarm.sessions.follow import LabelsTail


def _wav(path: Path, seconds: float = 0.05) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, (0.1 * np.random.default_rng(0).standard_normal(int(22050 * seconds))).astype(np.float32), 22050)
    return path


def test_new_complete_files_become_rows_once_that_a_followed_session_reads(tmp_path: Path) -> None:
    root = tmp_path / "data"
    labels = root / "labels.csv"
    _wav(root / "old" / "a.wav")
    labels.parent.mkdir(parents=True, exist_ok=True)
    labels.write_text("path,label\nold/a.wav,old\n")
    tail = LabelsTail(root, labels, DataRoots([root]))
    assert tail.changed() and [c.clip_id for chunk in tail.rows() for c in chunk] == ["old/a.wav"]

    watch = FolderWatch(root, labels, parse_rule("parent"), root)
    _wav(root / "music" / "m1.wav")
    _wav(root / "speech" / "s1.flac")
    _wav(root / "top.wav")  # no parent folder under the watched one: no label by rule "parent"
    (root / "music" / ".m2.wav.part").write_bytes(b"partial")  # a copy tool's temporary file
    (root / "music" / "notes.txt").write_text("not audio")
    growing = root / "speech" / "s2.wav"
    growing.write_bytes(b"RIFF")
    assert watch.poll() == []  # first sight: a file is taken once a second look sees it unchanged
    with growing.open("ab") as f:  # still being written
        f.write(b"\0" * 100)
    assert watch.poll() == [("music/m1.wav", "music"), ("speech/s1.flac", "speech")]
    assert watch.poll() == [("speech/s2.wav", "speech")]  # unchanged since the last look
    assert watch.poll() == []  # nothing twice; the unlabelled file is not retried

    # the followed session's reader takes exactly the appended rows, whole
    assert tail.changed()
    assert [(c.clip_id, c.label) for chunk in tail.rows() for c in chunk] == [
        ("music/m1.wav", "music"), ("speech/s1.flac", "speech"), ("speech/s2.wav", "speech")]

    # a restarted watcher knows the CSV's rows; a removed file's row stays; a line without its line break is
    # ended before the new rows
    (root / "music" / "m1.wav").unlink()
    with labels.open("a") as f:
        f.write("by/hand.wav,hand")
    again = FolderWatch(root, labels, LabelRule("fixed", "new"), root)
    _wav(root / "later" / "x.wav")
    assert again.poll() == []
    assert again.poll() == [("top.wav", "new"), ("later/x.wav", "new")]
    lines = labels.read_text().splitlines()
    assert lines == ["path,label", "old/a.wav,old", "music/m1.wav,music", "speech/s1.flac,speech",
                     "speech/s2.wav,speech", "by/hand.wav,hand", "top.wav,new", "later/x.wav,new"]


@pytest.mark.parametrize("header", ["path,source,label", "label,path"])
def test_rows_are_written_under_the_csvs_own_header_and_listed_paths_are_known_however_written(
        tmp_path: Path, header: str) -> None:
    root = tmp_path / "data"
    for name in ("old/a.wav", "old/b.wav", "old/c.wav", "birds/b1.wav", "frogs/f1.wav"):
        _wav(root / name)
    columns = header.split(",")
    listed = [("old/a.wav", "old", "rec1"), (str(root / "old" / "b.wav"), "old", ""), ("./old//c.wav", "old", "")]
    labels = root / "labels.csv"
    labels.write_text("".join(",".join({"path": p, "label": lab, "source": src}[c] for c in columns) + "\n"
                              for p, lab, src in [("path", "label", "source"), *listed]))

    watch = FolderWatch(root, labels, parse_rule("parent"), root)
    assert watch.known == {"old/a.wav", "old/b.wav", "old/c.wav"}  # normalised to the dataset root
    assert watch.poll() == []
    assert watch.poll() == [("birds/b1.wav", "birds"), ("frogs/f1.wav", "frogs")]  # nothing listed appended again

    # the real reader takes every row, by column name, with its path and label
    clips = read_clips(root, labels, DataRoots([root]))
    assert [(c.clip_id, c.label) for c in clips] == [(p, lab) for p, lab, _ in listed] + [
        ("birds/b1.wav", "birds"), ("frogs/f1.wav", "frogs")]
    assert clips[-1].path == str(root / "frogs" / "f1.wav") and clips[-1].source == "frogs/f1.wav"
    tail = LabelsTail(root, labels, DataRoots([root]))
    assert [(c.clip_id, c.label) for chunk in tail.rows() for c in chunk] == [(c.clip_id, c.label) for c in clips]
    expected = {"path,source,label": "birds/b1.wav,,birds", "label,path": "birds,birds/b1.wav"}[header]
    assert labels.read_text().splitlines()[-2] == expected


def test_an_empty_csv_gets_the_header_and_one_without_a_required_column_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _wav(root / "birds" / "b1.wav")
    labels = root / "labels.csv"
    labels.write_text("")
    watch = FolderWatch(root, labels, parse_rule("parent"), root)
    watch.poll()
    assert watch.poll() == [("birds/b1.wav", "birds")]
    assert labels.read_text() == "path,label\nbirds/b1.wav,birds\n"
    labels.write_text("file,label\nold/a.wav,old\n")
    with pytest.raises(DatasetError, match=r"missing column\(s\) path"):
        FolderWatch(root, labels, parse_rule("parent"), root)
    assert labels.read_text() == "file,label\nold/a.wav,old\n"  # untouched


def test_label_rules_and_their_errors(tmp_path: Path) -> None:
    rule = parse_rule(r"regex:^(?P<label>[a-z]+)_\d+")
    assert rule.label("incoming/dog_12.wav") is None  # searched in the whole relative path: anchored at its start
    assert rule.label("dog_12.wav") == "dog"
    assert parse_rule(r"regex:/(?P<label>[a-z]+)_\d+").label("incoming/dog_12.wav") == "dog"
    assert parse_rule("parent").label("a/b/c.wav") == "b"
    assert parse_rule("fixed: x ").label("c.wav") == "x"
    for bad, reason in [("regex:(", "does not compile"), ("regex:[a-z]+", "no group named label"),
                        ("fixed:", "expected parent"), ("folder", "expected parent")]:
        with pytest.raises(ValueError, match=reason):
            parse_rule(bad)


def test_labswarm_watch_refuses_a_bad_rule_with_status_2_naming_the_option(tmp_path: Path) -> None:
    experiment = _experiment(tmp_path)
    result = CliRunner().invoke(app, ["watch", str(experiment), "--label", "regex:x"])
    assert result.exit_code == 2 and "--label" in result.output and "no group named label" in result.output
    result = CliRunner().invoke(app, ["watch", str(experiment), "--folder", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "--folder" in result.output and "not a folder" in result.output


def _experiment(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir(exist_ok=True)
    (root / "labels.csv").write_text("path,label\n")
    experiment = tmp_path / "exp.yml"
    experiment.write_text(f"name: watched\ndataset: {{root: {root}}}\n"
                          "transformations: [{name: gain, gain_db: 0}]\n"
                          "features: [{name: stft, n_fft: 256, hop_length: 128}]\n"
                          f"store: {{root: {tmp_path / 's'}}}\n")
    return experiment


@pytest.mark.slow  # the console script in its own process, stopped by SIGTERM (~20-40 s at load 20)
def test_labswarm_watch_appends_rows_until_stopped(tmp_path: Path) -> None:
    experiment, root = _experiment(tmp_path), tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "labswarm.cli", "watch", str(experiment), "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wav(root / "birds" / "b1.wav")
        deadline = time.monotonic() + 120
        while "birds/b1.wav" not in (root / "labels.csv").read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        assert (root / "labels.csv").read_text() == "path,label\nbirds/b1.wav,birds\n"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "birds/b1.wav,birds" in stderr

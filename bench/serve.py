"""Measure: the prediction endpoint (``labswarm serve``, over HTTP) against ``labswarm.predict`` in-process, side by
side on one model and one 10-s clip.

    .venv/bin/python bench/serve.py [--model MODEL.pt] [--requests 24] [--clients 1,4,16]

Without ``--model`` a small model is trained first on a synthetic three-class set of 10-s clips (tones and noise,
1 epoch, ~half a minute). The endpoint runs as its own process (``python -m labswarm.cli serve``: uvicorn, the
model loaded once, forward passes batched across requests); the clients are threads of this process, each with
its own HTTP connection, each request one 10-s WAV file. The baseline calls the same model in this process with
no HTTP: :class:`labswarm.predict.Predictor` built once (what :func:`labswarm.predict.predict` does per call,
without reloading the model each time), ``predict_file`` from as many threads as there are clients.

Prints, for one client: latency p50 and p99 of both and their ratio (goal: endpoint p50 within 1.2x); for each
client count: clips/s of both, their ratio, and the endpoint's throughput against its own at one client (goal at
16 clients: at least 1.5x). ``--requests`` is per client count (at least 2 per client). Timings are noisy on a
shared machine: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

SR = 22050


def _synthetic_model(folder: Path) -> Path:
    """A cnn on log-mel trained 1 epoch on 3 classes x 4 synthetic 10-s clips; returns the model file."""
    from labswarm.config.experiment import parse_experiment
    from labswarm.train.trainer import Trainer

    rows = ["path,label,source"]
    t = np.arange(10 * SR) / SR
    for c, label in enumerate(("high", "low", "noise")):
        (folder / "data" / label).mkdir(parents=True, exist_ok=True)
        for i in range(4):
            rng = np.random.default_rng(10 * c + i)
            freq = (2500.0 if label == "high" else 150.0) * (1 + 0.08 * i)
            y = 0.3 * rng.standard_normal(t.size) if label == "noise" else 0.5 * np.sin(2 * np.pi * freq * t)
            sf.write(folder / "data" / label / f"{i}.wav", y.astype(np.float32), SR)
            rows.append(f"{label}/{i}.wav,{label},{label}-{i}")
    (folder / "data" / "labels.csv").write_text("\n".join(rows) + "\n")
    config = parse_experiment({
        "name": "serve-bench", "seed": 0,
        "dataset": {"root": str(folder / "data"), "sample_rate": SR, "segment": {"start": 0.0, "duration": 10.0}},
        "transformations": [{"name": "identity"}], "features": [{"name": "mel", "n_mels": 64}],
        "store": {"root": str(folder / "store")},
        "pipeline": [{"name": "source"}, {"name": "shuffle"}, {"name": "features"}, {"name": "batch", "size": 4}],
        "model": {"name": "cnn", "input": "mel"},
        "training": {"epochs": 1, "learning_rate": 0.01, "validation": 0.25, "threads": 1}})
    return Trainer(config, folder / "home").fit().model_path


def _run(clients: int, requests: int, call: Callable[[int], None]) -> tuple[list[float], float]:
    """``requests`` calls spread over ``clients`` threads (``call(thread)``): each call's seconds, and the wall
    time of them all."""
    latencies: list[float] = []
    lock = threading.Lock()
    per = [requests // clients + (i < requests % clients) for i in range(clients)]

    def client(index: int) -> None:
        for _ in range(per[index]):
            started = time.perf_counter()
            call(index)
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, time.perf_counter() - started


def _serve(model: Path, port: int, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()  # no token: open to loopback clients
           if k not in ("LABSWARM_API_TOKEN", "LABSWARM_API_TOKEN_FILE", "LABSWARM_TOKENS_FILE")}
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "labswarm.cli", "serve", str(model), "--port", str(port),
                                    "--name", "bench"], env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"labswarm serve exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("labswarm serve did not answer within 180 s")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--requests", type=int, default=24, help="requests per client count (default 24)")
    parser.add_argument("--clients", default="1,4,16")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]

    from labswarm.manager.server import free_port
    from labswarm.predict import Predictor

    with tempfile.TemporaryDirectory(prefix="labswarm-bench-serve-") as tmp:
        folder = Path(tmp)
        model = args.model or _synthetic_model(folder)
        clip = folder / "clip.wav"
        rng = np.random.default_rng(0)
        t = np.arange(10 * SR) / SR
        sf.write(clip, (0.5 * np.sin(2 * np.pi * 200 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32),
                 SR)
        body = clip.read_bytes()
        predictor = Predictor(model)
        port = free_port()
        process = _serve(model, port, folder / "serve.log")
        https = [httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) for _ in range(max(counts))]
        expected = predictor.predict_file(clip)

        def local(_index: int) -> None:
            assert predictor.predict_file(clip).error is None

        def remote(index: int) -> None:
            answer = https[index].post("/v1/models/bench/predict", files=[("files", ("clip.wav", body, "audio/wav"))])
            row = answer.json()["results"][0]
            assert answer.status_code == 200 and row["label"] == expected.label, answer.text

        try:
            for call in (local, remote):  # warm both: first decode, first forward pass, connections
                _run(max(counts), max(counts), call)
            rows = []
            for clients in counts:
                n = max(args.requests, 2 * clients)
                lat_local, wall_local = _run(clients, n, local)
                lat_remote, wall_remote = _run(clients, n, remote)
                rows.append((clients, n, lat_local, wall_local, lat_remote, wall_remote))
        finally:
            for http in https:
                http.close()
            process.terminate()
            process.wait(60)

    print(f"model {model.name}; one 10-s clip a request; load {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    _, n, lat_local, _, lat_remote, _ = rows[0]
    p = {name: np.percentile(lat, [50, 99]) * 1000 for name, lat in (("local", lat_local), ("remote", lat_remote))}
    print(f"latency, {rows[0][0]} client, {n} requests:   in-process p50 {p['local'][0]:.0f} ms p99 "
          f"{p['local'][1]:.0f} ms | endpoint p50 {p['remote'][0]:.0f} ms p99 {p['remote'][1]:.0f} ms | "
          f"p50 ratio {p['remote'][0] / p['local'][0]:.2f}x (goal <= 1.2x)")
    one = None
    for clients, n, _, wall_local, _, wall_remote in rows:
        local_rate, remote_rate = n / wall_local, n / wall_remote
        one = one or remote_rate
        print(f"throughput, {clients:>2} clients, {n} clips: in-process {local_rate:.2f} clips/s | endpoint "
              f"{remote_rate:.2f} clips/s | endpoint/in-process {remote_rate / local_rate:.2f}x | endpoint vs 1 "
              f"client {remote_rate / one:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])

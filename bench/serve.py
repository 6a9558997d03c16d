"""Measure: the prediction endpoint (``labswarm serve``, over HTTP) against ``labswarm.predict`` in-process, side by
side on one model and one 10-s clip.

    .venv/bin/python bench/serve.py [--model MODEL.pt] [--requests 32] [--clients 1,4,16] [--rounds 3]
                                    [--upload raw|multipart] [--client http.client] [--versus VAR=VALUE]

Without ``--model`` a small model is trained first on a synthetic three-class set of 10-s clips (tones and noise,
1 epoch, ~half a minute). The endpoint runs as its own process (``python -m labswarm.cli serve``: uvicorn, the
model loaded once, features in its worker processes, forward passes batched across requests); the clients are
threads of this process (httpx), each with its own HTTP connection, each request one 10-s WAV file, as the
request's whole body (``--upload raw``, the default) or as a multipart form (``--upload multipart``). The
baseline calls the same model in this process with no HTTP: :class:`labswarm.predict.Predictor` built once (what
:func:`labswarm.predict.predict` does per call, without reloading the model each time), ``predict_file`` from as
many threads as there are clients, with the maths libraries on one thread as the endpoint's feature workers
(:func:`labswarm.threads.limit_threads`; with their default two threads the baseline's mel projection is up to
70x slower on the loaded 2-core machine, which would flatter the endpoint).

The runs are interleaved: each round runs every client count, in-process then endpoint, so that both sides and
all counts see the same load on a shared machine; ``--requests`` is per round and client count (at least 2 per
client). Prints, for one client: latency p50 and p99 of both and their ratio (goal: endpoint p50 within 1.2x);
for each client count: clips/s of both (all rounds' clips over all rounds' time), their ratio, and the
endpoint's throughput against its own at one client (goal at 16 clients: at least 1.5x), with that ratio in each
round; the endpoint's mean forward batch; and the CPU time a clip cost (user + system, whatever the load): the
bench's process for the in-process runs, the endpoint's processes (server and feature workers) and the clients'
(this process) for the endpoint runs. The load average is printed at each round. The last two lines are the
issue's goals, each ratio with met / NOT met. ``--client http.client`` adds, at one client, the endpoint's
latency through the standard library's ``http.client`` (~0.6 ms of client CPU a request against httpx's 0.7-1.4 ms:
closer to the server's own cost), printed on a line of its own beside the httpx figures, which stay the goal's
(httpx is the client labswarm's own ``ManagerClient`` uses). ``--versus VAR=VALUE`` starts a second ``labswarm
serve`` with that environment variable and times it in the same rounds, right after the first endpoint at each
client count (an A/B in one run, e.g. ``LABSWARM_PREDICT_LONE_ON_LOOP=false``: a lone client's file in an upload
thread instead of on the event loop): its lines come last, its one-client p50 ratio beside the default's from the
same rounds. ~20 s on the quiet 2-core machine with its model trained, ~35 s with ``--versus`` (~1 min under load
10; several minutes at load 30).
"""

from __future__ import annotations

import argparse
import http.client
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
import psutil
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


def _serve(model: Path, port: int, log: Path, extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()  # no token: open to loopback clients
           if k not in ("LABSWARM_API_TOKEN", "LABSWARM_API_TOKEN_FILE", "LABSWARM_TOKENS_FILE")}
    env.update(extra or {})
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


def _cpu(process: psutil.Process, children: bool = True) -> float:
    """CPU seconds (user + system) of ``process`` so far, and of its children (the endpoint's feature workers)."""
    total = 0.0
    for p in [process, *(process.children(recursive=True) if children else [])]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _passes(http: httpx.Client) -> tuple[int, int]:
    forward = http.get("/v1/models/bench").json()["forward"]
    return forward["passes"], forward["rows"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--requests", type=int, default=32, help="requests per round and client count (32)")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--upload", choices=("raw", "multipart"), default="raw",
                        help="the clip as the request's whole body (raw, default) or as a multipart form")
    parser.add_argument("--client", choices=("http.client",), help="also time one client through http.client "
                        "(the server's own cost, printed beside the httpx figures, which stay the goal's)")
    parser.add_argument("--versus", metavar="VAR=VALUE", help="also time a second labswarm serve started with "
                        "this environment variable, its requests right after the first one's in each round (an "
                        "A/B in one run: e.g. LABSWARM_PREDICT_LONE_ON_LOOP=false); printed on lines of its own")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]
    versus = dict([args.versus.split("=", 1)]) if args.versus else None

    from labswarm.manager.server import free_port
    from labswarm.predict import Predictor
    from labswarm.threads import limit_threads

    limit_threads(1)
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
        me, server = psutil.Process(), psutil.Process(process.pid)
        https = [httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) for _ in range(max(counts))]
        other = _Other(model, folder, versus, max(counts)) if versus else None
        expected = predictor.predict_file(clip)

        def local(_index: int) -> None:
            assert predictor.predict_file(clip).error is None

        if args.upload == "raw":
            sent = {"content": body, "params": {"name": "clip.wav"}, "headers": {"Content-Type": "audio/wav"}}
        else:
            sent = {"files": [("files", ("clip.wav", body, "audio/wav"))]}

        def remote(index: int, clients: list[httpx.Client] = https) -> None:
            try:
                answer = clients[index].post("/v1/models/bench/predict", **sent)  # type: ignore[arg-type]
            except (httpx.ReadError, httpx.RemoteProtocolError):  # a keep-alive connection the server closed
                answer = clients[index].post("/v1/models/bench/predict", **sent)  # type: ignore[arg-type]
            row = answer.json()["results"][0]
            assert answer.status_code == 200 and row["label"] == expected.label, answer.text

        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        target = "/v1/models/bench/predict?" + ("name=clip.wav" if args.upload == "raw" else "")
        if args.upload == "raw":
            plain_body, plain_headers = body, {"Content-Type": "audio/wav"}
        else:  # the same form httpx builds
            built = httpx.Request("POST", "http://x/", files=sent["files"])  # type: ignore[arg-type]
            plain_body, plain_headers = built.read(), {"Content-Type": built.headers["Content-Type"]}

        def remote_plain(_index: int) -> None:
            for attempt in (0, 1):  # a keep-alive connection the server closed: once more on a new one
                try:
                    plain.request("POST", target, plain_body, plain_headers)
                    answer = plain.getresponse()
                    text = answer.read()
                    break
                except (ConnectionError, http.client.HTTPException):
                    plain.close()
                    if attempt:
                        raise
            assert answer.status == 200, text

        runs: dict[int, list[tuple]] = {c: [] for c in counts}
        plain_latencies: list[float] = []
        loads = [os.getloadavg()[0]]
        try:
            for call in (local, remote):  # warm both: first decode, first forward pass, connections
                _run(max(counts), max(counts), call)
            if other:
                _run(max(counts), max(counts), other.call(remote))
            if args.client:
                _run(1, 4, remote_plain)
            for _ in range(args.rounds):
                for clients in counts:
                    n = max(args.requests, 2 * clients)
                    cpu = _cpu(me, False)
                    lat_local, wall_local = _run(clients, n, local)
                    cpu_local = _cpu(me, False) - cpu
                    before, cpu, cpu_server = _passes(https[0]), _cpu(me, False), _cpu(server)
                    lat_remote, wall_remote = _run(clients, n, remote)
                    cpu_clients, cpu_server = _cpu(me, False) - cpu, _cpu(server) - cpu_server
                    after = _passes(https[0])
                    if other:
                        other.measure(clients, n, remote, me)
                    if args.client and clients == counts[0]:  # one client: the one connection is not shared
                        plain_latencies += _run(1, n, remote_plain)[0]
                    runs[clients].append((n, lat_local, wall_local, lat_remote, wall_remote,
                                          after[0] - before[0], after[1] - before[1],
                                          cpu_local, cpu_server, cpu_clients))
                loads.append(os.getloadavg()[0])
        finally:
            for client in https:
                client.close()
            plain.close()
            process.terminate()
            if other:
                other.close()
            process.wait(60)
    _report(model, counts, runs, loads, args.upload, plain_latencies)
    if other:
        other.report(counts, runs)


class _Other:
    """The ``--versus`` endpoint: a second ``labswarm serve`` with one more environment variable, its own clients."""

    def __init__(self, model: Path, folder: Path, env: dict[str, str], clients: int) -> None:
        from labswarm.manager.server import free_port

        self.env = env
        port = free_port()
        self.process = _serve(model, port, folder / "serve-versus.log", env)
        self.server = psutil.Process(self.process.pid)
        self.https = [httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) for _ in range(clients)]
        self.runs: dict[int, list[tuple]] = {}

    def call(self, remote: Callable[..., None]) -> Callable[[int], None]:
        return lambda index: remote(index, self.https)

    def measure(self, clients: int, n: int, remote: Callable[..., None], me: psutil.Process) -> None:
        cpu, cpu_server = _cpu(me, False), _cpu(self.server)
        latencies, wall = _run(clients, n, self.call(remote))
        self.runs.setdefault(clients, []).append((n, latencies, wall, _cpu(self.server) - cpu_server,
                                                  _cpu(me, False) - cpu))

    def report(self, counts: list[int], runs: dict) -> None:
        name = ", ".join(f"{k}={v}" for k, v in self.env.items())
        one = counts[0]
        p50 = float(np.percentile([x for run in self.runs[one] for x in run[1]], 50)) * 1000
        first = float(np.percentile([x for run in runs[one] for x in run[3]], 50)) * 1000
        local = float(np.percentile([x for run in runs[one] for x in run[1]], 50)) * 1000
        rate = {c: sum(r[0] for r in self.runs[c]) / sum(r[2] for r in self.runs[c]) for c in counts}
        for clients in counts:
            n = sum(run[0] for run in self.runs[clients])
            cpu = [1000 * sum(run[i] for run in self.runs[clients]) / n for i in (3, 4)]
            print(f"versus {name}, {clients:>2} clients: endpoint {rate[clients]:.2f} clips/s | vs 1 client "
                  f"{rate[clients] / rate[one]:.2f}x | CPU ms a clip: endpoint's processes {cpu[0]:.1f} + its "
                  f"clients {cpu[1]:.1f}")
        print(f"versus {name}: endpoint p50 / in-process p50, {one} client: {p50 / local:.2f}x (p50 {p50:.1f} ms; "
              f"the default's {first / local:.2f}x, {first:.1f} ms, in the same rounds); {counts[-1]} clients / "
              f"{one} client: {rate[counts[-1]] / rate[one]:.2f}x")

    def close(self) -> None:
        for client in self.https:
            client.close()
        self.process.terminate()
        self.process.wait(60)


def _report(model: Path, counts: list[int], runs: dict, loads: list[float], upload: str,
            plain: list[float]) -> None:
    alone = os.environ.get("LABSWARM_PREDICT_COMPUTE_ALONE", "true")
    loop = os.environ.get("LABSWARM_PREDICT_LONE_ON_LOOP", "true")
    print(f"model {model.name}; LABSWARM_PREDICT_COMPUTE_ALONE={alone}, LABSWARM_PREDICT_LONE_ON_LOOP={loop}; one "
          f"10-s clip a request ({upload} upload); "
          f"{len(runs[counts[0]])} interleaved rounds; load average (1 min) at start and after each round: "
          f"{', '.join(f'{x:.1f}' for x in loads)}; {os.cpu_count()} cores")
    one = counts[0]
    lat_local = [x for run in runs[one] for x in run[1]]
    lat_remote = [x for run in runs[one] for x in run[3]]
    p = {name: np.percentile(lat, [50, 99]) * 1000 for name, lat in (("local", lat_local), ("remote", lat_remote))}
    print(f"latency, {one} client, {len(lat_local)} requests:   in-process p50 {p['local'][0]:.0f} ms p99 "
          f"{p['local'][1]:.0f} ms | endpoint p50 {p['remote'][0]:.0f} ms p99 {p['remote'][1]:.0f} ms | "
          f"p50 ratio {p['remote'][0] / p['local'][0]:.2f}x (goal <= 1.2x)")
    if plain:
        q = np.percentile(plain, [50, 99]) * 1000
        print(f"  the same through http.client (the server's own cost; not the goal's figure), {len(plain)} requests: "
              f"endpoint p50 {q[0]:.0f} ms p99 {q[1]:.0f} ms | p50 ratio {q[0] / p['local'][0]:.2f}x")
    base = [run[0] / run[4] for run in runs[one]]  # the endpoint's clips/s at one client, per round
    base_all = sum(run[0] for run in runs[one]) / sum(run[4] for run in runs[one])
    for clients in counts:
        n = sum(run[0] for run in runs[clients])
        local_rate = n / sum(run[2] for run in runs[clients])
        remote_rate = n / sum(run[4] for run in runs[clients])
        per_round = ", ".join(f"{run[0] / run[4] / b:.2f}" for run, b in zip(runs[clients], base, strict=True))
        passes, rows = sum(run[5] for run in runs[clients]), sum(run[6] for run in runs[clients])
        cpu = [1000 * sum(run[i] for run in runs[clients]) / n for i in (7, 8, 9)]
        print(f"throughput, {clients:>2} clients, {n} clips: in-process {local_rate:.2f} clips/s | endpoint "
              f"{remote_rate:.2f} clips/s | endpoint/in-process {remote_rate / local_rate:.2f}x | endpoint vs 1 "
              f"client {remote_rate / base_all:.2f}x (rounds: {per_round}) | mean forward batch "
              f"{rows / max(passes, 1):.1f} rows | CPU ms a clip: in-process {cpu[0]:.0f}, endpoint's processes "
              f"{cpu[1]:.0f} + its clients {cpu[2]:.0f}")
        if clients == counts[-1]:
            batching = remote_rate / base_all
    latency = p["remote"][0] / p["local"][0]
    print(f"GOAL latency:  endpoint p50 / in-process p50, {one} client: {latency:.2f}x (goal <= 1.2x): "
          f"{'met' if latency <= 1.2 else 'NOT met'}")
    print(f"GOAL batching: endpoint clips/s, {counts[-1]} clients / {one} client: {batching:.2f}x (goal >= 1.5x): "
          f"{'met' if batching >= 1.5 else 'NOT met'}  (load average {min(loads):.1f}-{max(loads):.1f} on "
          f"{os.cpu_count()} cores: the goals are for a quiet machine)")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Benchmark (issue 24): the peak memory of each learner of a 2-learner training job run through the manager, on
the demo set's training split synthesised 1x and 10x (bench/learner_memory.py's ``scaled_experiment``).

For each set, a real manager (in this process, on loopback, 2 job slots) runs the job ``learners: 2, framework:
allreduce, training: {epochs: 1, threads: 1}`` with the experiment inline, local learners (the local launcher);
every 0.25 s the job's learner pids (the attempt's ``learners`` in ``GET /v1/jobs/ID``) are read with psutil:
each one's resident memory and its peak (``VmHWM``), for ``--seconds`` or until the job ends (an epoch of the
10x set lasts far longer than the window); then the job is deleted. Printed per set and learner: the peak RSS
(``VmHWM``) and the largest RSS sampled, the job's status when the window ended, the load.

    .venv/bin/python bench/store_scale.py --job examples/music_speech_noise.yml [--factor 10] [--seconds 150]
        [--keep-bytes 0]   (the job's training.keep_bytes: 0 streams the 1x set too; --factor 1: the 1x set alone)

Goal (issue 24): each learner's peak memory under 1 GB and within 10 % between 1x and 10x.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml


def watch_job(url: str, experiment: Path, seconds: float, results: Path, keep_bytes: int | None = None,
              ) -> dict[str, Any]:
    """Submit the 2-learner job training ``experiment`` to the manager at ``url`` and watch its learners for
    ``seconds`` (or to its end), then delete it (``keep_bytes``: the job's ``training.keep_bytes``, default the
    learners' own); returns ``{"hwm_mb": {pid: MB}, "rss_mb": {pid: MB}, "status":
    the job's last status seen, "elapsed_s": ...}``."""
    import httpx
    import psutil

    training: dict[str, Any] = {"epochs": 1, "threads": 1}
    if keep_bytes is not None:
        training["keep_bytes"] = keep_bytes
    manifest = {"name": "store-scale", "experiment": yaml.safe_load(experiment.read_text()), "learners": 2,
                "framework": {"name": "allreduce"}, "training": training,
                "results_store": {"name": "local", "path": str(results)}}
    hwm: dict[int, float] = {}
    rss: dict[int, float] = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        response = http.post("/v1/jobs", json=manifest)
        response.raise_for_status()
        job_id = response.json()["id"]
        started = time.monotonic()
        status = "queued"
        while time.monotonic() - started < seconds:
            shown = http.get(f"/v1/jobs/{job_id}").json()
            status = shown["status"]
            if status in ("completed", "failed", "deleted"):
                break
            for learner in (shown["attempts"][-1]["learners"] if shown.get("attempts") else []):
                pid = learner.get("pid")
                if not pid:
                    continue
                with contextlib.suppress(psutil.Error, OSError, IndexError, ValueError):
                    rss[pid] = max(rss.get(pid, 0.0), psutil.Process(pid).memory_info().rss / 1e6)
                    text = Path(f"/proc/{pid}/status").read_text()
                    hwm[pid] = max(hwm.get(pid, 0.0), int(text.split("VmHWM:")[1].split()[0]) * 1024 / 1e6)
            time.sleep(0.25)
        elapsed = time.monotonic() - started
        with contextlib.suppress(httpx.HTTPError):
            http.delete(f"/v1/jobs/{job_id}")
    return {"hwm_mb": hwm, "rss_mb": rss, "status": status, "elapsed_s": elapsed}


def job_scale(experiment: str, factor: int, seconds: float, keep_bytes: int | None = None) -> None:
    """Synthesise the 1x and ``factor``x sets and watch the 2-learner job's learners on each (module docstring)."""
    from learner_memory import scaled_experiment  # bench/ is the script's folder, first on sys.path

    from labswarm.manager.api import create_app
    from labswarm.manager.server import EmbeddedServer
    from labswarm.settings import Settings

    work = Path(tempfile.mkdtemp(prefix="job-memory-"))
    try:
        sets = {f"{f}x": scaled_experiment(experiment, f, work / f"{f}x") for f in sorted({1, factor})}
        roots = [str(work), yaml.safe_load(sets["1x"].read_text())["dataset"]["root"]]
        server = EmbeddedServer(create_app(Settings(home=work / "manager", data_roots=roots, job_slots=2))).start()
        try:
            for name, path in sets.items():
                load = os.getloadavg()[0]
                out = watch_job(server.url, path, seconds, work / f"results-{name}", keep_bytes)
                peaks = ", ".join(f"pid {pid}: peak RSS {mb:6.0f} MB (sampled RSS max {out['rss_mb'].get(pid, 0):6.0f})"
                                  for pid, mb in sorted(out["hwm_mb"].items()))
                budget = "default budget" if keep_bytes is None else f"keep_bytes {keep_bytes}"
                print(f"{name:4s} ({budget}) 2-learner job, {out['elapsed_s']:.0f} s ({out['status']}): {peaks}  "
                      f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

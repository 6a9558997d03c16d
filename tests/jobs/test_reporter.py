"""The learner's reporter over real HTTP: a backlog of long log lines reaches a manager with the default body
limit (1 MiB) in requests under it, every line once and in order (before the byte budget, 500 lines of 8 KiB made
one 4 MB request, refused with 413 again and again: the lines never arrived)."""

from __future__ import annotations

from jobs.receiver import receiver
from labswarm.auth.limits import MAX_BODY_BYTES
from labswarm.jobs.learner.reporter import MAX_LINE, JobReporter


def test_a_backlog_of_long_lines_is_sent_in_requests_under_the_body_limit() -> None:
    lines = [f"{i:04d} " + "x" * (MAX_LINE - 5) for i in range(600)]  # ~4.9 MB of log
    with receiver(max_body_bytes=MAX_BODY_BYTES) as r:
        reporter = JobReporter(r.url, job_id="j", attempt=1, interval=0.05)
        for line in lines:  # the backlog waits before the sending thread starts
            reporter.log(line)
        reporter.start()
        try:
            r.wait_for(lambda: len(r.lines()) == len(lines), timeout=60)
        finally:
            reporter.close()
        assert r.lines() == lines
        assert 0 < r.max_body <= MAX_BODY_BYTES
        assert r.requests >= 5  # ~4.9 MB in requests of at most 512 KiB


def test_a_metric_that_is_not_finite_is_sent_as_null() -> None:
    """httpx sends strict JSON (``allow_nan=False``): a NaN in a record raised ValueError in the sending thread and
    no report went out again."""
    with receiver() as r:
        reporter = JobReporter(r.url, job_id="j", attempt=1, interval=0.05)
        reporter.metric({"epoch": 1, "val_macro_f1": float("nan"), "loss": float("inf"), "val_f1": {"a": None}},
                        key="epoch:1")
        reporter.progress(final=True, epoch=1, loss=float("nan"))
        assert reporter.flush()
        reporter.log("after")
        assert reporter.flush()
        payloads = [event["payload"] for _, _, event in r.events]
    assert payloads[0] == {"epoch": 1, "val_macro_f1": None, "loss": None, "val_f1": {"a": None}}
    assert payloads[1] == {"epoch": 1, "loss": None} and payloads[-1] == {"line": "after"}

"""Issue 10's acceptance on a session's health decision log (``.labswarm/health/health-<session>.jsonl``).

After the first ``--skip`` seconds (5) of the session (the log's ``t`` counts from the controller's start,
which ``labswarm run`` starts with the session; its first row is the first decision), the queue depth must
stay within max(50, 10 s of the median consume rate) until the end; and the steady publish rate (the rows
from then on whose 5-s measurement window lies wholly before the publisher's last sample) must be within
15 % of the consume rate. Prints the figures, optionally draws the session's figure, and exits 1 when either
check fails.

    .venv/bin/python bench/health_acceptance.py .labswarm/health/health-SESSION.jsonl --figure out.png
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from labswarm.health.plot import plot_session, read_log

#: Seconds the publish and consume rates are measured over (the health loop's ``window``).
WINDOW = 5.0


def acceptance(rows: list[dict], skip: float = 5.0) -> dict[str, float]:
    """The acceptance figures of one session's decisions.

    Args:
        rows: the decision log, one dict per tick (``t`` s, ``depth`` messages, ``consume_rate`` and
            ``publish_rate`` tasks/s).
        skip: seconds from the controller's start (``t`` = 0) left out of the depth check.

    Returns:
        ``bound`` (messages), ``max_depth`` (after ``skip``), ``median_consume`` (tasks/s), ``publish``,
        ``consume`` (mean rates over the steady rows, tasks/s), ``ratio`` (publish / consume), ``steady_rows``.
    """
    t0 = rows[0]["t"]
    consume = [r["consume_rate"] for r in rows if r["consume_rate"] > 0]
    median = statistics.median(consume) if consume else 0.0
    bound = max(50.0, 10.0 * median)
    after = [r for r in rows if r["t"] >= skip]
    publishing = [r["t"] for r in rows if (r["publish_rate"] or 0) > 0]
    last_publish = publishing[-1] if publishing else t0
    steady = [r for r in after if r["t"] <= last_publish - WINDOW and r["publish_rate"] is not None]
    pub = statistics.fmean(r["publish_rate"] for r in steady) if steady else float("nan")
    con = statistics.fmean(r["consume_rate"] for r in steady) if steady else float("nan")
    return {"bound": bound, "max_depth": max((r["depth"] for r in after), default=0.0), "median_consume": median,
            "publish": pub, "consume": con, "ratio": pub / con if con else float("nan"), "steady_rows": len(steady),
            "seconds": rows[-1]["t"] - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a session's health-<session>.jsonl")
    parser.add_argument("--skip", type=float, default=5.0, help="seconds at the start left out (default 5)")
    parser.add_argument("--figure", type=Path, help="also draw the session's figure to this PNG")
    args = parser.parse_args(argv)
    rows = read_log(args.log)
    a = acceptance(rows, args.skip)
    depth_ok = a["max_depth"] <= a["bound"]
    ratio_ok = abs(a["ratio"] - 1.0) <= 0.15
    print(f"{args.log.name}: {len(rows)} decisions over {a['seconds']:.0f} s")
    print(f"depth bound max(50, 10 s x median consume {a['median_consume']:.1f}/s) = {a['bound']:.0f}; "
          f"max depth after {args.skip:.0f} s = {a['max_depth']:.0f}: {'ok' if depth_ok else 'FAIL'}")
    print(f"steady ({a['steady_rows']} decisions): publish {a['publish']:.2f}/s, consume {a['consume']:.2f}/s, "
          f"ratio {a['ratio']:.3f}: {'ok' if ratio_ok else 'FAIL'} (within 15 %)")
    if args.figure:
        print(f"figure: {plot_session(args.log, args.figure, title=args.log.stem)}")
    return 0 if depth_ok and ratio_ok else 1


if __name__ == "__main__":
    sys.exit(main())

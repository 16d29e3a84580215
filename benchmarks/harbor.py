"""Harbor images benchmark: image build cold and cached, episode start over an image vs plain.

    .venv/bin/python benchmarks/harbor.py [--samples 8]

Measured in one run, interleaved where two variants are compared (the ratio holds on a noisy
machine even when absolute times do not). Prints a table, then one JSON line.

* build_cold_s: a Dockerfile of the usual Harbor shape (FROM python:3.11-slim, a RUN that
  installs a package and adds a user, WORKDIR, two COPYs, a RUN over the copied files) built
  into an empty layer cache (the base skeleton included).
* build_cached_s_p50: the same build again (every step a cache hit; target <= 1 s).
* start_plain_ms_p50 / start_image_ms_p50: open a sandbox and run its first command (`true`),
  the plain sandbox vs one over the built image (root in a user namespace, writable overlays);
  start_ratio = image / plain (target <= 1.5).
* reset_image_ms_p50: `reset()` of an image sandbox (the whole tree remounted, job server
  restarted).
* start_pooled_ms_p50: an episode's start over the image from a `ConfigPool` (what `task_sandbox`
  takes by default: a booted sandbox reset after the previous episode) plus its first command, vs
  start_image_ms_p50 (a fresh boot each): pooled_ratio = pooled / fresh. The reset is paid when
  the episode gives the sandbox back: giveback_pooled_ms_p50 (after an episode that wrote to
  /etc and the workspace and left a daemon), vs close_fresh_ms_p50 (closing a fresh one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

DOCKERFILE = """\
FROM python:3.11-slim
RUN pip install --no-cache-dir pytest && useradd -m runner
WORKDIR /app
COPY data/ ./data/
COPY run.sh ./
RUN chmod +x run.sh && ./run.sh > summary.txt
"""


DIRTY = ("echo x > /etc/x; echo y > data/y; useradd extra; "
         "(setsid sleep 1000 > /dev/null 2>&1 &)")


def _context(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    for i in range(50):
        (root / "data" / f"log{i:02d}.txt").write_text(f"line {i}\nERROR {i}\n" * 20)
    (root / "run.sh").write_text("#!/bin/sh\ngrep -c ERROR data/*.txt | wc -l\n")
    (root / "Dockerfile").write_text(DOCKERFILE)
    return root / "Dockerfile"


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="posttrain-harbor-bench-") as tmp:
        os.environ["POSTTRAIN_IMAGE_CACHE"] = f"{tmp}/cache"
        from posttrain.images.build import build
        from posttrain.sandbox import Limits, open_sandbox
        from posttrain.sandbox.keyed import ConfigPool

        path = _context(Path(tmp) / "ctx")
        t0 = time.perf_counter()
        image = build(path)
        cold = time.perf_counter() - t0
        cached = []
        for _ in range(args.samples):
            t0 = time.perf_counter()
            again = build(path)
            cached.append(time.perf_counter() - t0)
            assert again.digest == image.digest
        plain, boxed, resets, pooled, givebacks, closes = [], [], [], [], [], []
        limits = Limits(wall_s=30)
        cfg = image.sandbox_config()
        pool = ConfigPool()
        with pool.sandbox(limits, image=cfg):
            pass  # the pool's first boot: later episodes find a reset sandbox
        for _ in range(args.samples):  # interleaved: every variant sees the same load
            for kind, out in (("plain", plain), ("image", boxed)):
                t0 = time.perf_counter()
                sb = open_sandbox(limits, image=cfg if kind == "image" else None)
                r = sb.run("true")
                out.append((time.perf_counter() - t0) * 1000)
                assert r.exit_code == 0, r.stderr
                if kind == "image":
                    sb.run(DIRTY)
                    t0 = time.perf_counter()
                    assert sb.reset().reusable
                    resets.append((time.perf_counter() - t0) * 1000)
                    t0 = time.perf_counter()
                    sb.close()
                    closes.append((time.perf_counter() - t0) * 1000)
                else:
                    sb.close()
            t0 = time.perf_counter()
            with pool.sandbox(limits, image=cfg) as sb:
                assert sb.run("true").exit_code == 0
                pooled.append((time.perf_counter() - t0) * 1000)
                sb.run(DIRTY)
                t0 = time.perf_counter()
            givebacks.append((time.perf_counter() - t0) * 1000)
        stats = dict(pool.stats)
        pool.close()
        assert stats["booted"] == 1 and stats["discards"] == 0, stats
    result = {"build_cold_s": round(cold, 3), "build_cached_s_p50": p50(cached),
              "build_cached_s_max": round(max(cached), 3), "layers": len(image.layers),
              "start_plain_ms_p50": p50(plain), "start_image_ms_p50": p50(boxed),
              "start_ratio": round(p50(boxed) / p50(plain), 3),
              "reset_image_ms_p50": p50(resets), "start_pooled_ms_p50": p50(pooled),
              "pooled_ratio": round(p50(pooled) / p50(boxed), 3),
              "giveback_pooled_ms_p50": p50(givebacks), "close_fresh_ms_p50": p50(closes),
              "pool_boots": stats["booted"], "samples": args.samples,
              "cached_ok": max(cached) <= 1.0}
    result["start_ok"] = result["start_ratio"] <= 1.5
    print(f"{'measure':28s} value")
    for k, v in result.items():
        print(f"{k:28s} {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

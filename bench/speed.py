#!/usr/bin/env python3
"""How fast llamafit plans: wall time of `llamafit plan --json` and `llamafit --help`, next to
`llama-fit-params -fitp on` on the same file and settings when that binary is available.

Usage: python bench/speed.py [--runs N] [--keep DIR]

Writes bench/results/speed.json and prints a table. Model files are sparse shape-faithful GGUFs
(no weight data), so this needs a few MB of disk, not 72 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import factory  # noqa: E402

LLAMAFIT = [sys.executable, "-m", "llamafit"]


def timed(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> tuple[float, int]:
    times = []
    rc = 0
    for _ in range(runs):
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, env=env)
        times.append(time.perf_counter() - t)
        rc = r.returncode
    return min(times), rc


def fit_params_binary() -> str | None:
    try:
        from llamafit.server import find_server

        srv = find_server()
    except Exception:
        return None
    p = Path(srv.path).with_name("llama-fit-params")
    return str(p) if p.exists() else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", type=Path)
    a = ap.parse_args()
    d = a.keep or Path(tempfile.mkdtemp())
    d.mkdir(parents=True, exist_ok=True)
    models = {
        "llama-3.1-8B Q4_K (128k vocab)": factory.llama31_8b(),
        "GLM-4.5-Air Q4_K (151k vocab, 72 GB)": factory.glm45_air(),
    }
    rows = []
    fitp = fit_params_binary()
    # Users' Pythons cache bytecode; some CI images set PYTHONDONTWRITEBYTECODE, which would time the
    # compiler instead of llamafit. One untimed warm-up run writes the caches.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([*LLAMAFIT, "--help"], capture_output=True, env=env)
    for label, shape in models.items():
        path = d / (label.split()[0] + ".gguf")
        if not path.exists():
            shape.write(path)
        size = path.stat().st_size
        plan_cmd = [*LLAMAFIT, "plan", str(path), "--json", "--gpu", "80GiB"]
        subprocess.run(plan_cmd, capture_output=True, env=env)
        t_plan, rc = timed(plan_cmd, a.runs, env)
        row = {"model": label, "file_size": size, "plan_s": round(t_plan, 3), "plan_rc": rc}
        if fitp:
            from llamafit.server import find_server

            srv = find_server()
            t_fp, rc_fp = timed([fitp, "-m", str(path), "-fitp", "on", "-np", "4", "-c", "4096"], max(1, a.runs // 2),
                                srv.env())  # fmt: skip
            row.update({"fit_params_s": round(t_fp, 3), "fit_params_rc": rc_fp, "ratio": round(t_plan / t_fp, 3)})
        rows.append(row)
    t_help, _ = timed([*LLAMAFIT, "--help"], a.runs, env)
    # what a shell runs on Tab for a model argument (commands and options need no Python at all)
    t_complete, _ = timed([*LLAMAFIT, "__complete", "repos"], a.runs, env)
    t_imp, _ = timed([sys.executable, "-c", "pass"], a.runs, env)
    result = {
        "python_startup_s": round(t_imp, 3),
        "help_s": round(t_help, 3),
        "complete_s": round(t_complete, 3),
        "models": rows,
        "targets": {"plan_s": 0.3, "help_s": 0.25, "complete_s": 0.15, "ratio_vs_fit_params": 0.25},
    }
    out = HERE / "results" / "speed.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"python startup          {t_imp * 1000:7.0f} ms")
    print(f"llamafit --help         {t_help * 1000:7.0f} ms   (target 250 ms)")
    print(f"completion (repos)      {t_complete * 1000:7.0f} ms   (target 150 ms)")
    for r in rows:
        line = f"plan --json {r['model']:<38} {r['plan_s'] * 1000:7.0f} ms   (target 300 ms)"
        if "fit_params_s" in r:
            line += f"   llama-fit-params -fitp on {r['fit_params_s'] * 1000:6.0f} ms   ratio {r['ratio']:.2f}"
        print(line)
    print(f"results: {out}")


if __name__ == "__main__":
    main()

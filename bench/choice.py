#!/usr/bin/env python3
"""The choice by speed held to real timings (issue #51, item 4): on this machine's rigs with small devices, the
placement llamafit chooses at a context against the alternatives that fit there, each timed by the real
llama-bench of the same build.

For each case (rig, model, the room its device is given with ``--margin DEV=SIZE``: its fixed buffers and a share
of what grows with the layers it holds, as the whole load on it plans them), llamafit plans the load at
``-c 4096 -np 1`` (the probe measures each device first, cached in the bench's cache); the alternatives are the
steps of each ladder that fit at that context within the margins, as a user would pin them: ``-ngl N`` from the
largest that fits down, ``--n-cpu-ffn m`` (every layer on the device) from the smallest that fits up, and for a MoE
``--n-cpu-moe k``; and each ladder's host end (``-ngl 0``, every FFN or expert layer on the host). Every
placement is timed in interleaved rounds (llama-bench ``-p 64 -n 32``, one repetition a round, the median of the
rounds): the rounds' spread is this machine's noise. The choice is held to the fastest measured generation (within
5 %: the issue's goal).

Usage: python bench/choice.py [--rigs vulkan,rpc] [--rounds 3] [--keep DIR]

Writes bench/results/choice.json and prints the table. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from speed_model import Rig, models, rig  # noqa: E402

from llamafit.errors import LlamafitError  # noqa: E402
from llamafit.options import Options  # noqa: E402
from llamafit.planning.discover import launch_env  # noqa: E402
from llamafit.planning.planner import prepare  # noqa: E402
from llamafit.planning.prepared import Prepared  # noqa: E402
from llamafit.speed.bench import bench_binary, bench_flags, run_bench  # noqa: E402

CONTEXT = ("-np", "1", "-c", "4096")
GOAL = 0.05  # the choice within this share of the fastest placement measured


@dataclass(frozen=True)
class Case:
    rig: str
    model: str
    device: str  # the device given a small room
    share: float  # of what grows with the layers it holds (weights, cache), the room it is given beside its fixed
    # buffers (compute, output, runtime overhead), as the whole load on it plans them
    label: str


CASES = [
    Case("vulkan", "dense-160m", "Vulkan0", 0.5, "dense, room for half the model"),
    Case("vulkan", "qwen3-0.6b", "Vulkan0", 0.6, "dense 0.6B, room for 60 %"),
    Case("vulkan", "moe-32x4", "Vulkan0", 0.4, "MoE, room for part of the experts"),
    Case("vulkan", "hybrid-small", "Vulkan0", 0.5, "hybrid (gated delta-net), room for half"),
    Case("rpc", "qwen3-0.6b", "RPC0", 0.5, "dense 0.6B over one RPC device, room for half"),
    Case("rpc", "moe-64x8", "RPC0", 0.4, "MoE over one RPC device, part of the experts"),
]


def plan(path: Path, r: Rig, margin: str, flags: tuple[str, ...] = ()) -> Prepared | None:
    o = Options(
        server=r.server.path,
        server_args=(*CONTEXT, *flags),
        rpc=(r.rpc[0],) if r.rpc else (),
        margin=margin,
        calibrate=False,
    )
    try:
        prep = prepare(str(path), o, tuned=False, measure=600)
    except LlamafitError:
        return None
    within = prep.plan.fits and not any("not the margins" in w for w in prep.plan.warnings)
    return prep if within else None


def alternatives(path: Path, r: Rig, margin: str, prep: Prepared) -> dict[str, Prepared]:
    """Each ladder's steps that may be fastest at the context, as pinned flags: the first two that fit of each
    (the most on the device), and its last (the most on the host: faster where the device is slower than the
    host for what moves)."""
    hp = prep.plan.model.hparams
    units = hp.n_layer_all + 1
    out: dict[str, Prepared] = {}
    ladders: list[tuple[str, list[tuple[str, ...]]]] = [
        ("-ngl", [("-ngl", str(n)) for n in range(units, -1, -1)]),
    ]
    if hp.n_expert:
        ladders.append(("--n-cpu-moe", [("-ngl", "all", "--n-cpu-moe", str(k)) for k in range(1, hp.n_layer + 1)]))
    else:
        ladders.append(("--n-cpu-ffn", [("-ngl", "all", "--n-cpu-ffn", str(m)) for m in range(1, hp.n_layer + 1)]))
    for _, steps in ladders:
        found = 0
        for flags in steps:
            p = plan(path, r, margin, flags)
            if p is not None:
                out[" ".join(flags)] = p
                found += 1
                if found == 2:
                    break
        if found and " ".join(steps[-1]) not in out and (p := plan(path, r, margin, steps[-1])) is not None:
            out[" ".join(steps[-1])] = p
    return out


def timed(prep: Prepared, path: Path, r: Rig) -> tuple[float | None, float | None]:
    bench = bench_binary(prep.argv[0])
    assert bench is not None
    res = run_bench(
        bench,
        ["-m", str(path), "-p", "64", "-n", "32", "-r", "1", *bench_flags(prep.argv[1:])],
        launch_env(r.server).env,
        900,
    )
    got = {("pp" if x.n_prompt else "tg"): x.tokens_per_s for x in res}
    return got.get("pp"), got.get("tg")


def run_case(c: Case, r: Rig, path: Path, rounds: int) -> dict[str, object]:
    probe = plan(path, r, "0", ("-ngl", "all"))  # the whole load on the device: what each part takes there
    assert probe is not None, "the model does not load on this rig at all"
    dev = next(d for d in probe.plan.devices if d.device.id == c.device)
    fixed = dev.use.compute + dev.use.output + dev.use.overhead
    room = fixed + c.share * (dev.use.total - fixed)
    margin = f"{c.device}={max(0, int(dev.usable - room)) >> 20}MiB"
    chosen = plan(path, r, margin)
    assert chosen is not None, "nothing fits the room given"
    # an alternative that is the chosen placement itself (the same llama-bench flags) is not timed twice: its two
    # medians would differ by the machine's noise alone and be read as a miss
    same = bench_flags(chosen.argv[1:])
    others = {k: p for k, p in alternatives(path, r, margin, chosen).items() if bench_flags(p.argv[1:]) != same}
    placements = {"chosen": chosen, **others}
    times: dict[str, list[tuple[float | None, float | None]]] = {k: [] for k in placements}
    for _ in range(rounds):  # interleaved: a drift of the machine touches every placement alike
        for k, p in placements.items():
            times[k].append(timed(p, path, r))
    rows = {}
    for k, p in placements.items():
        tg = [t for _, t in times[k] if t]
        pp = [x for x, _ in times[k] if x]
        sp = p.plan.speed
        rows[k] = {
            "flags": [a for a in p.argv[1:] if a not in (str(path),)],
            "tg": statistics.median(tg) if tg else None,
            "tg_spread": (max(tg) - min(tg)) / statistics.median(tg) if len(tg) > 1 else None,
            "pp": statistics.median(pp) if pp else None,
            "tg_predicted": sp.tg if sp else None,
        }
    fastest = max((k for k in rows if rows[k]["tg"]), key=lambda k: rows[k]["tg"])  # type: ignore[arg-type,return-value]
    ratio = rows["chosen"]["tg"] / rows[fastest]["tg"] if rows["chosen"]["tg"] else None  # type: ignore[operator]
    return {
        "rig": c.rig,
        "model": c.model,
        "case": c.label,
        "margin": margin,
        "chosen": " ".join(bench_flags(chosen.argv[1:])),
        "placement": chosen.plan.placement_code,
        "fastest": fastest,
        "chosen_over_fastest": ratio,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rigs", default="vulkan,rpc")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "llamafit-choice-bench")
    ap.add_argument("--report", action="store_true", help="print the tables of the last run's results, run nothing")
    a = ap.parse_args()
    if a.report:
        report(json.loads((HERE / "results" / "choice.json").read_text())["cases"])
        return
    a.keep.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LLAMAFIT_CACHE", str(a.keep / "cache"))
    paths = models(a.keep)
    from tests import factory

    small_hybrid = a.keep / "hybrid-small.gguf"
    if not small_hybrid.exists():
        factory.qwen35(name="hybrid-small", n_layer=12, n_embd=768, n_head=8, n_head_kv=2, head_dim=96, n_ff=2048,
                       d_state=64, n_group=2, dt_rank=8, n_vocab=32000, w="q8_0").write(small_hybrid)  # fmt: skip
    paths["hybrid-small"] = small_hybrid
    out = []
    for name in a.rigs.split(","):
        with rig(name) as r:
            if r is None:
                continue
            old = {k: os.environ.get(k) for k in r.env}
            os.environ.update(r.env)
            try:
                for c in (c for c in CASES if c.rig == name):
                    print(f"{c.rig:7} {c.model:12} {c.label}", file=sys.stderr)
                    t0 = time.monotonic()
                    try:
                        row = run_case(c, r, paths[c.model], a.rounds)
                    except Exception as e:  # a case that cannot run is reported, the bench goes on
                        print(f"    failed: {type(e).__name__}: {e}", file=sys.stderr)
                        continue
                    print(
                        f"    {time.monotonic() - t0:.0f} s: chosen/fastest {row['chosen_over_fastest']}",
                        file=sys.stderr,
                    )
                    out.append(row)
            finally:
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
    path = HERE / "results" / "choice.json"
    # the rigs not run this time keep their cases from the run before
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        ran = set(a.rigs.split(","))
        out = [c for c in json.loads(path.read_text())["cases"] if c["rig"] not in ran] + out
    report(out)
    with contextlib.suppress(OSError):
        path.write_text(json.dumps({"context": list(CONTEXT), "goal": GOAL, "cases": out}, indent=1) + "\n")
    print(f"\nwrote {path}")


def report(cases: list[dict[str, object]]) -> None:
    print("\n| rig | model | case | chosen | tg chosen | fastest measured | tg fastest | chosen/fastest | spread |")
    print("|---|---|---|---|---:|---|---:|---:|---:|")
    for c in cases:
        rows = c["rows"]  # type: ignore[assignment]
        ch, fa = rows["chosen"], rows[c["fastest"]]  # type: ignore[index]
        spread = max((r["tg_spread"] or 0.0) for r in rows.values())  # type: ignore[attr-defined]
        print(
            f"| {c['rig']} | {c['model']} | {c['case']} | `{c['chosen']}` | {ch['tg']:.2f} | "
            f"{'the choice' if c['fastest'] == 'chosen' else '`' + str(c['fastest']) + '`'} | {fa['tg']:.2f} | "
            f"{c['chosen_over_fastest']:.3f} | {spread:.1%} |"
        )
    ratios = [c["chosen_over_fastest"] for c in cases if c["chosen_over_fastest"]]
    if ratios:
        held = sum(1 for x in ratios if x >= 1 - GOAL)  # type: ignore[operator]
        print(f"\nthe choice within {GOAL:.0%} of the fastest measured: {held} of {len(ratios)}")
    by_class(cases)


def placement_class(flags: list[str]) -> str:
    """Where a timed placement puts the weights, as the speed development set's classes name it."""
    f = " ".join(flags)
    if "--n-cpu-moe" in f or "exps" in f:
        return "MoE expert offload"
    if "--n-cpu-ffn" in f:
        return "FFN offload"
    ngl = flags[flags.index("-ngl") + 1] if "-ngl" in flags else "0"
    if ngl == "0":
        return "all on the host"
    return "all on the device" if ngl in ("all", "99", "999") else "layer offload"


def by_class(cases: list[dict[str, object]]) -> None:
    """The predicted generation against the measured of every timed placement (the chosen one counted once), by
    where it puts the weights: the speed model's error on this machine's rigs, with its measured rates."""
    errors: dict[str, list[float]] = {}
    for c in cases:
        for name, r in c["rows"].items():  # type: ignore[attr-defined]
            if name == "chosen" or not r.get("tg") or r.get("tg_predicted") is None:
                continue
            errors.setdefault(placement_class(r["flags"]), []).append(r["tg_predicted"] / r["tg"] - 1)
    print("\n| placement | rows | tg median abs error | signed median | worst |")
    print("|---|---:|---:|---:|---:|")
    for k, e in sorted(errors.items()):
        worst = max(e, key=abs)
        print(f"| {k} | {len(e)} | {statistics.median(map(abs, e)):.1%} | {statistics.median(e):+.1%} | {worst:+.1%} |")


if __name__ == "__main__":
    main()

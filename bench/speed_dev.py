#!/usr/bin/env python3
"""The speed model on hardware it has never measured: the public llama.cpp measurements of
``bench/data/speed_dev.json`` (each row cited), planned on the row's cards described with ``--gpu``.

Each row names its cards (``--gpu`` specs: a card of ``llamafit.devices.cards``, ``SIZE@card`` for Apple's), a
model shape (``MODELS``: the published config's dimensions, the quant's tensor types as ``llama-quantize
--dry-run`` of this build gives them, no weights) and the tg and pp it measured. llamafit plans the row as
llama-bench ran it (every layer offloaded, its default split by memory, ``-ub 512``, flash attention off,
``-c`` of prompt and generation) with no measurement of this machine, and its tg at depth 0 and pp512 are
lined up with the row's. Also scored: the one-line rule ``0.55 x bandwidth / bytes per token`` (the
weights a token reads, split cards summing their bandwidths as llama.cpp's layer split does not), and
whether the plan's range (``speed.tg_range``/``pp_range``) holds the measurement.

Usage: python bench/speed_dev.py [--keep DIR] [--out FILE] [--fit]

Writes bench/results/speed_dev.json and prints each row and the per-category medians. ``--fit`` derives the
priors of ``llamafit/speed/priors.py`` instead: per backend, one least-squares fit of the relative error over
all its rows (streaming shares, per-node and per-split costs for tg; matmul shares for pp), and scores it
leaving each card out (the fit without that card's rows predicting them): the error to expect on a card
that is not in the set. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import shapes  # noqa: E402

from llamafit.devices import cards  # noqa: E402
from llamafit.devices.rates import parse_rate  # noqa: E402
from llamafit.options import Options  # noqa: E402
from llamafit.planning.planner import prepare  # noqa: E402
from llamafit.planning.prepared import Prepared  # noqa: E402
from llamafit.server.binary import find_server  # noqa: E402
from tests import factory  # noqa: E402
from tests.quantmix import quantize_types, quantized  # noqa: E402

DATA = HERE / "data" / "speed_dev.json"
RULE = 0.55  # the one-line rule's share of peak bandwidth
# no kernel streams memory faster than a device copy does: NVIDIA's and AMD's cards copy at 90-93 % of the
# datasheet bandwidth (CUDA samples' bandwidthTest, rocm-bandwidth-test); Apple's reach about as much
STREAM_CAP = 0.92


def _dense(
    name: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int, tied: bool = False
) -> Callable[[], factory.Shape]:
    return lambda: factory.dense(arch="llama", name=name, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                                 n_head_kv=n_head_kv, n_ff=n_ff, n_vocab=n_vocab, ctx=8192, w="bf16",
                                 tied=tied)  # fmt: skip


# the published config.json dimensions of each model the rows ran (meta-llama's repos)
SHAPES: dict[str, Callable[[], factory.Shape]] = {
    "llama3-8b": _dense("Meta-Llama-3-8B", 32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": _dense("Meta-Llama-3-70B", 80, 8192, 64, 8, 28672, 128256),
    "llama2-7b": _dense("Llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
    "llama2-13b": _dense("Llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
    "llama2-70b": _dense("Llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
}
SHAPES["tinyllama-1.1b"] = _dense("TinyLlama-1.1B", 22, 2048, 32, 4, 5632, 32000)
SHAPES["llama3.2-3b"] = _dense("Llama-3.2-3B", 28, 3072, 24, 8, 8192, 128256, tied=True)
# Qwen's and Google's published config.json dimensions
SHAPES["qwen3-14b"] = lambda: factory.dense(arch="qwen3", name="Qwen3-14B", n_layer=40, n_embd=5120, n_head=40,
                                            n_head_kv=8, head_dim=128, n_ff=17408, n_vocab=151936, ctx=8192,
                                            w="bf16")  # fmt: skip
SHAPES["gemma3-12b"] = lambda: factory.gemma3(name="gemma-3-12b", n_layer=48, n_embd=3840, n_head=16, n_head_kv=8,
                                              head_dim=256, n_ff=15360, n_vocab=262208, ctx=8192,
                                              sliding_window=1024, w="bf16")  # fmt: skip
SHAPES["qwen3-30b-a3b"] = shapes.qwen3_30b_a3b
# Qwen/Qwen3-Next-80B-A3B's config.json: 48 layers (gated delta-net, full attention every 4th), the dimensions of
# bench/shapes.py's 12-layer cut
SHAPES["qwen3-next-80b-a3b"] = lambda: factory.qwen3next(name="Qwen3-Next-80B-A3B", n_layer=48, n_embd=2048,
                                                         n_head=16, n_head_kv=2, head_dim=256, d_state=128,
                                                         n_group=16, dt_rank=32, n_expert=512, n_expert_used=10,
                                                         n_ff_exp=512, n_ff_shexp=512, n_vocab=151936, ctx=262144,
                                                         w="bf16")  # fmt: skip
# mistralai/Mistral-Small-24B-Instruct-2501's config.json (head_dim 128, not n_embd / n_head)
SHAPES["mistral-small-24b"] = lambda: factory.dense(arch="llama", name="Mistral-Small-24B", n_layer=40, n_embd=5120,
                                                    n_head=32, n_head_kv=8, head_dim=128, n_ff=32768,
                                                    n_vocab=131072, ctx=8192, w="bf16")  # fmt: skip
# Qwen/Qwen2.5-14B's config.json (qwen2: q/k/v biases beside, not counted)
SHAPES["qwen2.5-14b"] = lambda: factory.dense(arch="llama", name="Qwen2.5-14B", n_layer=48, n_embd=5120, n_head=40,
                                              n_head_kv=8, n_ff=13824, n_vocab=152064, ctx=32768, w="bf16")  # fmt: skip
# microsoft/phi-4's config.json (phi3: its fused QKV and gate-up hold the weights separate ones would; head_dim 128)
SHAPES["phi-4"] = lambda: factory.dense(arch="llama", name="phi-4", n_layer=40, n_embd=5120, n_head=40, n_head_kv=10,
                                        n_ff=17920, n_vocab=100352, ctx=16384, w="bf16")  # fmt: skip
# deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct's config.json (V2-Lite: 27 layers, no q LoRA, MLA kv_lora 512 with rope
# 64 and nope/v 128, 64 experts of 1408 with 6 used and 2 shared, the first layer dense 10944)
SHAPES["deepseek-coder-v2-lite"] = lambda: factory.deepseek2(name="DeepSeek-Coder-V2-Lite", n_layer=27, n_embd=2048,
                                                             n_head=16, kv_lora_rank=512, rope_dim=64, nope_dim=128,
                                                             v_dim=128, n_dense_lead=1, q_lora_rank=0, n_ff=10944,
                                                             n_expert=64, n_expert_used=6, n_ff_exp=1408, n_shared=2,
                                                             n_vocab=102400, ctx=163840, w="bf16")  # fmt: skip
# Qwen/Qwen3.5-35B-A3B's config.json, as bench/shapes.py's (its MTP layer included, as the published GGUFs carry it)
SHAPES["qwen3.5-35b-a3b"] = lambda: factory.qwen35(name="Qwen3.5-35B-A3B", n_layer=40, n_nextn=1, n_embd=2048,
                                                   n_head=16, n_head_kv=2, head_dim=256, d_state=128, n_group=16,
                                                   dt_rank=32, n_expert=256, n_expert_used=8, n_ff_exp=512,
                                                   n_ff_shexp=512, n_vocab=248320, ctx=262144,
                                                   w="bf16")  # fmt: skip
QUANTS = {"q4_k_m": "Q4_K_M", "q4_0": "Q4_0", "f16": "F16", "q8_0": "Q8_0"}
# models whose published GGUF is not a llama-quantize mix of one type: written with their own types
DIRECT: dict[str, Callable[[], factory.Shape]] = {
    "gpt-oss-20b-f16": lambda: factory.gpt_oss_20b(w="f16"),  # ggml-org's: MXFP4 experts, the rest F16
    "gpt-oss-120b-f16": lambda: factory.gpt_oss_120b(w="f16"),  # ggml-org's, as above
}


def model_file(key: str, d: Path) -> Path:
    """``llama3-8b-q4_k_m`` -> a sparse GGUF of that shape with llama-quantize's type mix."""
    base, _, quant = key.rpartition("-")
    if base.endswith("-q4_k"):  # q4_k_m
        base, quant = base[: -len("-q4_k")], "q4_k_" + quant
    path = d / f"{key}.gguf"
    if path.exists():
        return path
    if key in DIRECT:
        return DIRECT[key]().write(path)
    shape = SHAPES[base]()
    bf16 = d / f"{base}-bf16.gguf"
    if not bf16.exists():
        shape.write(bf16)
    types = quantize_types(find_server(), bf16, QUANTS[quant])
    quantized(shape, types).write(path)
    return path


def plan_row(row: dict[str, Any], path: Path) -> Prepared:
    """The row as it ran: its cards (none: CPU only) with every layer offloaded unless its ``args`` place them
    (``-ngl N``, ``--n-cpu-moe N``), its host where the row describes it (the threads llama-bench ran)."""
    depth = int(row.get("depth", 0))
    gpus = tuple(row.get("gpus", ()))
    args = ["-c", str(int(row.get("ctx", depth + 1024))), "-np", "1", "-fa", row.get("fa", "off"), "-ub", "512",
            "-b", "2048", *row.get("args", ["-ngl", "999"] if gpus else [])]  # fmt: skip
    table = [cards.lookup(s.partition("@")[2] or s) for s in gpus]
    if len(table) > 1:
        args += ["-ts", ",".join(str(round((c.memory if c and c.memory else 1) / 2**30)) for c in table)]
    host = row.get("host")
    margin = "0" if "args" in row else Options().margin  # a placement the row chose ran: it fit its card
    if host is None:
        o = Options(gpu=gpus, server_args=tuple(args), host_ram="256GiB", margin=margin)
    else:
        o = Options(gpu=gpus, cpu_only=not gpus, server_args=(*args, "-t", str(host["cores"])), margin=margin,
                    host_bandwidth=host["bandwidth"], host_cores=host["cores"], host_ram=host["ram"])  # fmt: skip
    return prepare(str(path), o, measure=0, tuned=False)


def speed_at(prep: Prepared, depth: int, prompt: int) -> Any:
    """The plan's speed for the row's prompt at the row's depth, with the ranges."""
    from llamafit.fit.speed import plan_speed

    assert prep.measured is not None
    return plan_speed(prep.plan, prep.measured.rates, depth=depth, prompt=prompt, full_context=False)


def rule_tg(prep: Prepared, host_bandwidth: float | None = None) -> float | None:
    """0.55 x the cards' bandwidth over the weight bytes a token reads (layer split: each card its share; the
    host's share over ``host_bandwidth``)."""
    sp = prep.plan.speed
    if sp is None:
        return None
    secs = 0.0
    for d in sp.devices:
        g = next((x for x in prep.plan.devices if x.device.id == d.device), None)
        bw = host_bandwidth if d.device == "CPU" else g.device.bandwidth if g is not None else None
        if not bw:
            continue
        secs += d.bytes_per_token / (RULE * bw)
    return 1 / secs if secs else None


def err(p: float | None, m: float | None) -> float | None:
    return None if p is None or not m else (p - m) / m


def backend_of(prep: Prepared) -> str:
    return prep.plan.devices[0].device.id.rstrip("0123456789") if prep.plan.devices else "CPU"


def components(prep: Prepared, depth: int = 0, prompt: int = 512) -> dict[str, Any]:
    """What the speed model divides by the rates, summed over the plan's devices: seconds at peak bandwidth
    of quantized and float bytes (one token), nodes and splits; seconds at peak FP16 of quantized and float
    FLOPs (the prompt's ubatch, attention counted as float)."""
    from llamafit.memory.graph.replay import nodes_per_layer
    from llamafit.speed import tiles
    from llamafit.speed.priors import FLOAT_TYPES
    from llamafit.speed.work import Load, evaluate

    plan = prep.plan
    fp = plan.footprint
    devs = {d.device.id: d.device for d in plan.devices}
    npl = nodes_per_layer(plan.model, fp.flash_attn, fp.context)

    load = Load(plan.model, fp.placement, fp.context, fp.flash_attn, tuple(devs), npl)

    def ev(tokens: int, at: int) -> Any:
        return evaluate(load, tokens=tokens, depth=at)

    out = {"bq": 0.0, "bf": 0.0, "nodes": 0.0, "splits": 0.0, "fq": 0.0, "ff": 0.0, "pp_nodes": 0.0}
    tg = ev(1, depth)
    ub = fp.context.n_ubatch
    for start in range(0, prompt, ub):
        pp = ev(min(ub, prompt - start), depth + start)
        for dev, w in pp.devices.items():
            g = devs.get(dev)
            if g is None or not g.fp16:
                continue
            moe_tiles = tiles.family_for(dev.rstrip("0123456789"), cards.key(g.name))
            for ty, f in w.matmul_flops(pp.tokens, pp.routing, moe_tiles).items():
                out["ff" if ty in FLOAT_TYPES else "fq"] += f / g.fp16
            out["ff"] += w.attn_flops / g.fp16
            out["pp_nodes"] += w.nodes
    for dev, w in tg.devices.items():
        g = devs.get(dev)
        if g is None:
            continue
        bw = g.bandwidth or 1.0
        for ty, n in w.weight_bytes.items():
            out["bf" if ty in FLOAT_TYPES else "bq"] += n / bw
        out["bf"] += (w.kv_bytes + w.state_bytes) / bw
        out["nodes"] += w.nodes
    out["splits"] = float(sum(s.syncs for s in tg.splits))
    out["pp_splits"] = out["splits"] * -(-prompt // ub)
    return out


def _old(r: dict[str, Any]) -> bool:
    """A row from a build whose graph or kernel launches today's do not match: a CUDA build of 2023-2024, before
    CUDA graphs (its kernels launched one by one) or with their first implementation (``build_year`` 2024), whose
    per-kernel cost was twice what builds since 2025 show; or a gated delta-net hybrid run before ggml's fused
    GATED_DELTA_NET op (``unfused``: llama.cpp PR #19504, February 2026; before it, Qwen3-Next-80B's decode graph
    was 6242 nodes a token)."""
    cuda = r["backend"] == "CUDA" and (r.get("cuda_graphs") is False or r.get("build_year", 2025) < 2025)
    return cuda or bool(r.get("unfused"))


# a backend with fewer tg rows (Metal has 10) borrows CUDA's split cost and float/quantized proportions, and fits
# its own quantized streaming share, node cost and one matmul share
MIN_ROWS = 10


def fit_rows(rows: list[dict[str, Any]], base: dict[str, float] | None = None) -> dict[str, float]:
    """Least squares of the relative error, coefficients held non-negative and the streaming shares at most
    STREAM_CAP: tg time = bq/stream_quant + bf/stream_float + nodes x node (node_no_graphs on CUDA builds
    before CUDA graphs) + splits x split; pp time = fq/matmul_quant + ff/matmul_float + the fixed costs."""
    import numpy as np

    def nnls(a: Any, b: Any, floor: dict[int, float] | None = None, held: dict[int, float] | None = None) -> Any:
        """Least squares with x >= 0, x[k] >= floor[k] (a share of a peak is at most STREAM_CAP: the
        coefficient, its inverse, at least 1 / STREAM_CAP) and x[k] = held[k]."""
        fixed: dict[int, float] = dict(held or {})
        while True:
            free = [k for k in range(a.shape[1]) if k not in fixed]
            rhs = b - sum((a[:, k] * v for k, v in fixed.items()), np.zeros(len(b)))
            x = np.zeros(a.shape[1])
            if free:
                sol, *_ = np.linalg.lstsq(a[:, free], rhs, rcond=None)
                x[free] = sol
            for k, v in fixed.items():
                x[k] = v
            low = {k: (floor or {}).get(k, 0.0) for k in free if x[k] < (floor or {}).get(k, 0.0)}
            if not low:
                return x
            fixed.update(low)

    tg = [r for r in rows if r["tg"]]
    split = split_cost(tg)
    a = np.array([[r["c"]["bq"], r["c"]["bf"], 0.0 if _old(r) else r["c"]["nodes"], r["c"]["nodes"] if _old(r) else 0.0,
                   r["c"]["splits"]] for r in tg])  # fmt: skip
    t = np.array([1.0 / r["tg"] for r in tg])
    # a backend with few rows: CUDA's float/quantized proportion, its own quantized share and node; the split cost
    # its own rows over several card counts give, else CUDA's
    held = {4: split if split is not None else base["split"]} if base else {}
    if split is not None and not base:
        held[4] = split
    x = nnls(a / t[:, None], np.ones(len(tg)), {0: 1 / STREAM_CAP, 1: 1 / STREAM_CAP}, held)
    stream_quant = 1 / x[0] if x[0] > 0 else STREAM_CAP
    stream_float = 1 / x[1] if x[1] > 0 else STREAM_CAP
    if base:
        stream_float = min(STREAM_CAP, stream_quant * base["stream_float"] / base["stream_quant"])
    out = {
        "stream_quant": stream_quant,
        "stream_float": stream_float,
        "node": float(x[2]),
        "node_no_graphs": float(x[3]) if any(_old(r) for r in tg) else float(x[2]),
        "split": float(x[4]),
    }
    pp = [r for r in rows if r.get("pp") and (r["c"]["fq"] or r["c"]["ff"])]
    if pp:
        fixed = np.array([_fixed(out, r, r["c"]["pp_nodes"], r["c"]["pp_splits"]) for r in pp])
        t = np.array([r["prompt"] / r["pp"] for r in pp]) - fixed
        if base:  # one share for both, in CUDA's proportion
            k = base["matmul_quant"] / base["matmul_float"]
            a = np.array([[r["c"]["fq"] + r["c"]["ff"] * k] for r in pp])
            y = nnls(a / t[:, None], np.ones(len(pp)))
            out["matmul_quant"] = 1 / y[0] if y[0] > 0 else 0.0
            out["matmul_float"] = out["matmul_quant"] / k
        else:
            a = np.array([[r["c"]["fq"], r["c"]["ff"]] for r in pp])
            y = nnls(a / t[:, None], np.ones(len(pp)))
            out["matmul_quant"] = 1 / y[0] if y[0] > 0 else 0.0
            out["matmul_float"] = 1 / y[1] if y[1] > 0 else out["matmul_quant"]
    return out


def split_cost(rows: list[dict[str, Any]]) -> float | None:
    """Seconds a graph split adds, from rows that ran one model on one card type split over different numbers
    of them (the same build and bench): the pooled slope of the time a token takes over its splits, each group
    against its own mean. None where no group has two card counts."""
    groups: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("depth"):
            continue
        key = (r["model"], r["gpus"][0], r["source"].split(" ")[0])  # the same model and card in one publication
        groups.setdefault(key, []).append((r["c"]["splits"], 1.0 / r["tg"]))
    num = den = 0.0
    for pts in groups.values():
        if len({x for x, _ in pts}) < 2:
            continue
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        num += sum((x - mx) * (y - my) for x, y in pts)
        den += sum((x - mx) ** 2 for x, _ in pts)
    return max(0.0, num / den) if den else None


def _fixed(p: dict[str, float], r: dict[str, Any], nodes: float, splits: float) -> float:
    return nodes * (p["node_no_graphs"] if _old(r) else p["node"]) + splits * p["split"]


def predict_with(p: dict[str, float], r: dict[str, Any]) -> tuple[float, float | None]:
    c = r["c"]
    tg = c["bq"] / p["stream_quant"] + c["bf"] / p["stream_float"] + _fixed(p, r, c["nodes"], c["splits"])
    pp = None
    if p.get("matmul_quant") and (c["fq"] or c["ff"]):
        t = c["fq"] / p["matmul_quant"] + c["ff"] / p["matmul_float"] + _fixed(p, r, c["pp_nodes"], c["pp_splits"])
        pp = r["prompt"] / t
    return 1 / tg, pp


def fit(data: dict[str, Any], keep: Path) -> None:
    """Per backend: the fit over all its rows, then each card left out."""
    rows = []
    for row in data["rows"]:
        if "host" in row:  # the host's priors are the cores' arithmetic (speed/priors.py), not fitted here
            continue
        prep = plan_row(row, model_file(row["model"], keep))
        prompt = int(row.get("prompt", 512))
        c = components(prep, int(row.get("depth", 0)), prompt)
        rows.append({**row, "prompt": prompt, "backend": backend_of(prep), "c": c})
    cuda = fit_rows([r for r in rows if r["backend"] == "CUDA"])
    for be in sorted({r["backend"] for r in rows}):
        sel = [r for r in rows if r["backend"] == be]
        if sum(1 for r in sel if r["tg"]) < 2:  # one row fits nothing: its backend keeps the prior it borrows
            print(f"{be}: {len(sel)} row(s): too few to fit, scored only")
            continue
        base = cuda if be != "CUDA" and sum(1 for r in sel if r["tg"]) < MIN_ROWS else None
        p = fit_rows(sel, base)
        print(f"{be}: {len(sel)} rows: " + ", ".join(f"{k} {v:.3g}" for k, v in p.items()))
        loco_tg, loco_pp, ratios_tg, ratios_pp = [], [], [], []
        for card in sorted({"+".join(r["gpus"]) for r in sel}):
            train = [r for r in sel if "+".join(r["gpus"]) != card]
            if not train:
                continue
            q = fit_rows(train, base)
            for r in sel:
                if "+".join(r["gpus"]) == card:
                    tg, pp = predict_with(q, r)
                    if r["tg"]:
                        loco_tg.append(abs(tg / r["tg"] - 1))
                        ratios_tg.append(r["tg"] / tg)
                    if pp and r.get("pp"):
                        loco_pp.append(abs(pp / r["pp"] - 1))
                        ratios_pp.append(r["pp"] / pp)
        if loco_tg:
            print(f"  leaving each card out: tg median {statistics.median(loco_tg):.1%}, worst {max(loco_tg):.1%}; "
                  f"measured/predicted 10-90 %: {_q(ratios_tg)}")  # fmt: skip
        if loco_pp:
            print(f"  pp median {statistics.median(loco_pp):.1%}, worst {max(loco_pp):.1%}; "
                  f"measured/predicted 10-90 %: {_q(ratios_pp)}")  # fmt: skip


def _q(xs: list[float]) -> str:
    s = sorted(xs)
    return f"{s[int(0.1 * (len(s) - 1))]:.2f}-{s[round(0.9 * (len(s) - 1))]:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "llamafit-speed-dev")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "speed_dev.json")
    ap.add_argument("--fit", action="store_true", help="derive the priors from the set instead of scoring them")
    a = ap.parse_args()
    a.keep.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LLAMAFIT_CACHE", str(a.keep / "cache"))
    data = json.loads(DATA.read_text())
    if a.fit:
        fit(data, a.keep)
        return
    rows = []
    for row in data["rows"]:
        path = model_file(row["model"], a.keep)
        t0 = time.monotonic()
        prep = plan_row(row, path)
        sp = speed_at(prep, int(row.get("depth", 0)), int(row.get("prompt", 512)))
        host_bw = parse_rate(row["host"]["bandwidth"], "host") if "host" in row else None
        out = {
            "category": row["category"],
            "gpus": row.get("gpus", ["CPU"]),
            "model": row["model"],
            "plan_s": round(time.monotonic() - t0, 2),
            "cuda_graphs": row.get("cuda_graphs"),
            "backend": backend_of(prep),
            "old_build": _old({**row, "backend": backend_of(prep)}),
            "tg": {"measured": row["tg"], "predicted": sp.tg, "rule": rule_tg(prep, host_bw), "range": sp.tg_range},
            "pp": {"measured": row.get("pp"), "predicted": sp.pp, "range": sp.pp_range},
        }
        rows.append(out)
        rule = out["tg"]["rule"]
        print(
            f"{row['category']:<24} {'+'.join(out['gpus']):<34} {row['model']:<18} "
            f"tg {_f(row['tg'])} pred {_f(sp.tg)} ({_pct(err(sp.tg, row['tg']))}) rule {_pct(err(rule, row['tg']))}"
            f"  pp {_f(row.get('pp'))} pred {_f(sp.pp)} ({_pct(err(sp.pp, row.get('pp')))})",
            flush=True,
        )
    summary = summarize(rows)
    for line in summary["lines"]:
        print(line)
    a.out.write_text(
        json.dumps({"rows": rows, "summary": summary["table"], "backends": summary["backends"]}, indent=1) + "\n"
    )


def _f(x: float | None) -> str:
    return "      -" if x is None else f"{x:7.1f}"


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{x * 100:+5.0f}%"


def _inside(v: float | None, r: tuple[float, float] | list[float] | None) -> bool | None:
    return None if v is None or r is None else r[0] <= v <= r[1]


# the rows by build: CUDA builds of 2023-2024 (before CUDA graphs, or their first implementation) paid a per-kernel
# cost the priors, made for today's builds, do not charge
OLD, NEW = "older builds", "today's builds"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The error per category, over all rows and by build, and over today's builds alone; then per backend (the
    plan's first device's: CPU where every layer is on the host), over today's builds and over all."""
    cats = [*sorted({r["category"] for r in rows}), "all", OLD, NEW]
    out = _table("category", cats, rows, lambda c, r: c in ("all", r["category"], OLD if r.get("old_build") else NEW))
    # the same over today's builds alone: the older rows are planned at today's kernel costs and weigh on some
    # classes (dense models fully on a card above all), which a plan for today's build does not pay
    now = _table(
        "category (today's builds)",
        cats[: cats.index("all") + 1],
        rows,
        lambda c, r: not r.get("old_build") and c in ("all", r["category"]),
    )
    backends = sorted({r.get("backend", "") for r in rows})
    by = _table(
        "backend (today's builds)",
        backends,
        rows,
        lambda b, r: r.get("backend") == b and not r.get("old_build"),
    )
    everyone = _table("backend (all builds)", backends, rows, lambda b, r: r.get("backend") == b)
    return {
        "table": out["table"],
        "categories_today": now["table"],
        "backends": {"today": by["table"], "all": everyone["table"]},
        "lines": [*out["lines"], "", *now["lines"], "", *by["lines"], "", *everyone["lines"]],
    }


def _table(
    title: str, keys: list[str], rows: list[dict[str, Any]], member: Callable[[str, dict[str, Any]], bool]
) -> dict[str, Any]:
    table: dict[str, Any] = {}
    lines = [f"{title:<24} {'rows':>4} {'tg median':>10} {'tg worst':>9} {'rule':>7} {'pp median':>10} "
             f"{'in range':>9}"]  # fmt: skip
    for c in keys:
        sel = [r for r in rows if member(c, r)]
        if not sel:
            continue
        tg = [abs(e) for r in sel if (e := err(r["tg"]["predicted"], r["tg"]["measured"])) is not None]
        rule = [abs(e) for r in sel if (e := err(r["tg"]["rule"], r["tg"]["measured"])) is not None]
        pp = [abs(e) for r in sel if (e := err(r["pp"]["predicted"], r["pp"]["measured"])) is not None]
        inside = [x for r in sel for k in ("tg", "pp") if (x := _inside(r[k]["measured"], r[k]["range"])) is not None]
        entry = {
            "rows": len(sel),
            "tg_median": _med(tg),
            "tg_worst": max(tg) if tg else None,
            "rule_median": _med(rule),
            "pp_median": _med(pp),
            "pp_rows": len(pp),
            "in_range": sum(inside) / len(inside) if inside else None,
        }
        table[c] = entry
        lines.append(f"{c:<24} {len(sel):>4} {_pct(entry['tg_median']):>10} {_pct(entry['tg_worst']):>9} "
                     f"{_pct(entry['rule_median']):>7} {_pct(entry['pp_median']):>10} "
                     f"{_pct(entry['in_range']):>9}")  # fmt: skip
    return {"table": table, "lines": lines}


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


if __name__ == "__main__":
    main()

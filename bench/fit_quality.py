#!/usr/bin/env python3
"""How good the chosen context is: llamafit's pick against the largest context that really fits.

For each model and memory budget, llamafit plans with the budget (``--margin`` takes the rest of the
device away), and the real llama-server is loaded at growing contexts (binary search on multiples of
256) to find the largest one whose logged buffers on that device stay within the same budget. The
ratio pick / largest should be close to 1 and must never exceed it (that would be an OOM).

Three devices are measured: host RAM (a CPU-only load); when ``ggml-rpc-server`` is beside the
server, one RPC device (the offload path a GPU takes: device buffers, host-side inputs); and with
``--vulkan-server`` (or ``LLAMAFIT_VULKAN_SERVER``), one Vulkan device on Mesa's software driver
(``GGML_VK_VISIBLE_DEVICES=0``; tools/build_vulkan_server.sh builds that server).

Usage: python bench/fit_quality.py [--server PATH] [--vulkan-server PATH]. Writes bench/results/fit_quality.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import shapes  # noqa: E402

from llamafit.memory import backends  # noqa: E402
from llamafit.memory.placement import CPU  # noqa: E402
from llamafit.options import Options  # noqa: E402
from llamafit.planning.planner import prepare  # noqa: E402
from llamafit.planning.prepared import Prepared  # noqa: E402
from llamafit.server.binary import ServerBinary, find_server  # noqa: E402
from llamafit.server.logparse import LoadLog  # noqa: E402
from llamafit.units import MiB  # noqa: E402
from tests import factory  # noqa: E402
from tests.realserver import rpc_servers, run_argv  # noqa: E402

STEP = 256


def gemma3_270m() -> factory.Shape:
    """google/gemma-3-270m: 18 layers, 640 embd, 4 heads, 1 KV head of 256, 2048 FFN, SWA 512, 262144 vocab."""
    return factory.gemma3(name="Gemma-3-270M (shape)", n_layer=18, n_embd=640, n_head=4, n_head_kv=1, head_dim=256,
                          n_ff=2048, n_vocab=262144, ctx=32768, sliding_window=512, w="q8_0")  # fmt: skip


def logged_on(log: LoadLog, device: str, aliases: dict[str, str]) -> float:
    """MiB the server logged on ``device`` ("host" = every host buffer) for the target context."""
    total = 0.0

    def on(buft: str) -> bool:
        name = aliases.get(buft, buft)
        return (not backends.is_device_buffer(name)) if device == "host" else name == device

    m = log.model("target")
    ctx = log.context("target")
    for buft, mib in m.buffers if m else []:
        total += mib if on(buft) else 0
    if ctx:
        for buft, mib in [*ctx.kv, *ctx.rs, *ctx.output, *ctx.compute.items()]:
            total += mib if on(buft) else 0
    return total


def options(dev: str, srv: ServerBinary, rpc: str | None, extra: list[str], margin: str = "1024") -> Options:
    return Options(server_args=extra, margin=margin, cpu_only=dev == "host", server=srv.path, calibrate=False,
                   spec="off", rpc=[rpc] if dev == "rpc" and rpc else [])  # fmt: skip


def plan(
    model: Path, srv: ServerBinary, margin_mib: int, dev: str, rpc: str | None, extra: list[str]
) -> tuple[int, int, dict[str, str]]:
    """(context, the budget its logged buffers must fit, buffer aliases). The budget on the measured
    device (RPC0, Vulkan0, or host RAM for a CPU-only plan) less the runtime overhead the plan keeps
    there, which no buffer line reports."""
    margin = {"host": str(margin_mib), "rpc": f"RPC0={margin_mib}", "vulkan": f"Vulkan0={margin_mib}"}[dev]
    p = prepare(str(model), options(dev, srv, rpc, extra, margin))
    usable = p.plan.host.usable if dev == "host" else p.plan.devices[0].usable - p.plan.devices[0].use.overhead
    PLACEMENT[model, dev] = placement_of(p.argv)
    return p.plan.n_ctx, usable, p.plan.buffer_aliases


PLACEMENT: dict[tuple[Path, str], list[str]] = {}


def placement_of(argv: list[str]) -> list[str]:
    """The plan's placement flags: the largest context is searched with the layers where the plan puts
    them (a partial offload and an all-GPU load are not the same budget)."""
    out: list[str] = []
    for flag in ("-ngl", "-ts", "--n-cpu-moe", "-ot"):
        if flag in argv:
            out += [flag, argv[argv.index(flag) + 1]]
    return out


def largest_that_fits(model: Path, srv: ServerBinary, budget: int, hi: int, dev: str, rpc: str | None,
                      extra: list[str], aliases: dict[str, str]) -> tuple[int, int]:  # fmt: skip
    """Binary search over real loads; returns (context, loads)."""
    device = {"host": "host", "rpc": "RPC0", "vulkan": "Vulkan0"}[dev]
    planned = PLACEMENT.get((model, dev)) or ["-ngl", "all"]
    place = {"host": ["-dev", "none"], "rpc": ["--rpc", rpc or "", *planned], "vulkan": planned}[dev]
    base = ["-m", str(model), "-fit", "off", *extra, *place]
    lo_ok, hi_bad, loads = 0, hi + STEP, 0
    while hi_bad - lo_ok > STEP:
        mid = (lo_ok + hi_bad) // 2 // STEP * STEP
        mid = max(mid, STEP)
        log = run_argv(srv, [*base, "-c", str(mid)], timeout=600)
        loads += 1
        if logged_on(log, device, aliases) * MiB <= budget:
            lo_ok = mid
        else:
            hi_bad = mid
    return lo_ok, loads


# Packing against llama.cpp's own fit (issue #14 part 3): model, budgets per RPC device (MiB), settings
PACKING = [
    ("Llama-3.1-8B Q4_K (dense, partial offload)", factory.llama31_8b, (2048, 1536)),
    ("Gemma-3-4B Q4_K (sliding window)", factory.gemma3_4b, (1536, 1024)),
    ("Qwen3-30B-A3B Q4_K (MoE)", shapes.qwen3_30b_a3b, (4096, 4096)),
    ("GLM-4.5-Air layers Q4_K (MoE, NextN)", shapes.glm45_air_cut, (3072, 2048)),
]
PACKING_ARGS = ["-c", "8192", "-np", "1", "--no-repack"]  # Q4_K repacked into RAM would count twice


def host_weights(p: Prepared) -> float:
    """GiB of weight tensors the load keeps in host memory (llamafit's placement of that argv, exact to
    the server's buffers; the logged CPU_Mapped size is the mapped file range, which spans device
    tensors lying between host ones)."""
    return sum(t.tensor.info.nbytes for t in p.plan.footprint.placement.tensors if t.device == CPU) / 2**30


def packing(srv: ServerBinary, d: Path) -> list[dict[str, object]]:
    """Weights left in host memory by llamafit's plan and by ``llama-fit-params`` (really fitting) over
    the same two RPC devices with the same budgets (each device's free memory less a margin: ``--margin``
    and ``-fitt``). Both answers are loaded by the real server: the weights in host buffers and each
    device's buffers are read from its log, the device buffers held to the budgets."""
    fitp = Path(srv.path).with_name("llama-fit-params")
    if not fitp.exists() or not Path(srv.path).with_name("ggml-rpc-server").exists():
        return []
    rows: list[dict[str, object]] = []
    with rpc_servers(srv, 2) as endpoints:
        rpc = ",".join(endpoints)
        for name, make, budgets in PACKING:
            path = d / f"pack-{len(rows)}.gguf"
            make().write(path)
            probe = prepare(str(path), Options(server_args=PACKING_ARGS, server=srv.path, calibrate=False, spec="off",
                                               rpc=[rpc], margin="0"))  # fmt: skip
            free = [dev.usable // MiB for dev in probe.plan.devices]
            margins = [f - b for f, b in zip(free, budgets, strict=True)]
            margin = ",".join(f"RPC{i}={m}" for i, m in enumerate(margins))
            ours = prepare(str(path), Options(server_args=PACKING_ARGS, server=srv.path, calibrate=False,
                                              spec="off", rpc=[rpc], margin=margin))  # fmt: skip
            r = subprocess.run([str(fitp), "-m", str(path), "--rpc", rpc, *PACKING_ARGS, "-fitt",
                                ",".join(str(m) for m in margins)], capture_output=True, text=True, env=srv.env(),
                               timeout=600)  # fmt: skip
            fitted = shlex.split(r.stdout)  # it quotes -ot patterns for a shell
            aliases = ours.plan.buffer_aliases
            result: dict[str, object] = {"model": name, "budgets_mib": list(budgets), "llamafit_argv": ours.argv[1:],
                                         "fit_params_args": fitted}  # fmt: skip
            their_args = ["-np", "1", "--no-repack", *fitted, "-fit", "off"]
            theirs = prepare(str(path), Options(server_args=their_args, server=srv.path, calibrate=False, spec="off",
                                                rpc=[rpc], margin="0"))  # fmt: skip
            for who, prep in (("llamafit", ours), ("fit_params", theirs)):
                log = run_argv(srv, prep.argv[1:], timeout=600)
                on_dev = [logged_on(log, f"RPC{i}", aliases) for i in range(len(budgets))]
                result[f"{who}_host_weights_gib"] = round(host_weights(prep), 2)
                result[f"{who}_device_mib"] = [round(x, 1) for x in on_dev]
                result[f"{who}_within_budgets"] = all(x <= b for x, b in zip(on_dev, budgets, strict=True))
            rows.append(result)
            print(f"{name:42} budgets {budgets}  host weights: llamafit {result['llamafit_host_weights_gib']:6.2f} GiB"
                  f" (within budgets: {result['llamafit_within_budgets']})  llama-fit-params "
                  f"{result['fit_params_host_weights_gib']:6.2f} GiB (within: {result['fit_params_within_budgets']})",
                  flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server")
    ap.add_argument("--vulkan-server", default=os.environ.get("LLAMAFIT_VULKAN_SERVER"))
    a = ap.parse_args()
    srv = find_server(a.server)
    vk = ServerBinary(a.vulkan_server, "--server", str(Path(a.vulkan_server).parent)) if a.vulkan_server else None
    d = Path(tempfile.mkdtemp(prefix="llamafit-fitq-"))
    models = {
        "Qwen3-0.6B": (factory.qwen3_0_6b().write(d / "q06.gguf"), 40960, ["-np", "1"]),
        "Gemma-3-270M": (gemma3_270m().write(d / "g270.gguf"), 32768, ["-np", "1"]),
    }
    rpc = None
    stack = contextlib.ExitStack()
    if Path(srv.path).with_name("ggml-rpc-server").exists():
        (rpc,) = stack.enter_context(rpc_servers(srv, 1))
    rows = []
    with stack:
        devices = ["host", *(["rpc"] if rpc else []), *(["vulkan"] if vk else [])]
        for name, (path, train, extra) in models.items():
            for dev in devices:
                s = vk if dev == "vulkan" and vk else srv
                if dev == "vulkan":
                    os.environ["GGML_VK_VISIBLE_DEVICES"] = "0"  # one lavapipe device
                else:
                    os.environ.pop("GGML_VK_VISIBLE_DEVICES", None)
                # budgets: what the plan itself would need at 1/8, 1/4 and 1/2 of the training context
                for frac in (8, 4, 2):
                    target = train // frac
                    _, usable0, _ = plan(path, s, 1024, dev, rpc, [*extra, "-c", str(target)])
                    p0 = prepare(str(path), options(dev, s, rpc, [*extra, "-c", str(target)]))
                    d0 = p0.plan.host.use if dev == "host" else p0.plan.devices[0].use
                    need = d0.total - d0.overhead  # what the logged buffers take
                    budget_goal = need + 37 * MiB  # a little over, so the answer is not a boundary
                    margin = (usable0 + 1024 * MiB - budget_goal) // MiB
                    ctx, usable, aliases = plan(path, s, int(margin), dev, rpc, extra)
                    best, loads = largest_that_fits(path, s, usable, train, dev, rpc, extra, aliases)
                    ratio = ctx / best if best else float("nan")
                    row = {"model": name, "device": dev, "budget_mib": round(usable / MiB, 1), "llamafit_ctx": ctx,
                           "largest_ctx": best, "ratio": round(ratio, 4), "loads": loads}  # fmt: skip
                    rows.append(row)
                    print(f"{name:14} {dev:5} budget {usable / MiB:9.1f} MiB  llamafit {ctx:6}  largest {best:6}  "
                          f"ratio {ratio:.4f}{'  OVER' if ratio > 1 else ''}", flush=True)  # fmt: skip
    pack = packing(srv, d)
    ratios = [r["ratio"] for r in rows if r["largest_ctx"]]
    summary = {"min_ratio": min(ratios), "max_ratio": max(ratios), "cases": len(rows),
               "targets": {"min_ratio": 0.97, "max_ratio": 1.0}}  # fmt: skip
    print(f"\nratio min {summary['min_ratio']:.4f}  max {summary['max_ratio']:.4f}  (target >= 0.97, never > 1)")
    out = HERE / "results" / "fit_quality.json"
    out.parent.mkdir(exist_ok=True)
    if pack:
        worse = [p["model"] for p in pack if p["llamafit_host_weights_gib"] > p["fit_params_host_weights_gib"]]  # type: ignore[operator]
        failed = [p["model"] for p in pack if not p["llamafit_within_budgets"]]
        summary["packing"] = {"cases": len(pack), "llamafit_leaves_more_on_host": worse, "loads_over_budget": failed}
        print(f"packing: llamafit leaves more weights in host memory than llama-fit-params in {len(worse)} of "
              f"{len(pack)} cases; loads over budget: {len(failed)}")  # fmt: skip
    out.write_text(json.dumps({"summary": summary, "rows": rows, "packing": pack}, indent=1))
    print(f"wrote {out.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()

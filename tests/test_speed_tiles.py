"""MMQ's tile padding of an MoE prefill's expert matmuls (llamafit.speed.tiles): the rule of ggml-cuda's tile choice,
its expectation over uniform routing, and what it does to a plan's predicted prefill."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from llamafit.devices.described import described_gpus
from llamafit.devices.machine import Host, Machine
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.fit.speed import priced
from llamafit.gguf.model import ModelInfo
from llamafit.memory.placement import CPU
from llamafit.server.args import parse_server_args
from llamafit.speed import tiles
from llamafit.speed.known import host_rates, known_rates
from llamafit.units import GiB


def test_expected_tiles_is_the_binomial_expectation() -> None:
    n, p, width = 64, 0.25, 8
    brute = sum(math.comb(n, t) * p**t * (1 - p) ** (n - t) * math.ceil(t / width) for t in range(n + 1))
    assert tiles._expected_tiles(n, p, width) == pytest.approx(brute, rel=1e-9)


def test_a_whole_batch_tile_pads_an_expert_to_its_width() -> None:
    # 512 tokens, 8 of 128 experts: 32 tokens an expert in 128-wide tiles (NVIDIA): four times the useful columns
    assert tiles.padding("volta+", "q4_K", 512, 128, 8) == pytest.approx(4.0, rel=0.01)
    # at most 64 columns (GCN, CDNA, RDNA2): half as much
    assert tiles.padding("gcn/cdna/rdna2", "q4_K", 512, 128, 8) == pytest.approx(2.0, rel=0.01)
    # RDNA3/4 size the tile to an expert's 32 tokens: only the experts over 32 take a second tile
    rdna = tiles.padding("rdna3/rdna4", "q4_K", 512, 128, 8)
    assert 1.0 < rdna < 2.0


def test_what_mmq_does_not_run_is_not_padded() -> None:
    assert tiles.padding("volta+", "f16", 512, 128, 8) == 1.0  # cuBLAS per expert
    assert tiles.padding("", "q4_K", 512, 128, 8) == 1.0  # not ggml-cuda
    assert tiles.padding("volta+", "q4_K", 512, 1, 1) == 1.0  # a dense model
    # CDNA1/2 keep MMQ for a large batch only with many experts or Q4_0-like types (hipBLAS otherwise)
    assert tiles.padding("cdna", "mxfp4", 512, 32, 4) == 1.0
    assert tiles.padding("cdna", "q4_0", 512, 32, 4) > 1.0 and tiles.padding("cdna", "mxfp4", 512, 128, 4) > 1.0


def test_a_larger_ubatch_never_pads_more() -> None:
    pads = [tiles.padding("volta+", "mxfp4", ub, 32, 4) for ub in (128, 256, 512, 1024, 2048, 4096, 8192)]
    assert pads == sorted(pads, reverse=True) and pads[-1] < 1.2 and all(p >= 1.0 for p in pads)


def test_a_devices_tiling_comes_from_its_backend_and_card() -> None:
    ids = [
        "rtx-4090",
        "rx-7900-xtx",
        "mi50",
        "rx-6900-xt",
        "r9700",
        "vulkan:rx-7900-xtx",
        "48GiB/64GiB@m3-max",
        "mi210",
    ]
    got = [r.moe_tiles if (r := known_rates(g)) else None for g in described_gpus(ids)]
    assert got == ["volta+", "rdna3/rdna4", "gcn/cdna/rdna2", "gcn/cdna/rdna2", "rdna3/rdna4", "", "", "cdna"]


def test_the_padding_slows_an_moe_prefill_and_leaves_a_dense_one(moe: ModelInfo, l8b: ModelInfo) -> None:
    machine = Machine(tuple(described_gpus(["rtx-4090"])), Host(total=256 * GiB, available=240 * GiB))
    req = build_request(parse_server_args(["-c", "4096", "-ub", "512"]))
    for model, slower in ((moe, True), (l8b, False)):
        plan = make_plan(model, machine, req)
        tiled = {"CUDA0": known_rates(machine.gpus[0]), CPU: host_rates(80e9)}
        assert tiled["CUDA0"] is not None and tiled["CUDA0"].moe_tiles == "volta+"
        flat = {**tiled, "CUDA0": replace(tiled["CUDA0"], moe_tiles="")}
        a, b = priced(plan, tiled).speed, priced(plan, flat).speed  # type: ignore[arg-type]
        assert a.pp is not None and b.pp is not None and a.tg == b.tg
        assert (a.pp < b.pp) if slower else (a.pp == b.pp), (model.path, a.pp, b.pp)

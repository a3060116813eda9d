"""How llama.cpp loads the weights: ``-lm`` (auto maps the file unless a device cannot), the tensors it reads lazily
(``-lzm``), and the tied output of the architectures that make it first.

Gemma 4 and Qwen3.8-Flash-Next mark their per-layer embeddings ``TENSOR_READ_LAZY``: under ``-lzm on``, or
``auto`` above 4 GiB, the table is a context of its own, mapped from the file whatever the load mode, logged as a
``CPU_Mapped`` buffer of its own. The placement is held to the real server's model buffers, byte for byte (to
the log's 0.01 MiB), on a small gemma4 and on one whose F32 table is larger than 4 GiB (a sparse file).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from llamafit.devices.machine import Device, Host, Machine
from llamafit.errors import UsageError
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import load_model
from llamafit.memory.placement import LAZY_AUTO_MIN, Loading, Override, _layer_runs, place_weights
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.serving.compare import compare
from llamafit.units import GiB, pad
from tests import factory
from tests.factory import Shape
from tests.realserver import load_log

PLE = "per_layer_token_embd.weight"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.gemma4().write(tmp_path_factory.mktemp("gemma4") / "gemma4.gguf")


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An F32 table of 256 x 10 x 430000 floats (4.4 GB, over the 4 GiB of ``auto``) in a sparse file."""
    shape = factory.gemma4(per_layer=256, n_vocab=430_000, ple="f32")
    return shape.write(tmp_path_factory.mktemp("gemma4-large") / "gemma4-large.gguf")


def _bytes(model: Path, name: str) -> int:
    return next(t.info.nbytes for t in load_model(model).tensors if t.name == name)


def _placed(model: Path, **loading: object) -> dict[str, tuple[str, str]]:
    m = load_model(model)
    pl = place_weights(m, Loading(0, **loading), gpus=[], splits=[])  # type: ignore[arg-type]
    return {p.tensor.name: (p.device, p.buft) for p in pl.tensors}


def test_the_per_layer_table_is_read_lazily_as_llama_cpp_decides(small: Path, large: Path) -> None:
    assert _placed(small, lazy_mode="on")[PLE] == ("CPU", "CPU_Mapped")
    assert _placed(small, lazy_mode="on", use_mmap=False)[PLE] == ("CPU", "CPU_Mapped")  # mapped all the same
    assert _placed(small, lazy_mode="auto", use_mmap=False)[PLE] == ("CPU", "CPU")  # 4 GiB or less: read whole
    assert _bytes(large, PLE) > LAZY_AUTO_MIN
    assert _placed(large, lazy_mode="auto", use_mmap=False)[PLE] == ("CPU", "CPU_Mapped")
    assert _placed(large, lazy_mode="off", use_mmap=False)[PLE] == ("CPU", "CPU")
    # an -ot override does not move it (llama-model-loader.cpp:1211-1213): the input layer's weights still may
    m = load_model(small)
    pl = place_weights(m, Loading(-1, (Override("per_layer|token_embd", "CUDA0"),), lazy_mode="on"), gpus=["CUDA0"],
                       splits=[1.0])  # fmt: skip
    where = {p.tensor.name: p.buft for p in pl.tensors}
    assert where[PLE] == "CPU_Mapped" and where["token_embd.weight"] == "CUDA0"


def test_a_lazy_table_is_a_mapped_buffer_of_its_own(small: Path) -> None:
    m = load_model(small)
    lazy = place_weights(m, Loading(0, lazy_mode="on"), gpus=[], splits=[]).buffers
    whole = place_weights(m, Loading(0, lazy_mode="off"), gpus=[], splits=[]).buffers
    assert [b for b, _ in lazy] == ["CPU_Mapped", "CPU_Mapped"] and [b for b, _ in whole] == ["CPU_Mapped"]
    # the table lies inside the rest's file span: that span is the same, the table's own is added
    assert sorted(n for _, n in lazy) == sorted([whole[0][1], _bytes(small, PLE)])


def test_gemma4_keeps_its_tied_output_twice_where_the_buffer_is_not_the_file(small: Path) -> None:
    """gemma4 makes the tied output before token_embd, so the copy finds nothing to share (models/gemma4.cpp:50-56):
    without mmap two tensors take their bytes in the CPU buffer; mapped, both are the file's."""
    m = load_model(small)
    padded = [pad(t.info.nbytes, 32) for t in m.tensors if t.name == "token_embd.weight"]
    unmapped = dict(place_weights(m, Loading(0, use_mmap=False), gpus=[], splits=[]).buffers)
    assert unmapped["CPU"] == sum(pad(t.info.nbytes, 32) for t in m.tensors) + padded[0]
    mapped = place_weights(m, Loading(0), gpus=[], splits=[]).buffers
    assert len(mapped) == 1 and mapped[0][1] < unmapped["CPU"]


def test_the_per_layer_projection_is_on_the_first_layers_device(small: Path) -> None:
    """per_layer_model_proj and per_layer_proj_norm are block 0's (models/gemma4.cpp:60-61), not the output
    layer's: with the last layers and the output offloaded (-ngl 4 of 10), they stay with layer 0 on the host."""
    m = load_model(small)
    pl = place_weights(m, Loading(4), gpus=["CUDA0"], splits=[1.0])
    where = {p.tensor.name: p.device for p in pl.tensors}
    assert where["output_norm.weight"] == "CUDA0" and where["blk.0.attn_q.weight"] == "CPU"
    assert where["per_layer_model_proj.weight"] == where["per_layer_proj_norm.weight"] == "CPU"


def test_a_lazy_mode_llama_server_refuses_is_refused() -> None:
    with pytest.raises(UsageError, match="-lzm expects on, auto or off"):
        build_request(parse_server_args(["-lzm", "sometimes"]))
    assert build_request(parse_server_args(["--lazy-mode", "on"])).lazy_mode == "on"
    assert build_request(parse_server_args([])).lazy_mode == "auto"


@pytest.mark.parametrize("args", [[], ["-lm", "none"]])
def test_a_lazily_read_table_is_not_held_against_the_hosts_ram(large: Path, args: list[str]) -> None:
    """Its rows are read from the file as tokens need them (llama.h:218-222): the buffers list it as llama.cpp logs
    it, the host's use leaves it out, the mapping of the other weights spanning it included, and the plan says so."""
    machine = Machine((), Host(total=64 * GiB, available=64 * GiB))
    m = load_model(large)
    plan = make_plan(m, machine, build_request(parse_server_args(["-c", "4096", *args])))
    logged = sum(b.nbytes for b in plan.footprint.buffers if b.kind == "model")
    held = sum(t.info.nbytes for t in m.tensors if t.name != PLE)
    emb = _bytes(large, "token_embd.weight")
    assert logged - plan.host.use.model >= _bytes(large, PLE)
    assert plan.host.use.model <= held + (emb if args else 0) + (1 << 20)
    assert any("read from the model file a row at a time" in n for n in plan.notes)


def test_a_per_layer_table_is_read_a_row_per_token_not_whole(tmp_path: Path) -> None:
    """GET_ROWS reads a token's row of Gemma's per-layer embeddings as it does of token_embd: doubling the table's
    bytes (F32 for F16) leaves the generation speed within a row's worth, where reading it whole halved it."""
    from llamafit.fit import Inputs
    from llamafit.fit.speed import priced
    from llamafit.speed.known import host_rates

    rates = {"CPU": host_rates(60e9)}
    machine = Machine((), Host(total=64 * GiB, available=64 * GiB))
    tg = []
    for ple in ("f16", "f32"):
        shape = factory.gemma4(n_layer=10, n_embd=1024, n_ff=4096, per_layer=256, n_vocab=65536, w="q4_K", ple=ple)
        m = load_model(shape.write(tmp_path / f"gemma4-{ple}.gguf"))
        req = build_request(parse_server_args(["-c", "4096"]))
        tg.append(priced(make_plan(m, machine, req, inputs=Inputs(rates=rates)), rates).speed.tg)
    assert tg[0] is not None and tg[1] is not None and tg[1] > 0.98 * tg[0], tg


CASES = [
    ("small", ["-lzm", "on"]),
    ("small", ["-lzm", "on", "-lm", "none"]),
    ("small", ["-lzm", "off", "-lm", "none"]),
    ("small", []),
    ("large", []),
    ("large", ["-lm", "none"]),
]


@pytest.mark.server
@pytest.mark.parametrize(("which", "args"), CASES, ids=[f"{w}:{' '.join(a) or 'defaults'}" for w, a in CASES])
def test_the_model_buffers_match_the_server(
    server_bin: ServerBinary, small: Path, large: Path, which: str, args: list[str]
) -> None:
    model = small if which == "small" else large
    argv = ["-c", "4096", *args]
    machine = Machine((), Host(total=64 * GiB, available=64 * GiB))
    plan = make_plan(load_model(model), machine, build_request(parse_server_args(argv)))
    rows = [r for r in compare(plan.footprint, load_log(server_bin, model, argv)) if r.kind == "model"]
    assert rows and all(r.actual_mib is not None for r in rows)
    for r in rows:
        assert abs(r.predicted / 2**20 - (r.actual_mib or 0.0)) <= 0.006, (r.buft, r.predicted / 2**20, r.actual_mib)


IGPU = Device("Vulkan0", "AMD Radeon(TM) 8060S Graphics (RADV GFX1151)", 96 * GiB, 90 * GiB, backend="Vulkan", uma=True)


def test_which_devices_let_llama_cpp_map_the_file() -> None:
    """mmap_support: false on an integrated GPU of ggml-cuda (Jetson, GB10, an AMD APU through HIP) or Vulkan."""
    gb10 = Device("CUDA0", "NVIDIA GB10", 120 * GiB, 110 * GiB, uma=True)
    apu = Device("ROCm0", "AMD Radeon Graphics", 64 * GiB, 60 * GiB, backend="ROCm", uma=True)
    lavapipe = Device("Vulkan0", "llvmpipe (LLVM 15.0.7, 256 bits)", 2 * GiB, 2 * GiB, backend="Vulkan", uma=True)
    apple = Device("MTL0", "Apple M2 Max", 48 * GiB, 48 * GiB, backend="Metal", uma=True)
    card = Device("CUDA0", "NVIDIA GeForce RTX 4090", 24 * GiB, 23 * GiB)
    assert [d.maps_files for d in (IGPU, gb10, apu)] == [False, False, False]
    assert [d.maps_files for d in (lavapipe, apple, card)] == [True, True, True]


def _model_buffers(model: Path, machine: Machine, args: list[str]) -> set[str]:
    plan = make_plan(load_model(model), machine, build_request(parse_server_args(["-c", "4096", *args])))
    return {b.buft for b in plan.footprint.buffers if b.kind == "model"}


def test_auto_loads_without_mmap_beside_an_integrated_gpu(small: Path, large: Path) -> None:
    """llama-model.cpp:1514-1534: the host's weights in the device's pinned host buffer instead of the file's
    mapping, and no tensor read lazily under ``auto``; an explicit mode is kept."""
    igpu = Machine((IGPU,), Host(total=128 * GiB, available=120 * GiB))
    assert _model_buffers(small, igpu, ["-ngl", "5"]) == {"Vulkan0", "Vulkan_Host"}
    assert _model_buffers(small, igpu, ["-ngl", "5", "-lm", "mmap"]) == {"Vulkan0", "CPU_Mapped"}
    assert "CPU_Mapped" not in _model_buffers(large, igpu, [])  # 4.4 GB table, not lazy beside it
    assert "CPU_Mapped" in _model_buffers(large, igpu, ["-lzm", "on"])
    card = Machine((Device("Vulkan0", "AMD Radeon RX 7600", 8 * GiB, 8 * GiB, backend="Vulkan"),), igpu.host)
    assert _model_buffers(small, card, ["-ngl", "5"]) == {"Vulkan0", "CPU_Mapped"}


@pytest.mark.parametrize(
    "shape",
    [factory.glm45_air, factory.gemma4, factory.mamba2, factory.nemotron_h],
    ids=["glm45-air-nextn", "gemma4-tied-lazy", "mamba2-state-ops", "nemotron-h"],
)
def test_a_layer_placed_whole_is_what_placing_each_weight_gives(tmp_path: Path, shape: Callable[[], Shape]) -> None:
    """A layer's weights on one device are placed once and reused by every placement that puts the layer there
    (``placement._layer_runs``); a placement with device limits (which no weight here reaches) places each weight on
    its own: the two agree, weight for weight and buffer for buffer, whatever the layers, overrides and load mode."""
    m = load_model(shape().write(tmp_path / "m.gguf"))
    gpus, big = ["CUDA0", "Vulkan0"], {"CUDA0": 1 << 60, "Vulkan0": 1 << 60}
    n = m.hparams.n_layer_all
    loadings = [
        Loading(-1),
        Loading(n // 2),
        Loading(-1, (Override(r"blk\.(1|2)\.ffn_.*", "CPU"),), use_mmap=False),
        Loading(-1, (Override(r"blk\.1\..*", "Vulkan0"),), no_host=True, repack=False),
        Loading(n - 1, load_nextn=True, lazy_mode="on"),
    ]
    for loading in loadings:
        for splits in ([1.0, 0.0], [0.5, 0.5], [0.2, 0.8]):
            for _ in range(2):  # the second time from what the first kept
                whole = place_weights(m, loading, gpus=gpus, splits=splits)
                each = place_weights(m, loading, gpus=gpus, splits=splits, limits=big)
                assert whole.tensors == each.tensors, (loading, splits)
                assert (whole.buffers, whole.layer_device) == (each.buffers, each.layer_device)
    plain = any(p for _, _, p in _layer_runs(m))  # a Mamba-2 layer's every run holds a state-space weight
    assert bool(m.known(("run_placed",))) == plain  # where layers may be placed whole, they were

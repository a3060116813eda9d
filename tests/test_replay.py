"""Which graphs are replayed through the ggml-alloc replica, and which keep the per-phase estimate."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llamafit.devices.machine import Host, Machine
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import load_model
from llamafit.memory.builds import DSPARK_DSV4_GRAPH_SINCE, DSV4_GRAPH_SINCE
from llamafit.memory.graph.replay import graph_bytes, recurrent_bytes, shape_of
from llamafit.server.args import parse_server_args
from llamafit.units import GiB
from tests import factory


def _context(path: Path, args: list[str]):  # type: ignore[no-untyped-def]
    model = load_model(path)
    plan = make_plan(
        model, Machine((), Host(total=64 * GiB, available=64 * GiB)), build_request(parse_server_args(args))
    )
    return model, plan.footprint.context, plan.footprint.flash_attn


REPLAYED = [
    (shape, args)
    for shape in (
        *("dense", "qwen2", "qwen3", "gemma3", "gemma4", "gemma4_31b", "moe", "mla", "dsa", "glm_dsa", "hybrid"),
        *("hybrid_moe", "next", "glm4moe", "gemma4_moe", "gemma3n", "gemma2", "minimax_m2"),
        *("seed_oss", "smollm3", "glm4", "ernie45", "ernie45_moe", "exaone4", "exaone4_swa"),
        *("olmo2", "olmo3", "granite", "granite_nope", "granitemoe", "cohere2", "command_r", "command_r_plus"),
        *("qwen2moe", "llama4", "llama4_maverick", "mistral4", "hunyuan_moe", "arcee"),
        *("exaone", "xverse", "nanbeige", "internlm2", "dots1"),
    )
    for args in (
        ["-c", "4096"],
        ["-c", "4096", "-fa", "off"],
        ["-c", "8192", "-np", "2"],
        ["-c", "4096", "-ctk", "q8_0"],
    )
    # a K cache type of its own: build_attn's only
    if "-ctk" not in args or shape not in ("mla", "mistral4", "dsa", "glm_dsa", "hybrid", "hybrid_moe", "next")
]


@pytest.mark.parametrize(("shape", "args"), REPLAYED, ids=[f"{s}:{' '.join(a)}" for s, a in REPLAYED])
def test_the_replayed_graphs(shapes: dict[str, Path], shape: str, args: list[str]) -> None:
    """Every builder: the plain transformers (``transformers.TRANSFORMER``'s families), Gemma 3n and 4, MLA and its
    DSA variants, the Qwen3.5 hybrids, Qwen3-Next."""
    model, cp, fa = _context(shapes[shape], args)
    assert graph_bytes(model, cp, cp.n_outputs_max, fa) is not None
    assert recurrent_bytes(model, cp, cp.n_outputs_max) is None


def test_other_graphs_keep_the_estimate(tmp_path: Path) -> None:
    """An architecture without a builder (OLMo: layer norms without weights, Q, K and V clamped), a Qwen2 whose logits
    have a bias, a Qwen3-VL header with more deepstack slices than layers, MiniMax-M2 and dots.llm1 headers without
    their gating function (llama.cpp aborts on the graph), a Llama 4 without chunked attention (b11434 aborts on its
    first batch), and DeepSeek-V4 (and DSpark on its backbone) on a build older than the graph its builder makes."""
    olmo = factory.dense(arch="olmo", name="olmo").write(tmp_path / "olmo.gguf")
    model, cp, fa = _context(olmo, ["-c", "4096"])
    assert graph_bytes(model, cp, cp.n_outputs_max, fa) is None
    qwen2 = factory.dense(arch="qwen2", name="qwen2", qkv_bias=True, output_bias=True).write(tmp_path / "qwen2.gguf")
    model, cp, fa = _context(qwen2, ["-c", "4096"])
    assert graph_bytes(model, cp, cp.n_outputs_max, fa) is None
    wide = factory.qwen3vl()
    wide.kv["qwen3vl.n_deepstack_layers"] = 10**9  # a header asking for more slices than layers
    model, cp, fa = _context(wide.write(tmp_path / "qwen3vl.gguf"), ["-c", "4096"])
    assert graph_bytes(model, cp, cp.n_outputs_max, fa) is None
    full = factory.llama4(chunked=False)  # its last layer's temperature input aborts b11434's server
    model, cp, fa = _context(full.write(tmp_path / "llama4.gguf"), ["-c", "4096"])
    assert graph_bytes(model, cp, cp.n_outputs_max, fa) is None
    for ungated, key in ((factory.moe(arch="minimax-m2", name="minimax-m2"), "minimax-m2"), (factory.dots1(), "dots1")):
        del ungated.kv[f"{key}.expert_gating_func"]
        model, cp, fa = _context(ungated.write(tmp_path / f"{key}.gguf"), ["-c", "4096"])
        assert graph_bytes(model, cp, cp.n_outputs_max, fa) is None
    for shape, since in ((factory.deepseek4(), DSV4_GRAPH_SINCE), (factory.dspark_dsv4(), DSPARK_DSV4_GRAPH_SINCE)):
        model, cp, fa = _context(shape.write(tmp_path / f"{shape.kv['general.name']}.gguf"), ["-c", "4096"])
        assert graph_bytes(model, cp, cp.n_outputs_max, fa) is not None
        older = dataclasses.replace(cp, build=since - 1)
        assert graph_bytes(model, older, older.n_outputs_max, fa) is None


def test_the_pooling_graph_follows_the_trunk(shapes: dict[str, Path]) -> None:
    """Mean pooling adds a transposed copy of the embeddings (n_tokens x n_embd) and a n_tokens x n_seqs
    input; a reranker's classification head is not replayed."""
    model, cp, fa = _context(shapes["dense"], ["-c", "4096", "--embeddings"])
    plain = graph_bytes(model, cp, cp.n_outputs_max, fa)
    mean = graph_bytes(model, cp, cp.n_outputs_max, fa, "mean")
    assert plain is not None and mean is not None and mean > plain
    assert graph_bytes(model, cp, cp.n_outputs_max, fa, "rank") is None


def test_mistral4_is_replayed_on_one_backend_only(shapes: dict[str, Path]) -> None:
    """Its experts' down projections carry F32 precision on their input, which CUDA and Vulkan refuse: the scheduler
    runs them on the host (and copies their weights there), which the replica does not model, so a split graph keeps
    the per-phase estimate while the whole graph on one backend is replayed."""
    model, cp, fa = _context(shapes["mistral4"], ["-c", "4096"])
    shape = shape_of(model, False)
    assert shape is not None and not shape.placeable
    assert graph_bytes(model, cp, cp.n_outputs_max, fa) is not None


def test_a_fused_qkv_keeps_the_estimate(tmp_path: Path) -> None:
    shape = factory.dense(name="fused")
    shape.tensors = [dataclasses.replace(t, name=t.name.replace("attn_q.", "attn_qkv.")) for t in shape.tensors]
    model, cp, fa = _context(shape.write(tmp_path / "fused.gguf"), ["-c", "4096"])
    assert graph_bytes(model, cp, cp.n_outputs_max, fa) is None


def test_the_mamba_graphs_are_replayed(shapes: dict[str, Path]) -> None:
    model, cp, _ = _context(shapes["mamba"], ["-c", "4096"])
    assert recurrent_bytes(model, cp, cp.n_outputs_max) is not None


def test_every_architecture_the_registry_names_is_one_llama_cpp_knows() -> None:
    """One registry from architecture to the reader of its shape: a name llama.cpp does not use would never be
    read (its models fall to the plain transformer's reader, which reads none of them)."""
    from llamafit.gguf.archs import ARCHS
    from llamafit.memory.graph.shapes import DRAFT_READERS, READERS
    from llamafit.memory.graph.transformers import TRANSFORMER

    named = {*READERS, *DRAFT_READERS, *TRANSFORMER}
    assert named <= ARCHS, sorted(named - ARCHS)
    assert not set(TRANSFORMER) & set(READERS)  # a transformer is read by the default reader only


def test_placements_replayed_on_one_build_give_what_each_gives_alone(tmp_path: Path) -> None:
    """A search's placements at one context share one graph build, each placing its tensors before the replay
    (``replay._placed_graph``): in any order they give what a model object of their own gives."""
    from llamafit.memory.footprint import Footprint, LoadSettings, estimate
    from llamafit.memory.placement import experts_on_cpu, n_cpu_ffn_overrides

    path = factory.moe(n_layer=6, n_expert=8, n_expert_used=2).write(tmp_path / "moe.gguf")
    gpus = ["CUDA0", "CUDA1"]
    settings = [
        LoadSettings(n_ctx=4096, n_gpu_layers=4),
        LoadSettings(n_ctx=4096, overrides=experts_on_cpu(3)),
        LoadSettings(n_ctx=4096, overrides=experts_on_cpu(5, 1), tensor_split=(1.0, 3.0)),
        LoadSettings(n_ctx=4096, overrides=n_cpu_ffn_overrides(2)),
        LoadSettings(n_ctx=4096),
    ]

    def buffers(fp: Footprint) -> dict[str, int]:
        return {**{g: u.compute for g, u in fp.gpus.items()}, "CPU": fp.host.compute}

    alone = [buffers(estimate(load_model(str(path)), s, gpus)) for s in settings]
    assert len({tuple(sorted(b.items())) for b in alone}) > 2  # the placements move the buffers
    shared = load_model(str(path))
    for i in [0, 1, 2, 3, 4, 2, 0, 3]:
        assert buffers(estimate(shared, settings[i], gpus)) == alone[i]

"""The memory model on published model shapes, against the worked examples of docs/memory-model.md §2.10
and llama.cpp's placement rules (§1.3-1.5). These need no server: they pin the arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.gguf.model import load_model
from llamafit.memory.context import ContextParams, memory_buffers, resolve_context
from llamafit.memory.footprint import LoadSettings, estimate
from llamafit.memory.placement import CPU, Loading, Override, layer_devices, place_weights
from llamafit.units import MiB
from tests import factory


def _kv_mib(model_path: Path, **kw: object) -> float:
    m = load_model(model_path)
    fp = estimate(m, LoadSettings(**kw))  # type: ignore[arg-type]
    return sum(b.nbytes for b in fp.buffers if b.kind == "kv") / MiB


def test_llama31_8b_kv_at_training_context(tmp_path: Path) -> None:
    p = factory.llama31_8b().write(tmp_path / "l.gguf")
    # 32 layers x 2 x 1024 x 2 B per cell = 128 KiB per cell; 131072 cells (docs/memory-model.md §2.10)
    assert _kv_mib(p) == 16384
    assert _kv_mib(p, type_k="q8_0", type_v="q8_0") == 8704


def test_gpt_oss_120b_iswa_kv(tmp_path: Path) -> None:
    """36 blocks, pattern 2, window 128, 8 KV heads x 64: base 4608 MiB + SWA 36 MiB (docs/memory-model.md §2.10)."""
    shape = factory.dense(arch="gpt-oss", n_layer=36, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_ff=2880,
                          ctx=131072)  # fmt: skip
    shape.kv["gpt-oss.attention.sliding_window"] = 128
    m = load_model(shape.write(tmp_path / "oss.gguf"))
    hp = m.hparams
    assert hp.swa_type == "standard" and sum(hp.is_swa) == 18
    cp = resolve_context(hp, n_ctx=0, n_seq_max=4, kv_unified=True)
    bufs = memory_buffers(hp, cp, [CPU] * 37)
    by_cache = {b.cache: b.nbytes / MiB for b in bufs}
    assert by_cache == {"kv": 4608, "swa": 36}
    assert next(b.cells for b in bufs if b.cache == "swa") == 1024


def test_qwen3_next_kv_and_recurrent_state(tmp_path: Path) -> None:
    """48 blocks, full attention every 4th: KV 6144 MiB, RS 301.5 MiB at 4 slots (docs/memory-model.md §2.10)."""
    shape = factory.qwen35(n_layer=48, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_ff=512, d_conv=4,
                           d_state=128, n_group=16, dt_rank=32, interval=4, ctx=262144)  # fmt: skip
    shape.arch = "qwen3next"
    shape.kv = {k.replace("qwen35.", "qwen3next."): v for k, v in shape.kv.items()}
    m = load_model(shape.write(tmp_path / "q3n.gguf"))
    hp = m.hparams
    assert hp.ssm_d_inner == 4096
    cp = resolve_context(hp, n_ctx=0, n_seq_max=4, kv_unified=True, n_rs_seq=3)
    bufs = memory_buffers(hp, cp, [CPU] * 49)
    kv = sum(b.nbytes for b in bufs if b.kind == "kv") / MiB
    rs = sum(b.nbytes for b in bufs if b.kind == "rs") / MiB
    assert kv == 6144
    assert rs == pytest.approx(301.5, abs=0.01)  # Qwen3-Next is not a rollback arch: n_rs_seq is ignored


def test_qwen35_rollback_rows_multiply_the_state(tmp_path: Path) -> None:
    m = load_model(factory.qwen35().write(tmp_path / "q35.gguf"))
    hp = m.hparams
    base = resolve_context(hp, n_ctx=4096, n_seq_max=4, kv_unified=True)
    mtp = resolve_context(hp, n_ctx=4096, n_seq_max=4, kv_unified=True, n_rs_seq=3)
    rs0 = sum(b.nbytes for b in memory_buffers(hp, base, [CPU] * 9) if b.kind == "rs")
    rs3 = sum(b.nbytes for b in memory_buffers(hp, mtp, [CPU] * 9) if b.kind == "rs")
    assert rs3 == 4 * rs0  # rs_size x (1 + n_rs_seq) rows (llama-memory-recurrent.cpp:101)


def test_deepseek_v3_mla_kv(tmp_path: Path) -> None:
    """61 trunk layers x 576 x 2 B = 10980 MiB at 163840 cells, K only (docs/memory-model.md §2.10)."""
    shape = factory.deepseek2(n_layer=62, n_embd=512, n_head=4, kv_lora_rank=512, rope_dim=64, nope_dim=128,
                              v_dim=128, ctx=163840)  # fmt: skip
    shape.kv["deepseek2.nextn_predict_layers"] = 1
    m = load_model(shape.write(tmp_path / "v3.gguf"))
    assert m.hparams.n_layer == 61
    assert _kv_mib(tmp_path / "v3.gguf") == pytest.approx(10980.0, abs=0.5)


def test_context_padding_and_streams() -> None:
    hp = load_model_hp()
    cp = resolve_context(hp, n_ctx=4000, n_seq_max=4, kv_unified=True)
    assert (cp.n_ctx, cp.n_ctx_seq, cp.n_stream) == (4096, 4096, 1)
    cp = resolve_context(hp, n_ctx=4096, n_seq_max=3, kv_unified=False)
    # floor(4096/3) = 1365 -> padded to 1536 per stream, n_ctx becomes 3 x 1536 (llama-context.cpp:297-307)
    assert (cp.n_ctx, cp.n_ctx_seq, cp.n_stream) == (4608, 1536, 3)
    cp = resolve_context(hp, n_ctx=100, n_seq_max=1, kv_unified=True)
    assert (cp.n_ctx, cp.n_batch, cp.n_ubatch) == (256, 100, 100)


_HP_CACHE: list[object] = []


def load_model_hp():  # type: ignore[no-untyped-def]
    import tempfile

    if not _HP_CACHE:
        d = Path(tempfile.mkdtemp())
        _HP_CACHE.append(load_model(factory.dense().write(d / "m.gguf")).hparams)
    return _HP_CACHE[0]


def test_layer_assignment_matches_llama_cpp() -> None:
    # 32 layers + output over two GPUs split 1:1 -> 16.5 units each: layers 0..16 on CUDA0
    devs = layer_devices(32, -1, ["CUDA0", "CUDA1"], [1.0, 1.0])
    assert devs.count("CUDA0") == 17 and devs[-1] == "CUDA1"
    # -ngl 10: the top 9 layers and the output, highest layers first
    devs = layer_devices(32, 10, ["CUDA0"], [1.0])
    assert devs[:23] == ["CPU"] * 23 and devs[23:] == ["CUDA0"] * 10
    # layer counts as -ts map exactly onto the counts
    devs = layer_devices(32, -1, ["CUDA0", "CUDA1", "CUDA2"], [10.0, 13.0, 10.0])
    assert [devs.count(d) for d in ("CUDA0", "CUDA1", "CUDA2")] == [10, 13, 10]
    assert layer_devices(32, 5, [], []) == ["CPU"] * 33


def test_gpu_placement_tied_embeddings_and_cuda_padding(tmp_path: Path) -> None:
    m = load_model(factory.qwen3_0_6b().write(tmp_path / "q.gguf"))
    pl = place_weights(m, Loading(-1), gpus=["CUDA0"], splits=[1.0])
    emb = [p for p in pl.tensors if p.tensor.name == "token_embd.weight"]
    # input layer on the host, a duplicate as the output on the GPU (loader.cpp:1370-1386)
    assert {p.buft for p in emb} == {"CPU", "CUDA0"}
    q = next(p for p in pl.tensors if p.tensor.name == "blk.0.attn_q.weight")
    assert q.alloc == q.tensor.info.nbytes  # ne0 = 1024 is a multiple of 512: no row padding
    # mmap: the host's weights are one CPU_Mapped span
    assert [n for n, _ in pl.buffers if n.startswith("CPU")] == ["CPU_Mapped"]


def test_cuda_row_padding_for_quantized_rows(tmp_path: Path) -> None:
    shape = factory.dense(n_embd=768, n_ff=2048, n_head=12, n_head_kv=4, w="q8_0")
    m = load_model(shape.write(tmp_path / "m.gguf"))
    pl = place_weights(m, Loading(-1), gpus=["CUDA0"], splits=[1.0])
    p = next(p for p in pl.tensors if p.tensor.name == "blk.0.ffn_up.weight")
    # ne0 = 768: 256 more elements per row are allocated once per tensor (ggml-cuda.cu:903-920)
    assert p.alloc == p.tensor.info.nbytes + 256 // 32 * 34


def test_overrides_first_match_wins_and_cpu_moe(tmp_path: Path) -> None:
    m = load_model(factory.moe(n_layer=4).write(tmp_path / "moe.gguf"))
    ov = (Override(r"blk\.0\.", "CUDA1"), Override(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"))
    pl = place_weights(m, Loading(-1, ov), gpus=["CUDA0", "CUDA1"], splits=[1.0, 1.0])
    by = {p.tensor.name: p for p in pl.tensors}
    assert by["blk.0.ffn_up_exps.weight"].buft == "CUDA1"  # the first pattern matched first
    assert by["blk.3.ffn_up_exps.weight"].device == CPU
    assert by["blk.3.attn_q.weight"].device != CPU


def test_nextn_tensors_load_only_with_mtp(tmp_path: Path) -> None:
    m = load_model(factory.qwen35(n_nextn=1).write(tmp_path / "q.gguf"))
    off = place_weights(m, Loading(0), gpus=[], splits=[])
    on = place_weights(m, Loading(0, load_nextn=True), gpus=[], splits=[])
    skipped = {t.name for t in m.tensors} - {p.tensor.name for p in off.tensors}
    assert skipped and all(n.startswith("blk.8.") for n in skipped)
    assert {p.tensor.name for p in on.tensors} == {t.name for t in m.tensors}


def test_context_params_defaults() -> None:
    cp = ContextParams(n_ctx=4096, n_ctx_seq=4096, n_seq_max=4, kv_unified=True, n_batch=2048, n_ubatch=512)
    assert cp.n_stream == 1 and not cp.v_trans
    assert ContextParams(4096, 1024, 4, False, 2048, 512, flash_attn="off").v_trans


def test_cache_type_rules_are_llama_cpps(tmp_path: Path) -> None:
    from llamafit.memory.context import check_cache_types

    mla = load_model(factory.deepseek2().write(tmp_path / "mla.gguf")).hparams
    dense = load_model(factory.dense().write(tmp_path / "d.gguf")).hparams
    assert "different K" in (check_cache_types(mla, "q8_0", "f16", "auto") or "")
    assert check_cache_types(mla, "q8_0", "q8_0", "auto") is None
    assert "requires flash attention" in (check_cache_types(dense, "f16", "q4_0", "off") or "")
    assert check_cache_types(dense, "q4_0", "f16", "off") is None
    odd = load_model(factory.dense(n_embd=240, n_head=8, n_head_kv=2).write(tmp_path / "odd.gguf")).hparams
    assert "does not divide" in (check_cache_types(odd, "q8_0", "q8_0", "auto") or "")


def test_dsa_indexer_cache_and_deepseek4_arithmetic(tmp_path: Path) -> None:
    from llamafit.memory.context import memory_class

    m = load_model(factory.deepseek2(dsa=True, n_layer=4, indexer_dim=128).write(tmp_path / "dsa.gguf"))
    hp = m.hparams
    assert memory_class(hp, mtp=False) == "dsa"
    cp = resolve_context(hp, n_ctx=8192, n_seq_max=4, kv_unified=True)
    bufs = {b.cache: b for b in memory_buffers(hp, cp, [CPU] * 5)}
    # MLA latent (128 + 32) and a one-head indexer key of 128, both K only, f16, per cell per layer
    assert bufs["kv"].nbytes == 4 * 8192 * 160 * 2
    assert bufs["idx"].nbytes == 4 * 8192 * 128 * 2

"""A GGUF factory for the tests: small real models and shape-faithful sparse copies of public models.

Each builder returns the metadata and tensor list that the matching ``src/models/<arch>.cpp``
``load_arch_tensors`` asks for, so the real llama-server loads the file. Shapes of public models come
from their published configs (config.json on the Hub).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llamafit.devices.machine import Device
from llamafit.ggml import by_name
from llamafit.gguf.writer import TensorSpec, spm_vocab, write_gguf
from llamafit.units import GiB


@dataclass
class Shape:
    arch: str
    kv: dict[str, Any]
    tensors: list[TensorSpec] = field(default_factory=list)

    def write(self, path: Path, fill: str = "sparse", random: tuple[str, ...] = ()) -> Path:
        """``random``: f16/f32 tensors given seeded random values in a sparse file (a MoE's embeddings and
        router, so tokens route to different experts)."""
        write_gguf(path, self.arch, self.kv, [_fallback(t) for t in self.tensors], fill=fill, random=random)
        return path

    def routed(self) -> Shape:
        """The shape with an f16 input embedding, to be written with random embeddings and routers."""
        ts = [TensorSpec(t.name, t.shape, "f16") if t.name == "token_embd.weight" else t for t in self.tensors]
        return Shape(self.arch, self.kv, ts)

    def routing_tensors(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors if t.name == "token_embd.weight" or "ffn_gate_inp" in t.name)


def bpe_vocab(n_vocab: int, n_merges: int, seed: int = 0) -> dict[str, Any]:
    """A GPT-2 style byte-level BPE tokenizer block as convert_hf_to_gguf writes it (tokens, token_type,
    merges), with the length profile of real ones: the 256 byte symbols first, then merges that grow
    longer with rank, half of them word-initial ("Ġ"). The strings are plausible, not a trained
    vocabulary: llama.cpp loads it, but text it tokenizes is not meaningful."""
    rng = np.random.default_rng(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    # GPT-2's byte-to-unicode table: printable bytes as themselves, the rest from U+0100 on
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    byte_syms = [chr(b) if b in printable else chr(next(extra)) for b in range(256)]
    tokens = list(byte_syms)
    seen = set(tokens)  # llama-vocab.cpp asserts every token is distinct
    while len(tokens) < n_vocab:
        rank = len(tokens) / n_vocab
        n = 2 + int(rng.integers(0, 3 + int(8 * rank)))
        word = ("Ġ" if rng.random() < 0.5 else "") + "".join(letters[int(c)] for c in rng.integers(0, 26, n))
        if word not in seen:
            seen.add(word)
            tokens.append(word)
    merges = []
    for i in range(n_merges):
        t = tokens[256 + i % (n_vocab - 256)]
        cut = max(1, len(t) // 2)
        merges.append(t[:cut] + " " + t[cut:])
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * n_vocab,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }


def with_vocab(shape: Shape, vocab: dict[str, Any]) -> Shape:
    """``shape`` with its tokenizer block replaced (the metadata keys before it keep their order)."""
    kv = {k: v for k, v in shape.kv.items() if not k.startswith("tokenizer.")}
    return Shape(shape.arch, kv | vocab, shape.tensors)


def write_split(directory: Path, prefix: str, shape: Shape, n: int) -> list[Path]:
    """Write ``shape`` as ``n`` shards the way gguf-split does: all metadata in shard 1, split.* everywhere."""
    chunks = [shape.tensors[i::n] for i in range(n)]
    paths = []
    for i, ts in enumerate(chunks):
        kv = dict(shape.kv) if i == 0 else {}
        # the types gguf-split writes (examples/gguf-split: u16, u16, i32); llama.cpp checks them
        kv.update({"split.no": np.uint16(i), "split.count": np.uint16(n),
                   "split.tensors.count": np.int32(len(shape.tensors))})  # fmt: skip
        p = directory / f"{prefix}-{i + 1:05d}-of-{n:05d}.gguf"
        write_gguf(p, shape.arch, kv, [_fallback(t) for t in ts])
        paths.append(p)
    return paths


def _fallback(t: TensorSpec) -> TensorSpec:
    """Rows that a k-quant block does not divide get q8_0 (or f16), as llama-quantize falls back."""
    blck = by_name(t.type).blck
    if t.shape and t.shape[0] % blck:
        return TensorSpec(t.name, t.shape, "q8_0" if t.shape[0] % 32 == 0 else "f16")
    return t


def _base_kv(arch: str, name: str, n_layer: int, n_embd: int, ctx: int, n_vocab: int) -> dict[str, Any]:
    kv: dict[str, Any] = {
        "general.name": name,
        f"{arch}.block_count": n_layer,
        f"{arch}.context_length": ctx,
        f"{arch}.embedding_length": n_embd,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.vocab_size": n_vocab,
    }
    kv.update(spm_vocab(n_vocab))
    return kv


def _attn(i: int, n_embd: int, n_q: int, n_kv: int, out_in: int, w: str) -> list[TensorSpec]:
    return [
        TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
        TensorSpec(f"blk.{i}.attn_q.weight", (n_embd, n_q), w),
        TensorSpec(f"blk.{i}.attn_k.weight", (n_embd, n_kv), w),
        TensorSpec(f"blk.{i}.attn_v.weight", (n_embd, n_kv), w),
        TensorSpec(f"blk.{i}.attn_output.weight", (out_in, n_embd), w),
    ]


def _ffn(i: int, n_embd: int, n_ff: int, w: str) -> list[TensorSpec]:
    return [
        TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
        TensorSpec(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), w),
        TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), w),
        TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
    ]


def _gate_down_up(i: int, fmt: str, n_embd: int, n_ff: int, w: str, n_expert: int = 0) -> list[TensorSpec]:
    """A block's gate, down and up projections, named by ``fmt`` (``ffn_{}``, ``ffn_{}_exps``, ``ffn_{}_shexp``);
    ``n_expert``: one of each per expert."""
    e = (n_expert,) if n_expert else ()
    return [
        TensorSpec(f"blk.{i}.{fmt.format('gate')}.weight", (n_embd, n_ff, *e), w),
        TensorSpec(f"blk.{i}.{fmt.format('down')}.weight", (n_ff, n_embd, *e), w),
        TensorSpec(f"blk.{i}.{fmt.format('up')}.weight", (n_embd, n_ff, *e), w),
    ]


def _io(n_embd: int, n_vocab: int, w: str, tied: bool) -> list[TensorSpec]:
    ts = [TensorSpec("token_embd.weight", (n_embd, n_vocab), w), TensorSpec("output_norm.weight", (n_embd,))]
    if not tied:
        ts.append(TensorSpec("output.weight", (n_embd, n_vocab), w))
    return ts


def dense(
    *,
    arch: str = "llama",
    name: str = "dense",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_dim: int | None = None,
    n_ff: int = 512,
    n_vocab: int = 512,
    ctx: int = 8192,
    w: str = "f16",
    tied: bool = False,
) -> Shape:
    """llama / qwen3 / qwen2-style dense GQA transformer (llama.cpp, qwen3.cpp load_arch_tensors)."""
    hd = head_dim or n_embd // n_head
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd,
        f"{arch}.rope.dimension_count": hd,
        f"{arch}.rope.freq_base": 500000.0,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, tied)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, w)
        if arch == "qwen3":
            ts += [
                TensorSpec(f"blk.{i}.attn_k_norm.weight", (hd,)),
                TensorSpec(f"blk.{i}.attn_q_norm.weight", (hd,)),
            ]
        ts += _ffn(i, n_embd, n_ff, w)
    return Shape(arch, kv, ts)


def moe(
    *,
    name: str = "moe",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_vocab: int = 512,
    ctx: int = 8192,
    w: str = "f16",
) -> Shape:
    """qwen3moe (src/models/qwen3moe.cpp)."""
    arch = "qwen3moe"
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff_exp * n_expert_used,
        f"{arch}.expert_feed_forward_length": n_ff_exp,
        f"{arch}.expert_count": n_expert,
        f"{arch}.expert_used_count": n_expert_used,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.freq_base": 1000000.0,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * head_dim, n_head_kv * head_dim, n_head * head_dim, w)
        ts += [
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
            TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), w),
            TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), w),
            TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), w),
        ]
    return Shape(arch, kv, ts)


def gemma3(
    *,
    name: str = "gemma3",
    n_layer: int = 6,
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int = 1,
    head_dim: int = 64,
    n_ff: int = 512,
    n_vocab: int = 512,
    ctx: int = 32768,
    sliding_window: int = 512,
    w: str = "f16",
) -> Shape:
    """gemma3 with interleaved sliding-window attention (5 SWA : 1 global, src/models/gemma3.cpp)."""
    arch = "gemma3"
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.sliding_window": sliding_window,
        f"{arch}.rope.freq_base": 1000000.0,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, True)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * head_dim, n_head_kv * head_dim, n_head * head_dim, w)
        ts += [
            TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
        ]
        ts += _ffn(i, n_embd, n_ff, w)
        ts.append(TensorSpec(f"blk.{i}.post_ffw_norm.weight", (n_embd,)))
    return Shape(arch, kv, ts)


def deepseek2(
    *,
    name: str = "mla",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 4,
    kv_lora_rank: int = 128,
    rope_dim: int = 32,
    nope_dim: int = 64,
    v_dim: int = 64,
    n_dense_lead: int = 1,
    q_lora_rank: int = 192,
    n_ff: int = 512,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_vocab: int = 512,
    ctx: int = 16384,
    w: str = "f16",
    dsa: bool = False,
    indexer_heads: int = 4,
    indexer_dim: int = 64,
    indexer_top_k: int = 64,
) -> Shape:
    """DeepSeek-V3 style MLA with q LoRA and split attn_k_b/attn_v_b (src/models/deepseek2.cpp); with
    ``dsa`` the DeepSeek-V3.2 sparse-attention variant with its lightning indexer (deepseek32.cpp)."""
    arch = "deepseek32" if dsa else "deepseek2"
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    k_mla = nope_dim + rope_dim
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.expert_feed_forward_length": n_ff_exp,
        f"{arch}.expert_count": n_expert,
        f"{arch}.expert_used_count": n_expert_used,
        f"{arch}.expert_shared_count": 1,
        f"{arch}.leading_dense_block_count": n_dense_lead,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": 1,
        f"{arch}.attention.key_length": kv_lora_rank + rope_dim,
        f"{arch}.attention.value_length": kv_lora_rank,
        f"{arch}.attention.key_length_mla": k_mla,
        f"{arch}.attention.value_length_mla": v_dim,
        f"{arch}.attention.kv_lora_rank": kv_lora_rank,
        f"{arch}.attention.q_lora_rank": q_lora_rank,
        f"{arch}.rope.dimension_count": rope_dim,
    })  # fmt: skip
    if dsa:
        kv.update({
            f"{arch}.attention.indexer.head_count": indexer_heads,
            f"{arch}.attention.indexer.key_length": indexer_dim,
            f"{arch}.attention.indexer.top_k": indexer_top_k,
            f"{arch}.expert_gating_func": 2,
        })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        if dsa:
            ts += [
                TensorSpec(f"blk.{i}.indexer.k_norm.weight", (indexer_dim,)),
                TensorSpec(f"blk.{i}.indexer.k_norm.bias", (indexer_dim,)),
                TensorSpec(f"blk.{i}.indexer.proj.weight", (n_embd, indexer_heads), w),
                TensorSpec(f"blk.{i}.indexer.attn_k.weight", (n_embd, indexer_dim), w),
                TensorSpec(f"blk.{i}.indexer.attn_q_b.weight", (q_lora_rank, indexer_heads * indexer_dim), w),
            ]
        ts += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.attn_q_a_norm.weight", (q_lora_rank,)),
            TensorSpec(f"blk.{i}.attn_kv_a_norm.weight", (kv_lora_rank,)),
            TensorSpec(f"blk.{i}.attn_q_a.weight", (n_embd, q_lora_rank), w),
            TensorSpec(f"blk.{i}.attn_q_b.weight", (q_lora_rank, n_head * k_mla), w),
            TensorSpec(f"blk.{i}.attn_kv_a_mqa.weight", (n_embd, kv_lora_rank + rope_dim), w),
            TensorSpec(f"blk.{i}.attn_k_b.weight", (nope_dim, kv_lora_rank, n_head), w),
            TensorSpec(f"blk.{i}.attn_v_b.weight", (kv_lora_rank, v_dim, n_head), w),
            TensorSpec(f"blk.{i}.attn_output.weight", (n_head * v_dim, n_embd), w),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
        ]
        if i < n_dense_lead:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), w),
                TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
                TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), w),
            ]
        else:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
                TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_gate_shexp.weight", (n_embd, n_ff_exp), w),
                TensorSpec(f"blk.{i}.ffn_down_shexp.weight", (n_ff_exp, n_embd), w),
                TensorSpec(f"blk.{i}.ffn_up_shexp.weight", (n_embd, n_ff_exp), w),
            ]
    return Shape(arch, kv, ts)


def _hc_head(n_embd: int, hc_mult: int) -> list[TensorSpec]:
    """The hyper-connection mix before a DeepSeek-V4 head (deepseek4.cpp, dflash.cpp:186-188)."""
    return [
        TensorSpec("output_hc_fn.weight", (hc_mult * n_embd, hc_mult)),
        TensorSpec("output_hc_base.weight", (hc_mult,)),
        TensorSpec("output_hc_scale.weight", (1,)),
    ]


def _dsv4_block(
    i: int, n_embd: int, n_head: int, head_dim: int, q_lora_rank: int, o_groups: int, o_lora_rank: int,
    hc_mult: int, n_expert: int, n_ff_exp: int, w: str, *, hashed: bool = False,
) -> list[TensorSpec]:  # fmt: skip
    """One DeepSeek-V4 block without its compressor: attention with sinks and grouped low-rank output,
    the hyper-connections around attention and FFN, routed experts and the shared one."""
    hc_dim, mix = hc_mult * n_embd, (2 + hc_mult) * hc_mult
    ts = [
        TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
        TensorSpec(f"blk.{i}.attn_sinks.weight", (n_head,)),
        TensorSpec(f"blk.{i}.attn_q_a.weight", (n_embd, q_lora_rank), w),
        TensorSpec(f"blk.{i}.attn_q_a_norm.weight", (q_lora_rank,)),
        TensorSpec(f"blk.{i}.attn_q_b.weight", (q_lora_rank, n_head * head_dim), w),
        TensorSpec(f"blk.{i}.attn_kv.weight", (n_embd, head_dim), w),
        TensorSpec(f"blk.{i}.attn_kv_a_norm.weight", (head_dim,)),
        TensorSpec(f"blk.{i}.attn_output_a.weight", (n_head * head_dim // o_groups, o_lora_rank * o_groups), w),
        TensorSpec(f"blk.{i}.attn_output_b.weight", (o_groups * o_lora_rank, n_embd), w),
    ]
    for part in ("attn", "ffn"):
        ts += [
            TensorSpec(f"blk.{i}.hc_{part}_fn.weight", (hc_dim, mix)),
            TensorSpec(f"blk.{i}.hc_{part}_base.weight", (mix,)),
            TensorSpec(f"blk.{i}.hc_{part}_scale.weight", (3,)),
        ]
    ts += [TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert))]
    if not hashed:
        ts += [TensorSpec(f"blk.{i}.exp_probs_b.bias", (n_expert,))]
    return [
        *ts,
        TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
        TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), w),
        TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), w),
        TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), w),
        TensorSpec(f"blk.{i}.ffn_gate_shexp.weight", (n_embd, n_ff_exp), w),
        TensorSpec(f"blk.{i}.ffn_down_shexp.weight", (n_ff_exp, n_embd), w),
        TensorSpec(f"blk.{i}.ffn_up_shexp.weight", (n_embd, n_ff_exp), w),
    ]


def _dsv4_kv(
    arch: str, n_layer: int, n_head: int, head_dim: int, rope_dim: int, q_lora_rank: int, o_groups: int,
    o_lora_rank: int, n_expert: int, n_expert_used: int, n_ff_exp: int, window: int, hc_mult: int,
) -> dict[str, Any]:  # fmt: skip
    """The DeepSeek-V4 block keys a model and a DSpark drafter on its backbone both carry
    (deepseek4.cpp:19-80, dflash.cpp:52-90)."""
    return {
        f"{arch}.feed_forward_length": n_ff_exp,
        f"{arch}.expert_feed_forward_length": n_ff_exp,
        f"{arch}.expert_count": n_expert,
        f"{arch}.expert_used_count": n_expert_used,
        f"{arch}.expert_shared_count": 1,
        f"{arch}.expert_weights_scale": 1.5,
        f"{arch}.expert_weights_norm": True,
        f"{arch}.expert_gating_func": 4,  # sqrt-softplus (llama-hparams.h:21)
        f"{arch}.swiglu_clamp_exp": [10.0] * n_layer,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": 1,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.q_lora_rank": q_lora_rank,
        f"{arch}.attention.sliding_window": window,
        f"{arch}.attention.output_group_count": o_groups,
        f"{arch}.attention.output_lora_rank": o_lora_rank,
        f"{arch}.hyper_connection.count": hc_mult,
        f"{arch}.hyper_connection.sinkhorn_iterations": 20,
        f"{arch}.hyper_connection.epsilon": 1e-6,
        f"{arch}.rope.dimension_count": rope_dim,
        f"{arch}.rope.freq_base": 10000.0,
    }


def deepseek4(
    *,
    name: str = "dsv4",
    n_layer: int = 4,
    n_embd: int = 512,
    n_head: int = 8,
    head_dim: int = 128,
    rope_dim: int = 64,
    q_lora_rank: int = 256,
    o_groups: int = 2,
    o_lora_rank: int = 128,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 256,
    window: int = 128,
    ratios: tuple[int, ...] = (0, 4, 128, 4),
    indexer_heads: int = 4,
    indexer_dim: int = 64,
    indexer_top_k: int = 64,
    hc_mult: int = 4,
    n_hash: int = 1,
    n_vocab: int = 4096,
    ctx: int = 65536,
    w: str = "q8_0",
) -> Shape:
    """DeepSeek-V4 (src/models/deepseek4.cpp load_arch_tensors): one K per position (``attn_kv``), a
    sliding window on every layer, per-layer compression (ratio 4: with a lightning indexer, 128: heavy),
    hyper-connections around attention and FFN and before the head, grouped low-rank output, hash-routed
    leading layers (``tid2eid``) and sqrt-softplus routing with a shared expert."""
    arch = "deepseek4"
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    ratio_list = list(ratios[:n_layer]) + [0] * max(0, n_layer - len(ratios))
    kv.update(_dsv4_kv(arch, n_layer, n_head, head_dim, rope_dim, q_lora_rank, o_groups, o_lora_rank, n_expert,
                       n_expert_used, n_ff_exp, window, hc_mult))  # fmt: skip
    kv.update({
        f"{arch}.swiglu_clamp_shexp": [10.0] * n_layer,
        f"{arch}.attention.indexer.head_count": indexer_heads,
        f"{arch}.attention.indexer.key_length": indexer_dim,
        f"{arch}.attention.indexer.top_k": indexer_top_k,
        f"{arch}.attention.compress_ratios": ratio_list,
        f"{arch}.attention.compress_rope_freq_base": 160000.0,
        f"{arch}.hash_layer_count": n_hash,
        f"{arch}.embedding_length_out": n_embd * hc_mult,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False) + _hc_head(n_embd, hc_mult)
    for i in range(n_layer):
        ratio = ratio_list[i]
        extra = []
        if ratio:
            coff = 2 if ratio == 4 else 1
            extra += [
                TensorSpec(f"blk.{i}.attn_compressor_kv.weight", (n_embd, coff * head_dim), w),
                TensorSpec(f"blk.{i}.attn_compressor_gate.weight", (n_embd, coff * head_dim), w),
                TensorSpec(f"blk.{i}.attn_compressor_ape.weight", (coff * head_dim, ratio)),
                TensorSpec(f"blk.{i}.attn_compressor_norm.weight", (head_dim,)),
            ]
            if ratio == 4:
                extra += [
                    TensorSpec(f"blk.{i}.indexer.proj.weight", (n_embd, indexer_heads), w),
                    TensorSpec(f"blk.{i}.indexer.attn_q_b.weight", (q_lora_rank, indexer_heads * indexer_dim), w),
                    TensorSpec(f"blk.{i}.indexer_compressor_kv.weight", (n_embd, 2 * indexer_dim), w),
                    TensorSpec(f"blk.{i}.indexer_compressor_gate.weight", (n_embd, 2 * indexer_dim), w),
                    TensorSpec(f"blk.{i}.indexer_compressor_ape.weight", (2 * indexer_dim, ratio)),
                    TensorSpec(f"blk.{i}.indexer_compressor_norm.weight", (indexer_dim,)),
                ]
        if i < n_hash:
            extra += [TensorSpec(f"blk.{i}.ffn_gate_tid2eid.weight", (n_expert_used, n_vocab), "i32")]
        ts += _dsv4_block(i, n_embd, n_head, head_dim, q_lora_rank, o_groups, o_lora_rank, hc_mult, n_expert,
                          n_ff_exp, w, hashed=i < n_hash) + extra  # fmt: skip
    return Shape(arch, kv, ts)


def dspark_dsv4(
    *,
    n_layer: int = 2,
    n_embd: int = 512,
    n_head: int = 8,
    head_dim: int = 128,
    rope_dim: int = 64,
    q_lora_rank: int = 256,
    o_groups: int = 2,
    o_lora_rank: int = 128,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 256,
    window: int = 64,
    hc_mult: int = 4,
    n_vocab: int = 4096,
    block_size: int = 8,
    target_layers: tuple[int, ...] = (1, 2, 3),
    markov_rank: int = 64,
    w: str = "q8_0",
) -> Shape:
    """A DSpark drafter on the DeepSeek-V4 backbone (dflash.cpp:52-90, 179-230; conversion/deepseek.py
    DeepseekV4DSparkModel): full DeepSeek-V4 blocks without compression, one uniform sliding window (the
    draft's KV ring), the target's embeddings and head, the Markov and confidence heads. Defaults: the
    dimensions of ``deepseek4()``."""
    arch = "dflash"
    kv = _base_kv(arch, "dspark dsv4 (shape)", n_layer, n_embd, 65536, n_vocab)
    kv.update(_dsv4_kv(arch, n_layer, n_head, head_dim, rope_dim, q_lora_rank, o_groups, o_lora_rank, n_expert,
                       n_expert_used, n_ff_exp, window, hc_mult))  # fmt: skip
    kv.update({
        f"{arch}.attention.compress_ratios": [0] * n_layer,
        f"{arch}.target_layers": list(target_layers),
        f"{arch}.block_size": block_size,
        f"{arch}.has_confidence_head": True,
    })  # fmt: skip
    ts = [
        TensorSpec("fc.weight", (len(target_layers) * n_embd, n_embd), w),
        TensorSpec("enc.output_norm.weight", (n_embd,)),
        TensorSpec("output_norm.weight", (n_embd,)),
        TensorSpec("markov_w1.weight", (markov_rank, n_vocab), w),
        TensorSpec("markov_w2.weight", (markov_rank, n_vocab), w),
        TensorSpec("conf_proj.weight", (n_embd + markov_rank, 1)),
        TensorSpec("conf_proj.bias", (1,)),
        *_hc_head(n_embd, hc_mult),
    ]
    for i in range(n_layer):
        ts += _dsv4_block(i, n_embd, n_head, head_dim, q_lora_rank, o_groups, o_lora_rank, hc_mult, n_expert,
                          n_ff_exp, w)  # fmt: skip
    return Shape(arch, kv, ts)


def glm_dsa(*, indexer_types: tuple[int, ...] = (1, 1, 0, 0), n_nextn: int = 0, **kw: Any) -> Shape:
    """GLM-5 (glm-dsa.cpp): DeepSeek-V3.2's blocks with sigmoid routing by default and, per
    ``indexer_types``, layers that reuse the last full layer's top-k (no indexer tensors of their own);
    ``n_nextn`` MTP layers declared in the header whose tensors the file does not carry (trunk-only)."""
    base = deepseek2(dsa=True, n_layer=len(indexer_types), **kw)
    arch = "glm-dsa"
    kv = {k.replace("deepseek32.", f"{arch}."): v for k, v in base.kv.items() if k != "deepseek32.expert_gating_func"}
    kv[f"{arch}.attention.indexer.types"] = list(indexer_types)
    if n_nextn:
        kv[f"{arch}.block_count"] = len(indexer_types) + n_nextn
        kv[f"{arch}.nextn_predict_layers"] = n_nextn
    shared = {i for i, full in enumerate(indexer_types) if not full}
    ts = [t for t in base.tensors if not (".indexer." in t.name and int(t.name.split(".")[1]) in shared)]
    return Shape(arch, kv, ts)


def qwen35(
    *,
    name: str = "hybrid",
    n_layer: int = 8,
    n_nextn: int = 0,
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_ff: int = 512,
    d_conv: int = 4,
    d_state: int = 32,
    n_group: int = 2,
    dt_rank: int = 4,
    interval: int = 4,
    n_vocab: int = 512,
    ctx: int = 32768,
    n_expert: int = 0,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_ff_shexp: int = 256,
    w: str = "f16",
) -> Shape:
    """Qwen3.5 hybrid: gated delta-net layers with full attention every ``interval`` (qwen35.cpp); with
    ``n_expert``, Qwen3.5-MoE's routed experts and sigmoid-gated shared expert (qwen35moe.cpp)."""
    arch = "qwen35moe" if n_expert else "qwen35"
    n_all = n_layer + n_nextn
    kv = _base_kv(arch, name, n_all, n_embd, ctx, n_vocab)
    d_inner = d_state * dt_rank
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.dimension_count": head_dim // 4,
        f"{arch}.rope.dimension_sections": [head_dim // 16, head_dim // 16, head_dim // 16, 0],
        f"{arch}.ssm.conv_kernel": d_conv,
        f"{arch}.ssm.inner_size": d_inner,
        f"{arch}.ssm.state_size": d_state,
        f"{arch}.ssm.time_step_rank": dt_rank,
        f"{arch}.ssm.group_count": n_group,
        f"{arch}.full_attention_interval": interval,
    })  # fmt: skip
    if n_nextn:
        kv[f"{arch}.nextn_predict_layers"] = n_nextn
    if n_expert:
        kv.update({
            f"{arch}.expert_count": n_expert,
            f"{arch}.expert_used_count": n_expert_used,
            f"{arch}.expert_feed_forward_length": n_ff_exp,
            f"{arch}.expert_shared_feed_forward_length": n_ff_shexp,
        })  # fmt: skip
    key_dim = d_state * n_group
    value_dim = d_state * dt_rank
    ts = _io(n_embd, n_vocab, w, False)

    def full_attn(i: int) -> list[TensorSpec]:
        return [
            TensorSpec(f"blk.{i}.attn_q.weight", (n_embd, n_head * head_dim * 2), w),
            TensorSpec(f"blk.{i}.attn_k.weight", (n_embd, n_head_kv * head_dim), w),
            TensorSpec(f"blk.{i}.attn_v.weight", (n_embd, n_head_kv * head_dim), w),
            TensorSpec(f"blk.{i}.attn_output.weight", (n_head * head_dim, n_embd), w),
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (head_dim,)),
        ]

    for i in range(n_all):
        ts += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)),
        ]
        if i >= n_layer:
            ts += full_attn(i)
        elif (i + 1) % interval != 0:
            ts += [
                TensorSpec(f"blk.{i}.attn_qkv.weight", (n_embd, key_dim * 2 + value_dim), w),
                TensorSpec(f"blk.{i}.attn_gate.weight", (n_embd, value_dim), w),
                TensorSpec(f"blk.{i}.ssm_conv1d.weight", (d_conv, key_dim * 2 + value_dim)),
                TensorSpec(f"blk.{i}.ssm_dt.bias", (dt_rank,)),
                TensorSpec(f"blk.{i}.ssm_a", (dt_rank,)),
                TensorSpec(f"blk.{i}.ssm_beta.weight", (n_embd, dt_rank), w),
                TensorSpec(f"blk.{i}.ssm_alpha.weight", (n_embd, dt_rank), w),
                TensorSpec(f"blk.{i}.ssm_norm.weight", (d_state,)),
                TensorSpec(f"blk.{i}.ssm_out.weight", (value_dim, n_embd), w),
            ]
        else:
            ts += full_attn(i)
        if n_expert:
            ts += [TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32")]
            ts += _gate_down_up(i, "ffn_{}_exps", n_embd, n_ff_exp, w, n_expert)
            ts += [TensorSpec(f"blk.{i}.ffn_gate_inp_shexp.weight", (n_embd,), "f32")]
            ts += _gate_down_up(i, "ffn_{}_shexp", n_embd, n_ff_shexp, w)
        else:
            ts += _gate_down_up(i, "ffn_{}", n_embd, n_ff, w)
        if i >= n_layer:
            ts += [
                TensorSpec(f"blk.{i}.nextn.eh_proj.weight", (2 * n_embd, n_embd), w),
                TensorSpec(f"blk.{i}.nextn.enorm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.nextn.hnorm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.nextn.shared_head_norm.weight", (n_embd,)),
            ]
    return Shape(arch, kv, ts)


def qwen35_mtp_2b() -> Shape:
    """A dense Qwen3.5 hybrid with one NextN (MTP) layer and a real vocabulary: 24 layers, 2048 embd, Q4_K."""
    dims = {"n_layer": 24, "n_nextn": 1, "n_embd": 2048, "n_head": 16, "n_head_kv": 2, "head_dim": 256, "n_ff": 6144}
    return qwen35(name="Qwen3.5-style MTP", n_vocab=151936, w="q4_K", **dims)


def qwen3next(*, legacy_qkvz: bool = True, **kw: Any) -> Shape:
    """Qwen3-Next (qwen3next.cpp): Qwen3.5-MoE's blocks with one beta/alpha projection (ssm_ba),
    the query/key/value/gate projection fused into ``ssm_in`` (``legacy_qkvz``, the GGUFs converted so far)
    or split as Qwen3.5's, and plain (not multi-section) rope."""
    kw.setdefault("n_expert", 8)
    base = qwen35(**kw)
    arch = "qwen3next"
    kv = {k.replace("qwen35moe.", f"{arch}."): v for k, v in base.kv.items() if not k.endswith("dimension_sections")}
    n_embd, dt_rank = kv[f"{arch}.embedding_length"], kv[f"{arch}.ssm.time_step_rank"]
    w = next(t.type for t in base.tensors if t.name == "output.weight")
    ts: list[TensorSpec] = []
    for t in base.tensors:
        layer, _, name = t.name.partition(".")[2].partition(".")
        if name == "ssm_beta.weight":
            ts.append(TensorSpec(f"blk.{layer}.ssm_ba.weight", (n_embd, 2 * dt_rank), w))
        elif legacy_qkvz and name == "attn_qkv.weight":  # q, k, v and z: the value width twice
            ts.append(TensorSpec(f"blk.{layer}.ssm_in.weight", (n_embd, t.shape[1] + kv[f"{arch}.ssm.inner_size"]), w))
        elif name != "ssm_alpha.weight" and not (legacy_qkvz and name == "attn_gate.weight"):
            ts.append(t)
    return Shape(arch, kv, ts)


def _ssm_kv(
    arch: str,
    name: str,
    n_layer: int,
    n_embd: int,
    ctx: int,
    n_vocab: int,
    d_conv: int,
    d_inner: int,
    d_state: int,
    dt_rank: int,
) -> dict[str, Any]:
    """The metadata every Mamba generation reads (no attention, no FFN; the SSM's sizes)."""
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": 0,
        f"{arch}.attention.head_count": 0,
        f"{arch}.ssm.conv_kernel": d_conv,
        f"{arch}.ssm.inner_size": d_inner,
        f"{arch}.ssm.state_size": d_state,
        f"{arch}.ssm.time_step_rank": dt_rank,
    })  # fmt: skip
    return kv


def mamba(
    *,
    name: str = "mamba",
    n_layer: int = 4,
    n_embd: int = 256,
    d_conv: int = 4,
    d_state: int = 16,
    dt_rank: int = 16,
    n_vocab: int = 512,
    ctx: int = 1048576,
    w: str = "f16",
    dt_b_c_rms: bool = False,
) -> Shape:
    """Pure recurrent Mamba (src/models/mamba.cpp); ``dt_b_c_rms``: Falcon-Mamba's norms on dt, B and C."""
    arch = "mamba"
    d_inner = 2 * n_embd
    kv = _ssm_kv(arch, name, n_layer, n_embd, ctx, n_vocab, d_conv, d_inner, d_state, dt_rank)
    if dt_b_c_rms:
        kv[f"{arch}.ssm.dt_b_c_rms"] = True
    ts = _io(n_embd, n_vocab, w, True)
    for i in range(n_layer):
        ts += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ssm_in.weight", (n_embd, 2 * d_inner), w),
            TensorSpec(f"blk.{i}.ssm_conv1d.weight", (d_conv, d_inner)),
            TensorSpec(f"blk.{i}.ssm_conv1d.bias", (d_inner,)),
            TensorSpec(f"blk.{i}.ssm_x.weight", (d_inner, dt_rank + 2 * d_state), w),
            TensorSpec(f"blk.{i}.ssm_dt.weight", (dt_rank, d_inner), w),
            TensorSpec(f"blk.{i}.ssm_dt.bias", (d_inner,)),
            TensorSpec(f"blk.{i}.ssm_a", (d_state, d_inner)),
            TensorSpec(f"blk.{i}.ssm_d", (d_inner,)),
            TensorSpec(f"blk.{i}.ssm_out.weight", (d_inner, n_embd), w),
        ]
    return Shape(arch, kv, ts)


def mamba2(
    *,
    name: str = "mamba2",
    n_layer: int = 4,
    n_embd: int = 256,
    d_inner: int = 512,
    d_state: int = 16,
    n_group: int = 1,
    n_head: int = 8,
    d_conv: int = 4,
    n_vocab: int = 512,
    ctx: int = 1048576,
    w: str = "f16",
) -> Shape:
    """Pure recurrent Mamba-2 (src/models/mamba2.cpp load_arch_tensors): one in_proj of
    2 d_inner + 2 n_group d_state + n_head, a conv over d_inner + 2 n_group d_state, a grouped norm."""
    arch = "mamba2"
    conv_dim = d_inner + 2 * n_group * d_state
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_head
    kv = _ssm_kv(arch, name, n_layer, n_embd, ctx, n_vocab, d_conv, d_inner, d_state, n_head)
    kv[f"{arch}.ssm.group_count"] = n_group
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        ts += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ssm_in.weight", (n_embd, d_in_proj), w),
            TensorSpec(f"blk.{i}.ssm_conv1d.weight", (d_conv, conv_dim)),
            TensorSpec(f"blk.{i}.ssm_conv1d.bias", (conv_dim,)),
            TensorSpec(f"blk.{i}.ssm_dt.bias", (n_head,)),
            TensorSpec(f"blk.{i}.ssm_a", (1, n_head)),
            TensorSpec(f"blk.{i}.ssm_d", (1, n_head)),
            TensorSpec(f"blk.{i}.ssm_norm.weight", (d_inner // n_group, n_group)),
            TensorSpec(f"blk.{i}.ssm_out.weight", (d_inner, n_embd), w),
        ]
    return Shape(arch, kv, ts)


def mamba_codestral_7b(w: str = "q8_0") -> Shape:
    """mistralai/Mamba-Codestral-7B-v0.1: 64 layers, 4096 embd, d_inner 8192, d_state 128, 8 groups, 128 heads."""
    return mamba2(name="Mamba-Codestral-7B (shape)", n_layer=64, n_embd=4096, d_inner=8192, d_state=128, n_group=8,
                  n_head=128, n_vocab=32768, w=w)  # fmt: skip


# ---- shape-faithful copies of public models (published config.json values) ----


def llama31_8b(w: str = "q4_K") -> Shape:
    """meta-llama/Llama-3.1-8B: 32 layers, 4096 embd, 32 heads, 8 KV heads, 14336 FFN, 128256 vocab."""
    return dense(arch="llama", name="Llama-3.1-8B (shape)", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
                 n_ff=14336, n_vocab=128256, ctx=131072, w=w)  # fmt: skip


def qwen3_8b(w: str = "q4_K") -> Shape:
    """Qwen/Qwen3-8B: 36 layers, 4096 embd, 32 heads, 8 KV heads (head 128), 12288 FFN, 151936 vocab."""
    return dense(arch="qwen3", name="Qwen3-8B (shape)", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8,
                 head_dim=128, n_ff=12288, n_vocab=151936, ctx=40960, w=w)  # fmt: skip


def gemma3_4b(w: str = "q4_K") -> Shape:
    """google/gemma-3-4b-it (text): 34 layers, 2560 embd, 8 heads, 4 KV heads of 256, 10240 FFN, SWA 1024."""
    return gemma3(name="Gemma-3-4B (shape)", n_layer=34, n_embd=2560, n_head=8, n_head_kv=4, head_dim=256,
                  n_ff=10240, n_vocab=262144, ctx=131072, sliding_window=1024, w=w)  # fmt: skip


def eagle3(
    *,
    n_embd: int = 4096,
    n_target: int = 4096,
    n_head: int = 32,
    n_head_kv: int = 8,
    head_dim: int = 128,
    n_ff: int = 12288,
    n_vocab: int = 151936,
    target_layers: tuple[int, int, int] = (2, 18, 33),
    w: str = "q8_0",
) -> Shape:
    """An EAGLE3 drafter (src/models/eagle3.cpp load_arch_tensors): the fused target features' projection
    (fc), one block whose attention reads the doubled input (token rows and hidden state), its own head;
    the target's token embeddings. Defaults: the shape of an EAGLE3 head for Qwen3-8B."""
    arch = "eagle3"
    kv = _base_kv(arch, "eagle3 (shape)", 1, n_embd, 40960, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.target_layers": list(target_layers),
        f"{arch}.target_hidden_size": n_target,
    })  # fmt: skip
    q, k = n_head * head_dim, n_head_kv * head_dim
    ts = [
        TensorSpec("fc.weight", (3 * n_target, n_embd), w),
        TensorSpec("output_norm.weight", (n_embd,)),
        TensorSpec("output.weight", (n_embd, n_vocab), w),
        TensorSpec("blk.0.attn_norm.weight", (n_embd,)),
        TensorSpec("blk.0.attn_norm_2.weight", (n_embd,)),
        TensorSpec("blk.0.attn_q.weight", (2 * n_embd, q), w),
        TensorSpec("blk.0.attn_k.weight", (2 * n_embd, k), w),
        TensorSpec("blk.0.attn_v.weight", (2 * n_embd, k), w),
        TensorSpec("blk.0.attn_output.weight", (q, n_embd), w),
        TensorSpec("blk.0.ffn_norm.weight", (n_embd,)),
        TensorSpec("blk.0.ffn_gate.weight", (n_embd, n_ff), w),
        TensorSpec("blk.0.ffn_down.weight", (n_ff, n_embd), w),
        TensorSpec("blk.0.ffn_up.weight", (n_embd, n_ff), w),
    ]
    return Shape(arch, kv, ts)


def dflash(
    *,
    n_layer: int = 5,
    n_embd: int = 4096,
    n_head: int = 32,
    n_head_kv: int = 8,
    head_dim: int = 128,
    n_ff: int = 12288,
    n_vocab: int = 151936,
    block_size: int = 16,
    target_layers: tuple[int, ...] = (1, 9, 17, 25, 33),
    markov_rank: int = 0,
    confidence: bool = True,
    own_head: bool = True,
    draft_vocab: int = 0,
    sample_from_anchor: bool | None = None,
    w: str = "q8_0",
) -> Shape:
    """A DFlash drafter (src/models/dflash.cpp load_arch_tensors; no conv/selector, no reduced vocabulary):
    the target features' projection (fc) and its norm, Qwen3-style blocks with Q/K norms, its own head
    (``own_head``; without it the target's output projection is used); ``draft_vocab`` > 0: a reduced
    draft vocabulary, its head over those rows and the ``d2t`` map to target ids; ``sample_from_anchor``
    False: a bonus anchor slot (SpecForge exports). ``markov_rank`` > 0 makes it a
    DSpark drafter (dflash.cpp:124-137): the Markov head's two low-rank tables and, with ``confidence``,
    the confidence projection (conversion/qwen.py DSparkModel: no lm_head at full vocabulary). Defaults:
    the shape of z-lab's DFlash drafter for Qwen3-8B."""
    arch = "dflash"
    kv = _base_kv(arch, "dflash (shape)", n_layer, n_embd, 40960, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.freq_base": 1000000.0,
        f"{arch}.target_layers": list(target_layers),
        f"{arch}.block_size": block_size,
    })  # fmt: skip
    q, k = n_head * head_dim, n_head_kv * head_dim
    ts = [
        TensorSpec("fc.weight", (len(target_layers) * n_embd, n_embd), w),
        TensorSpec("enc.output_norm.weight", (n_embd,)),
        TensorSpec("output_norm.weight", (n_embd,)),
    ]
    if own_head or draft_vocab:
        ts.append(TensorSpec("output.weight", (n_embd, draft_vocab or n_vocab), w))
    if draft_vocab:
        ts.append(TensorSpec("d2t", (draft_vocab,), "i64"))
    if sample_from_anchor is not None:
        kv[f"{arch}.sample_from_anchor"] = sample_from_anchor
    if markov_rank:
        kv[f"{arch}.has_confidence_head"] = confidence
        ts += [
            TensorSpec("markov_w1.weight", (markov_rank, n_vocab), w),
            TensorSpec("markov_w2.weight", (markov_rank, draft_vocab or n_vocab), w),
        ]
        if confidence:
            ts += [TensorSpec("conf_proj.weight", (n_embd + markov_rank, 1)), TensorSpec("conf_proj.bias", (1,))]
    for i in range(n_layer):
        ts += _attn(i, n_embd, q, k, q, w)
        ts += [
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (head_dim,)),
        ]
        ts += _ffn(i, n_embd, n_ff, w)
    return Shape(arch, kv, ts)


def dspark_qwen3_4b(**kw: Any) -> Shape:
    """A DSpark drafter for Qwen3-4B's shape (deepseek-ai/dspark_qwen3_4b_block7, converted as
    docs/speculative.md shows: 5 Qwen3 blocks over 5 target layers, block size 7, the target's head);
    the Markov rank (256) is ours: the checkpoint's config is not reachable here."""
    args: dict[str, Any] = dict(n_embd=2560, n_ff=9728, block_size=7, target_layers=(1, 9, 17, 25, 33),
                                markov_rank=256, own_head=False)  # fmt: skip
    return dflash(**{**args, **kw})


def qwen3_4b(w: str = "q4_K") -> Shape:
    """Qwen/Qwen3-4B: 36 layers, 2560 embd, 32 heads, 8 KV heads (head 128), 9728 FFN, tied embeddings."""
    return dense(arch="qwen3", name="Qwen3-4B (shape)", n_layer=36, n_embd=2560, n_head=32, n_head_kv=8,
                 head_dim=128, n_ff=9728, n_vocab=151936, ctx=40960, w=w, tied=True)  # fmt: skip


def qwen3_0_6b(w: str = "q8_0") -> Shape:
    """Qwen/Qwen3-0.6B: 28 layers, 1024 embd, 16 heads, 8 KV heads (head 128), 3072 FFN, tied embeddings."""
    return dense(arch="qwen3", name="Qwen3-0.6B (shape)", n_layer=28, n_embd=1024, n_head=16, n_head_kv=8,
                 head_dim=128, n_ff=3072, n_vocab=151936, ctx=40960, w=w, tied=True)  # fmt: skip


def glm4moe(
    *,
    name: str = "glm4moe",
    n_layer: int = 4,
    n_nextn: int = 1,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_ff: int = 512,
    n_dense_lead: int = 1,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_vocab: int = 512,
    ctx: int = 32768,
    w: str = "f16",
) -> Shape:
    """GLM-4.5 style MoE with a shared expert and NextN (MTP) blocks (src/models/glm4-moe.cpp)."""
    arch = "glm4moe"
    n_all = n_layer + n_nextn
    kv = _base_kv(arch, name, n_all, n_embd, ctx, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.expert_feed_forward_length": n_ff_exp,
        f"{arch}.expert_count": n_expert,
        f"{arch}.expert_used_count": n_expert_used,
        f"{arch}.expert_shared_count": 1,
        f"{arch}.leading_dense_block_count": n_dense_lead,
        f"{arch}.nextn_predict_layers": n_nextn,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.dimension_count": head_dim // 2,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_all):
        ts += _attn(i, n_embd, n_head * head_dim, n_head_kv * head_dim, n_head * head_dim, w)
        ts.append(TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)))
        if i >= n_dense_lead:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
                TensorSpec(f"blk.{i}.exp_probs_b.bias", (n_expert,)),
            ]
            ts += _gate_down_up(i, "ffn_{}_exps", n_embd, n_ff_exp, w, n_expert)
            ts += _gate_down_up(i, "ffn_{}_shexp", n_embd, n_ff_exp, w)
        else:
            ts += _gate_down_up(i, "ffn_{}", n_embd, n_ff, w)
        if i >= n_layer:
            ts += [
                TensorSpec(f"blk.{i}.nextn.eh_proj.weight", (2 * n_embd, n_embd), w),
                TensorSpec(f"blk.{i}.nextn.enorm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.nextn.hnorm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.nextn.shared_head_norm.weight", (n_embd,)),
            ]
    return Shape(arch, kv, ts)


def glm45_air(w: str = "q4_K") -> Shape:
    """zai-org/GLM-4.5-Air: 46 layers + 1 NextN, 4096 embd, 96 heads (8 KV, head 128), 128 experts (8 used)
    of 1408, one shared expert, first layer dense (10944), 151552 vocabulary, 131072 context."""
    return glm4moe(name="GLM-4.5-Air (shape)", n_layer=46, n_nextn=1, n_embd=4096, n_head=96, n_head_kv=8,
                   head_dim=128, n_ff=10944, n_dense_lead=1, n_expert=128, n_expert_used=8, n_ff_exp=1408,
                   n_vocab=151552, ctx=131072, w=w)  # fmt: skip


def siglip_mmproj(
    *,
    text_embd: int,
    name: str = "mmproj",
    projector: str = "gemma3",
    n_layer: int = 2,
    n_embd: int = 128,
    n_head: int = 4,
    n_ff: int = 256,
    image_size: int = 224,
    patch_size: int = 14,
    merge: int = 2,
    w: str = "f16",
) -> Shape:
    """A SigLIP vision tower with Gemma 3's projector (tools/mtmd/clip.cpp load_tensors, models/siglip.cpp):
    the kind of file ``--mmproj`` loads. ``text_embd`` must match the text model's n_embd."""
    n_pos = (image_size // patch_size) ** 2
    kv: dict[str, Any] = {
        "general.name": name,
        "clip.projector_type": projector,
        "clip.has_vision_encoder": True,
        "clip.use_gelu": True,
        "clip.vision.embedding_length": n_embd,
        "clip.vision.feed_forward_length": n_ff,
        "clip.vision.block_count": n_layer,
        "clip.vision.projection_dim": text_embd,
        "clip.vision.attention.head_count": n_head,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.image_size": image_size,
        "clip.vision.patch_size": patch_size,
        "clip.vision.projector.scale_factor": merge,
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
    }
    ts = [
        TensorSpec("v.patch_embd.weight", (patch_size, patch_size, 3, n_embd), w),
        TensorSpec("v.patch_embd.bias", (n_embd,)),
        TensorSpec("v.position_embd.weight", (n_embd, n_pos), w),
        TensorSpec("v.post_ln.weight", (n_embd,)),
        TensorSpec("v.post_ln.bias", (n_embd,)),
        TensorSpec("mm.input_projection.weight", (text_embd, n_embd), w),
        TensorSpec("mm.soft_emb_norm.weight", (n_embd,)),
    ]
    for i in range(n_layer):
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            ts.append(TensorSpec(f"v.blk.{i}.{t}.weight", (n_embd, n_embd), w))
            ts.append(TensorSpec(f"v.blk.{i}.{t}.bias", (n_embd,)))
        ts += [
            TensorSpec(f"v.blk.{i}.ln1.weight", (n_embd,)),
            TensorSpec(f"v.blk.{i}.ln1.bias", (n_embd,)),
            TensorSpec(f"v.blk.{i}.ln2.weight", (n_embd,)),
            TensorSpec(f"v.blk.{i}.ln2.bias", (n_embd,)),
            TensorSpec(f"v.blk.{i}.ffn_up.weight", (n_embd, n_ff), w),
            TensorSpec(f"v.blk.{i}.ffn_up.bias", (n_ff,)),
            TensorSpec(f"v.blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
            TensorSpec(f"v.blk.{i}.ffn_down.bias", (n_embd,)),
        ]
    return Shape("clip", kv, ts)


def gemma3_siglip_896(text_embd: int) -> Shape:
    """google/gemma-3-4b-it's vision tower: SigLIP So400m (27 layers, 1152 embd, 16 heads, 4304 FFN), 896 px."""
    return siglip_mmproj(text_embd=text_embd, name="gemma-3 mmproj (shape)", n_layer=27, n_embd=1152, n_head=16,
                         n_ff=4304, image_size=896, patch_size=14, merge=4)  # fmt: skip


def gpu(i: int, total_gib: float, free_gib: float | None = None, name: str | None = None) -> Device:
    """A GPU as the planner sees it (the NVML seam's output), described in GiB."""
    free = free_gib if free_gib is not None else total_gib
    return Device(f"CUDA{i}", name or f"gpu{i}", int(total_gib * GiB), int(free * GiB))

"""The factory's shape type, vocabularies, split files and the tensor blocks every builder shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llamafit.devices.machine import Device
from llamafit.gguf.ggml import by_name
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


def _heads_kv(arch: str, n_ff: int, n_head: int, n_head_kv: int, rope_dim: int) -> dict[str, Any]:
    """A transformer's FFN width, head counts and RoPE width."""
    return {
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.rope.dimension_count": rope_dim,
    }


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


def gpu(i: int, total_gib: float, free_gib: float | None = None, name: str | None = None) -> Device:
    """A GPU as the planner sees it (the NVML seam's output), described in GiB."""
    free = free_gib if free_gib is not None else total_gib
    return Device(f"CUDA{i}", name or f"gpu{i}", int(total_gib * GiB), int(free * GiB))

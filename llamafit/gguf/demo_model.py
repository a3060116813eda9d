"""The embedded demo model: a tiny llama-architecture GGUF that llama-server really runs.

It is written with ``gguf.GGUFWriter`` at first use into the user cache directory (seeded random
weights, a byte-level SentencePiece vocabulary), so ``llamafit demo`` needs no download. Its
answers are noise; what it demonstrates is the pipeline: plan, launch, ready, one request, stop.
"""

from __future__ import annotations

from pathlib import Path

from llamafit.gguf.writer import TensorSpec, ensure_gguf, spm_vocab, write_gguf
from llamafit.paths import cache_dir

DEMO_VERSION = 1
N_VOCAB = 384
N_EMBD = 128
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 256
N_LAYER = 4
N_CTX_TRAIN = 4096


def demo_tensors() -> list[TensorSpec]:
    head_dim = N_EMBD // N_HEAD
    kv = head_dim * N_HEAD_KV
    ts = [
        TensorSpec("token_embd.weight", (N_EMBD, N_VOCAB), "f16"),
        TensorSpec("output_norm.weight", (N_EMBD,), "f32"),
        TensorSpec("output.weight", (N_EMBD, N_VOCAB), "f16"),
    ]
    for i in range(N_LAYER):
        ts += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (N_EMBD,), "f32"),
            TensorSpec(f"blk.{i}.attn_q.weight", (N_EMBD, N_EMBD), "f16"),
            TensorSpec(f"blk.{i}.attn_k.weight", (N_EMBD, kv), "f16"),
            TensorSpec(f"blk.{i}.attn_v.weight", (N_EMBD, kv), "f16"),
            TensorSpec(f"blk.{i}.attn_output.weight", (N_EMBD, N_EMBD), "f16"),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (N_EMBD,), "f32"),
            TensorSpec(f"blk.{i}.ffn_gate.weight", (N_EMBD, N_FF), "f16"),
            TensorSpec(f"blk.{i}.ffn_up.weight", (N_EMBD, N_FF), "f16"),
            TensorSpec(f"blk.{i}.ffn_down.weight", (N_FF, N_EMBD), "f16"),
        ]
    return ts


def demo_metadata() -> dict[str, object]:
    kv: dict[str, object] = {
        "general.name": "llamafit demo (random weights)",
        "general.file_type": 1,
        "llama.block_count": N_LAYER,
        "llama.context_length": N_CTX_TRAIN,
        "llama.embedding_length": N_EMBD,
        "llama.feed_forward_length": N_FF,
        "llama.attention.head_count": N_HEAD,
        "llama.attention.head_count_kv": N_HEAD_KV,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": N_EMBD // N_HEAD,
        "llama.vocab_size": N_VOCAB,
    }
    kv.update(spm_vocab(N_VOCAB))
    return kv


def ensure_demo_model(directory: Path | None = None) -> Path:
    """Return the demo GGUF, writing it first if needed or if the file there is damaged (``ensure_gguf``)."""
    path = (directory or cache_dir()) / f"llamafit-demo-v{DEMO_VERSION}.gguf"
    tensors = demo_tensors()
    return ensure_gguf(
        path,
        [t.name for t in tensors],
        lambda tmp: write_gguf(tmp, "llama", demo_metadata(), tensors, fill="random", seed=1234),
    )

"""The synthetic models the speed probe times: Llama-architecture GGUFs written with ``gguf.GGUFWriter`` into
the user cache, their tensor data a hole in the file (a few MB on disk; llama.cpp reads zeros, which time a
dense model's kernels as real weights do). Where routing matters (experts) the embeddings and the router
get seeded random values, so tokens pick different experts as they do in a real model.

* ``tiny-1``, ``tiny-9``: 1 and 9 layers of width 64: per-node overheads and the host's time per evaluation
  (their bytes and FLOPs are negligible);
* ``stream-<type>``: weights of one ggml type, at least ``STREAM_BYTES`` of them read per token (past any
  cache): the rate generation streams that type from memory;
* the model's **twin** (:func:`twin_of`): two layers with the model's own widths, heads, experts and weight
  types, and its per-head q/k norms where it has them: the batched matmul rate (and the cache-resident mat-vec
  rate) at the shapes that will run;
* the model's **attention twin**: as many attention layers as the model has, with its heads, KV heads and
  head sizes (and a width and FFN too small to matter): attention over a filled cache.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from llamafit.gguf.ggml import by_name, nbytes
from llamafit.gguf.model import ModelInfo
from llamafit.gguf.writer import TensorSpec, ensure_gguf, spm_vocab, write_gguf
from llamafit.memory.context import attention_layers
from llamafit.speed.work import expert_share

VERSION = 1
N_VOCAB = 320
STREAM_BYTES = 384 << 20
ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
MAX_TWIN_BYTES = 4 << 30


@dataclass(frozen=True)
class Twin:
    """A Llama-architecture stand-in: the layers' shapes and types, none of their values. With ``qk_norm`` (a
    model that normalises each attention head's q and k, as Qwen3 does) it is written as ``qwen3`` or
    ``qwen3moe``: a Llama layer with those two norms (src/models/qwen3moe.cpp:36-37, 97), whose cost per row
    is a device's own (one kernel on a GPU; a lavapipe device takes about a millisecond a row)."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_ff: int  # the dense FFN's width, or each expert's
    n_expert: int = 0
    n_used: int = 0
    n_ff_shexp: int = 0
    types: tuple[tuple[str, str], ...] = field(default=tuple((r, "f16") for r in ROLES))
    qk_norm: bool = field(default=False, repr=False)  # out of repr: a Llama twin keeps its key

    @property
    def arch(self) -> str:
        if not self.qk_norm:
            return "llama"
        return "qwen3moe" if self.n_expert else "qwen3"

    @property
    def extra_nodes(self) -> int:
        """Compute nodes a layer has beyond a Llama layer's: each norm is an RMS_NORM and its weight's MUL
        (llm_graph_context::build_norm, llama-graph.cpp:1640-1660)."""
        return 4 if self.qk_norm else 0

    def type_of(self, role: str) -> str:
        return dict(self.types).get(role, "f16")

    @property
    def key(self) -> str:
        """The twin's identity: what shapes and types it times (two models with the same layers share it)."""
        shape = repr(replace(self, name="")) + (" qk_norm" if self.qk_norm else "")
        return hashlib.sha256(shape.encode()).hexdigest()[:16]

    def tensors(self) -> list[TensorSpec]:
        q, k, v = self.n_head * self.head_k, self.n_head_kv * self.head_k, self.n_head_kv * self.head_v
        e, ff, ty = self.n_embd, self.n_ff, self.type_of
        out = [
            TensorSpec("token_embd.weight", (e, N_VOCAB), "f16"),
            TensorSpec("output_norm.weight", (e,)),
            TensorSpec("output.weight", (e, N_VOCAB), "f16"),
        ]
        for i in range(self.n_layer):
            if self.qk_norm:
                out += [
                    TensorSpec(f"blk.{i}.attn_q_norm.weight", (self.head_k,)),
                    TensorSpec(f"blk.{i}.attn_k_norm.weight", (self.head_k,)),
                ]
            out += [
                TensorSpec(f"blk.{i}.attn_norm.weight", (e,)),
                TensorSpec(f"blk.{i}.attn_q.weight", (e, q), ty("attn_q")),
                TensorSpec(f"blk.{i}.attn_k.weight", (e, k), ty("attn_k")),
                TensorSpec(f"blk.{i}.attn_v.weight", (e, v), ty("attn_v")),
                TensorSpec(f"blk.{i}.attn_output.weight", (self.n_head * self.head_v, e), ty("attn_output")),
                TensorSpec(f"blk.{i}.ffn_norm.weight", (e,)),
            ]
            if self.n_expert:
                n = self.n_expert
                out += [
                    TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (e, n)),
                    TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (e, ff, n), ty("ffn_gate")),
                    TensorSpec(f"blk.{i}.ffn_up_exps.weight", (e, ff, n), ty("ffn_up")),
                    TensorSpec(f"blk.{i}.ffn_down_exps.weight", (ff, e, n), ty("ffn_down")),
                ]
                if self.n_ff_shexp:
                    sh = self.n_ff_shexp
                    out += [
                        TensorSpec(f"blk.{i}.ffn_gate_shexp.weight", (e, sh), ty("ffn_gate")),
                        TensorSpec(f"blk.{i}.ffn_up_shexp.weight", (e, sh), ty("ffn_up")),
                        TensorSpec(f"blk.{i}.ffn_down_shexp.weight", (sh, e), ty("ffn_down")),
                    ]
            else:
                out += [
                    TensorSpec(f"blk.{i}.ffn_gate.weight", (e, ff), ty("ffn_gate")),
                    TensorSpec(f"blk.{i}.ffn_up.weight", (e, ff), ty("ffn_up")),
                    TensorSpec(f"blk.{i}.ffn_down.weight", (ff, e), ty("ffn_down")),
                ]
        return out

    def metadata(self) -> dict[str, object]:
        a = self.arch
        kv: dict[str, object] = {
            "general.name": f"llamafit speed probe {self.name}",
            f"{a}.block_count": self.n_layer,
            f"{a}.context_length": 8192,
            f"{a}.embedding_length": self.n_embd,
            f"{a}.feed_forward_length": self.n_ff,
            f"{a}.attention.head_count": self.n_head,
            f"{a}.attention.head_count_kv": self.n_head_kv,
            f"{a}.attention.key_length": self.head_k,
            f"{a}.attention.value_length": self.head_v,
            f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
            f"{a}.rope.dimension_count": self.head_k,
            f"{a}.vocab_size": N_VOCAB,
        }
        if self.n_expert:
            kv[f"{a}.expert_count"] = self.n_expert
            kv[f"{a}.expert_used_count"] = self.n_used
            kv[f"{a}.expert_feed_forward_length"] = self.n_ff
            if self.n_ff_shexp:
                kv[f"{a}.expert_shared_feed_forward_length"] = self.n_ff_shexp
        kv.update(spm_vocab(N_VOCAB))
        return kv

    def random_tensors(self) -> list[str]:
        return ["token_embd.weight", *(f"blk.{i}.ffn_gate_inp.weight" for i in range(self.n_layer) if self.n_expert)]

    def file_bytes(self) -> int:
        return sum(nbytes(by_name(t.type), t.shape) for t in self.tensors())


def _layer(t: Twin) -> list[TensorSpec]:
    return [s for s in t.tensors() if s.name.startswith("blk.0.")]


def streamed_bytes(t: Twin) -> float:
    """What one generated token reads of the twin's layers (experts: the share one token routes to) and its
    output matrix: the accounting of ``llamafit.speed.work``."""
    total = 2.0 * t.n_embd * N_VOCAB
    share = t.n_used / t.n_expert if t.n_expert else 1.0
    for s in _layer(t):
        if len(s.shape) >= 2:
            total += nbytes(by_name(s.type), s.shape) * (share if len(s.shape) == 3 else 1.0) * t.n_layer
    return total


def ffn_copied(t: Twin, tokens: int) -> float:
    """What a card is sent of the twin's FFN weights, held in host memory, for a ubatch of ``tokens`` tokens
    (op offload): the dense ones whole, of the experts those the ubatch routes to (``llamafit.speed.work``)."""
    share = expert_share(t.n_expert, t.n_used, tokens)
    return sum(
        nbytes(by_name(s.type), s.shape) * (share if len(s.shape) == 3 else 1.0)
        for s in t.tensors()
        if s.name.startswith("blk.") and ".ffn_" in s.name and len(s.shape) >= 2
    )


def matmul_flops(t: Twin, tokens: int) -> float:
    """The layers' matmul FLOPs for ``tokens`` tokens (experts: ``n_used`` per token)."""
    total = 0.0
    for s in _layer(t):
        if len(s.shape) >= 2:
            total += 2.0 * s.shape[0] * s.shape[1] * tokens * (t.n_used if len(s.shape) == 3 else 1)
    return total * t.n_layer


TINY = Twin("tiny-1", 1, 64, 2, 2, 32, 32, 128)
TINY9 = replace(TINY, name="tiny-9", n_layer=9)
_WIDE = Twin("stream", 1, 2048, 16, 4, 128, 128, 8192)


def stream(weight_type: str) -> Twin:
    """Dense layers of one type, enough of them to stream ``STREAM_BYTES`` per token."""
    one = replace(_WIDE, types=tuple((r, weight_type) for r in ROLES))
    n = max(1, math.ceil(STREAM_BYTES / streamed_bytes(one)))
    return replace(one, name=f"stream-{weight_type}", n_layer=n)


def writable(weight_type: str) -> bool:
    """A type llama.cpp can hold the probe's matrices in (its blocks divide their rows)."""
    try:
        t = by_name(weight_type)
    except KeyError:
        return False
    return t.blck == 1 or (2048 % t.blck == 0 and 512 % t.blck == 0)


def _type_at(model: ModelInfo, il: int, names: tuple[str, ...], default: str) -> str:
    shapes = {t.name: t for t in model.tensors}
    for n in names:
        if (t := shapes.get(f"blk.{il}.{n}.weight")) is not None:
            return t.info.type.name
    return default


def twin_of(model: ModelInfo) -> Twin | None:
    """The model's layers as a Llama twin (two layers of its widths and types, with its per-head q/k norms
    where it has them and no shared experts beside them), or None when its layers have no attention or FFN a
    Llama layer can stand for."""
    hp = model.hparams
    by_name_ = {t.name: t for t in model.tensors}
    att = [il for il in attention_layers(hp, mtp=False) if il < hp.n_layer and hp.n_head[il] > 0]
    if not att or hp.n_embd <= 0:
        return None
    ia = att[0]
    qt = _type_at(model, ia, ("attn_q", "attn_qkv", "attn_q_b", "attn_q_a"), "f16")
    kind_ff = [il for il in range(hp.n_layer) if f"blk.{il}.ffn_up_exps.weight" in by_name_] or [
        il for il in range(hp.n_layer) if f"blk.{il}.ffn_up.weight" in by_name_
    ]
    if not kind_ff:
        return None
    iff = kind_ff[0]
    up = by_name_.get(f"blk.{iff}.ffn_up_exps.weight") or by_name_[f"blk.{iff}.ffn_up.weight"]
    expert = len(up.info.shape) == 3
    shexp = by_name_.get(f"blk.{iff}.ffn_up_shexp.weight")
    ft = up.info.type.name
    types = {
        "attn_q": qt,
        "attn_k": _type_at(model, ia, ("attn_k", "attn_kv_a_mqa"), qt),
        "attn_v": _type_at(model, ia, ("attn_v", "attn_kv_b"), qt),
        "attn_output": _type_at(model, ia, ("attn_output",), qt),
        "ffn_gate": _type_at(model, iff, ("ffn_gate_exps", "ffn_gate"), ft),
        "ffn_up": ft,
        "ffn_down": _type_at(model, iff, ("ffn_down_exps", "ffn_down"), ft),
    }
    types = {r: (ty if writable(ty) else "f16") for r, ty in types.items()}
    t = Twin(
        "twin",
        2,
        hp.n_embd,
        hp.n_head[ia],
        max(1, hp.n_head_kv[ia]),
        hp.head_k_at(ia),
        hp.head_v_at(ia) or 1,
        up.info.shape[1],
        up.info.shape[2] if expert else 0,
        hp.n_expert_used if expert else 0,
        shexp.info.shape[1] if shexp is not None else 0,
        tuple(types.items()),
        _per_head_norms(model, ia) and shexp is None,
    )
    # as many layers as one token streams STREAM_BYTES of (a model's weights come from memory, not a
    # cache: a MoE's tokens route all over its experts), at most the model's own and MAX_TWIN_BYTES
    layer = (t.file_bytes() - _io_bytes(t)) / t.n_layer
    per_token = (streamed_bytes(t) - 2.0 * t.n_embd * N_VOCAB) / t.n_layer
    n = min(hp.n_layer, max(2, math.ceil(STREAM_BYTES / max(per_token, 1.0))))
    n = max(1, min(n, int(MAX_TWIN_BYTES // max(layer, 1.0))))
    t = replace(t, n_layer=n)
    return replace(t, name=f"twin-{t.key}")


def _per_head_norms(model: ModelInfo, il: int) -> bool:
    """Whether layer ``il`` normalises each head's q and k (a weight of one head's size; OLMo2's norm over the
    whole q is one row a token, as cheap as the layer's own norm)."""
    head = model.hparams.head_k_at(il)
    shapes = {t.name: t.info.shape for t in model.tensors}
    return all(shapes.get(f"blk.{il}.attn_{x}_norm.weight") == (head,) for x in "qk")


def _io_bytes(t: Twin) -> int:
    return sum(nbytes(by_name(s.type), s.shape) for s in t.tensors() if not s.name.startswith("blk."))


def attention_twin(model: ModelInfo) -> Twin | None:
    """The model's attention layers alone: its heads, KV heads and head sizes, as many layers as it has (its
    cache's size in memory, as the kernels see it), a width of one head group and a token-sized FFN."""
    hp = model.hparams
    att = [il for il in attention_layers(hp, mtp=False) if il < hp.n_layer and hp.n_head[il] > 0 and hp.has_kv(il)]
    if not att:
        return None
    ia = att[0]
    heads, kv = hp.n_head[ia], max(1, hp.n_head_kv[ia])
    t = Twin("attn", min(len(att), 64), 256, heads, kv, hp.head_k_at(ia), hp.head_v_at(ia) or 1, 256)
    return replace(t, name=f"attn-{t.key}")


def ensure(twin: Twin, directory: Path) -> Path:
    """The probe model's file, written first if needed or if the file there is damaged (``ensure_gguf``: a
    damaged twin would fail every measurement)."""
    tensors = twin.tensors()
    return ensure_gguf(
        directory / f"probe-v{VERSION}-{twin.name}.gguf",
        [t.name for t in tensors],
        lambda tmp: write_gguf(tmp, twin.arch, twin.metadata(), tensors, fill="sparse", random=twin.random_tensors()),
    )

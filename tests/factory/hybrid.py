"""Qwen3.5 and Qwen3-Next: gated delta-net layers beside gated attention (``llamafit.memory.graph.hybrid``)."""

from __future__ import annotations

from typing import Any

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape, _base_kv, _gate_down_up, _io


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

"""Mamba-1 and Mamba-2 (``llamafit.memory.graph.mamba``); their Mamba-2 layer, which the layered hybrids share."""

from __future__ import annotations

from typing import Any

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape, _base_kv, _io


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
    kv = _ssm_kv(arch, name, n_layer, n_embd, ctx, n_vocab, d_conv, d_inner, d_state, n_head)
    kv[f"{arch}.ssm.group_count"] = n_group
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        ts += mamba2_layer(i, n_embd, d_inner, d_state, n_group, n_head, d_conv, w)
    return Shape(arch, kv, ts)


def mamba2_layer(
    i: int, n_embd: int, d_inner: int, d_state: int, n_group: int, n_head: int, d_conv: int, w: str
) -> list[TensorSpec]:
    """A Mamba-2 mixer's tensors (mamba2.cpp, nemotron-h.cpp, granite-hybrid.cpp load_arch_tensors): one
    in_proj of 2 d_inner + 2 n_group d_state + n_head, a conv over d_inner + 2 n_group d_state, a grouped norm."""
    conv_dim = d_inner + 2 * n_group * d_state
    return [
        TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
        TensorSpec(f"blk.{i}.ssm_in.weight", (n_embd, conv_dim + d_inner + n_head), w),
        TensorSpec(f"blk.{i}.ssm_conv1d.weight", (d_conv, conv_dim)),
        TensorSpec(f"blk.{i}.ssm_conv1d.bias", (conv_dim,)),
        TensorSpec(f"blk.{i}.ssm_dt.bias", (n_head,)),
        TensorSpec(f"blk.{i}.ssm_a", (1, n_head)),
        TensorSpec(f"blk.{i}.ssm_d", (1, n_head)),
        TensorSpec(f"blk.{i}.ssm_norm.weight", (d_inner // n_group, n_group)),
        TensorSpec(f"blk.{i}.ssm_out.weight", (d_inner, n_embd), w),
    ]


def mamba2_kv(arch: str, d_conv: int, d_inner: int, d_state: int, n_head: int, n_group: int) -> dict[str, Any]:
    """The SSM sizes a hybrid's Mamba-2 layers read."""
    return {
        f"{arch}.ssm.conv_kernel": d_conv,
        f"{arch}.ssm.inner_size": d_inner,
        f"{arch}.ssm.state_size": d_state,
        f"{arch}.ssm.time_step_rank": n_head,
        f"{arch}.ssm.group_count": n_group,
    }


def mamba_codestral_7b(w: str = "q8_0") -> Shape:
    """mistralai/Mamba-Codestral-7B-v0.1: 64 layers, 4096 embd, d_inner 8192, d_state 128, 8 groups, 128 heads."""
    return mamba2(name="Mamba-Codestral-7B (shape)", n_layer=64, n_embd=4096, d_inner=8192, d_state=128, n_group=8,
                  n_head=128, n_vocab=32768, w=w)  # fmt: skip

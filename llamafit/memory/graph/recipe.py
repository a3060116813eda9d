"""What every graph builder offers the replay (``llamafit.memory.graph.replay``): its shape is a ``Recipe``, a
frozen dataclass read from a model (``llamafit.memory.graph.shapes``: one registry from architecture to the
reader of its shape) that builds the reserve graph for a ``Reserve``'s sizes and says which settings its graph
is llama.cpp's for. A new architecture is one shape class with its builder and one line in the registry
(docs/adding-an-architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llamafit.memory.graph.galloc import Graph
from llamafit.memory.graph.sampling import Samplers

POOLED = (None, "none", "mean", "cls", "last")  # an embedding context's pooling the output head builds; None: not one


@dataclass(frozen=True)
class Reserve:
    n_tokens: int
    n_seqs: int
    n_outputs: int
    n_kv: int  # cells of the full cache per stream
    n_kv_swa: int  # cells of the sliding-window cache per stream
    n_stream: int  # 1 with a unified cache, else n_seq_max
    flash_attn: bool
    cache_esize: int = 2  # bytes per element of the K cache (F16 unless -ctk f32)
    cache_esize_v: int = 2  # and of the V cache (what a copy of a cache view takes, op offload)
    type_k: str = "f16"  # the K cache's type (what a node concatenating cache views takes: DeepSeek-V4)
    n_rs_seq: int = 0  # recurrent-state snapshots kept for speculative rollback (hybrids)
    pooling: str | None = None  # an embedding context's pooling ("none", "mean", "cls", "last"); None: not one
    rot_k: int = 0  # Hadamard rotation size for a quantized K cache (llama-kv-cache.cpp:321-348), 0: none
    rot_v: int = 0  # the same for a quantized V cache
    samplers: Samplers | None = None  # each slot's backend sampler chain, None: no backend sampling
    mask_f16: bool = True  # a flash-attention mask made F16 (older builds: F32 and a cast, kq_mask())
    mla_mask_f16: bool = True  # the same for the MLA and indexer masks (F16 from a later build)
    # without flash attention V is cached transposed, unless "auto" resolved it off after the cache was made
    # (create_memory counts "auto" as on: llama-context.cpp:205); attention then transposes a copy of V
    v_trans: bool = True
    mixed_batch: bool = True  # build_inp_embd's mixed token/embedding path (a build before 11401 has none)
    rs_one_gather: bool = True  # the recurrent states gathered once (before 11378: the ubatch's and the rest)
    mamba2_2d: bool = True  # Mamba-2 projections on a 2-D batch (before 10605: on the 3-D one, reshaped around)
    rows_after_norm: bool = True  # Nemotron-H's output rows selected after the norm (before 10355: in the last layer)


class Recipe:
    """A builder's shape: its graph, and what the replay asks of it before it replays it."""

    # the graph attends over a KV cache (a pure Mamba model's has none: its cache settings change no node)
    attends: ClassVar[bool] = True
    # built on ``attention.Builder``, which also makes the attention over an untransposed V without flash
    # attention (an "auto" resolved off after the cache was made); the other builders make it only as set
    any_v_layout: ClassVar[bool] = False
    # its graph tagged with each weight's device is the scheduler's (an EAGLE3 drafter's is not replayed so)
    placeable: ClassVar[bool] = True
    poolings: ClassVar[tuple[str | None, ...]] = POOLED  # the embedding contexts' poolings its head builds

    def graph(self, r: Reserve) -> Graph:
        """The reserve graph for ``r`` (its weights and caches tagged under ``galloc.placed``)."""
        raise NotImplementedError

    def since(self) -> int:
        """The oldest build whose reserve graph this is (``llamafit.memory.builds``); an older one keeps the
        per-phase estimate."""
        return 0

    def first_layer(self) -> Recipe | None:
        """The same model cut to its first layer (what the layers after it add is the graph less this one's),
        for the speed model's nodes per layer; None where the graph is not a stack of layers."""
        return None

    def rotations(self, rot: tuple[int, int], quantized: bool) -> tuple[int, int] | None:
        """The Hadamard rotations its graph makes for quantized caches of these rotations (``quantized``: a
        cache type is); None where a quantized cache makes a graph the builder does not."""
        return rot

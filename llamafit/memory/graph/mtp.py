"""The reserve graphs of MTP heads (their own llama_context over the NextN block), node by node.

Mirrors ``src/models/qwen35.cpp:500-659`` and ``src/models/glm4-moe.cpp:132-290`` (graph_mtp): the
token rows and the trunk's hidden state, each normed, concatenated and projected (``eh_proj``); one
full-attention block whose query carries a sigmoid gate (Qwen3.5; the gate is a view of the query
projection, made contiguous only after the attention, so the projection stays alive through it) or a
plain one (GLM-4.5); the FFN (dense, or routed and shared experts); the head norm (an output) and the
logits of the output rows. The attention itself is the transformer replay's (``graph_attention.Builder``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from llamafit.memory.graph.attention import MROPE_SECTIONS, Builder, TransformerShape
from llamafit.memory.graph.galloc import F32, I32, Graph, Tensor, in_layer
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.sampling import backend_samplers
from llamafit.memory.graph.trunk import Experts, gated_ffn, rms_norm, routed_and_shared


@dataclass(frozen=True)
class NextnIo:
    """Where an MTP head reads and writes: its NextN layer's index and which weights it takes for the token
    rows, the head norm and the logits (its own ``nextn.*`` ones where the file has them, else the model's:
    qwen35.cpp:533-635, glm4-moe.cpp:160-284), so that a split replay finds each weight's device."""

    layer: int = 0
    embed: str = "token_embd"  # or nextn.embed_tokens
    head_norm: str = "output_norm"  # or nextn.shared_head_norm
    head: str = "output"  # or nextn.shared_head_head


@dataclass(frozen=True)
class MtpShape(Recipe):
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    experts: Experts | None = None  # Qwen3.5-MoE: routed experts and a gated shared expert (qwen35moe.cpp)
    n_ff_shexp: int = 0
    n_pos: int = MROPE_SECTIONS  # positions per token (Qwen3-Next: plain rope, 1)
    rows_before_ffn: bool = False  # Qwen3-Next's MTP block keeps the output rows before its FFN
    io: NextnIo = NextnIo()

    poolings: ClassVar[tuple[str | None, ...]] = (None,)  # an MTP context is never an embedding one

    def graph(self, r: Reserve) -> Graph:
        return mtp_graph(self, r)


def block_ffn(g: Graph, sh: MtpShape, cur: Tensor) -> Tensor:
    """A Qwen3.5 block's FFN: dense (qwen35.cpp build_layer_ffn), or the routed experts plus the shared
    expert behind its sigmoid gate (qwen35moe.cpp build_layer_ffn; its MTP block, qwen35moe.cpp:678-716)."""
    if sh.experts is None:
        return gated_ffn(cur, sh.n_ff)
    return routed_and_shared(g, cur, sh.experts, sh.n_ff_shexp, gate="sigmoid")


def gated_attention(b: Builder, cur: Tensor, nh: int, nkv: int, hd: int) -> Tensor:
    """Qwen3.5's full attention (qwen35.cpp build_layer_attn, and the MTP block): the query projection
    holds the query and a sigmoid gate per head; the gate is made contiguous only after the attention,
    so the projection stays alive through it. Returns the ``wo`` projection of the gated output."""
    T, W = b.T, Graph.weight
    E = cur.ne[0]
    q_full = Graph.mul_mat(W((E, 2 * hd * nh), "attn_q"), cur)
    k = Graph.mul_mat(W((E, hd * nkv), "attn_k"), cur)
    v = Graph.mul_mat(W((E, hd * nkv), "attn_v"), cur)
    rows = (2 * hd * F32, 2 * hd * nh * F32)
    q = rms_norm(Graph.view(q_full, (hd, nh, T), rows))
    gate = Graph.op("cont", (hd * nh, T), Graph.view(q_full, (hd, nh, T), rows))
    k = rms_norm(Graph.reshape(k, (hd, nkv, T)))
    v = Graph.reshape(v, (hd, nkv, T))
    q = Graph.like("rope", q, b.pos)
    k = Graph.like("rope", k, b.pos)
    attn = b.attend(q, k, v, "full")
    return Graph.mul_mat(W((hd * nh, E), "attn_output"), Graph.like("mul", attn, Graph.like("unary", gate)))


def mtp_graph(sh: MtpShape, r: Reserve) -> Graph:
    """A Qwen3.5 MTP context's reserve graph (its weights, cache and pinned norms tagged under ``placed``)."""
    E, hd, nh, nkv = sh.n_embd, sh.head_dim, sh.n_head, sh.n_head_kv
    shape = TransformerShape(
        arch="qwen35",
        n_layer=1,
        n_embd=E,
        n_vocab=sh.n_vocab,
        n_head=nh,
        n_head_kv=(nkv,),
        head_k=hd,
        head_v=hd,
        n_ff=(sh.n_ff,),
        is_swa=(False,),
        n_pos=sh.n_pos,
    )
    b = Builder(shape, r)

    def block(inp_sa: Tensor, out_ids: Tensor) -> Tensor:
        attn = gated_attention(b, rms_norm(inp_sa), nh, nkv, hd)
        if sh.rows_before_ffn:  # qwen3next.cpp:760-763
            attn, inp_sa = Graph.get_rows(attn, out_ids), Graph.get_rows(inp_sa, out_ids)
        residual = Graph.like("add", attn, inp_sa)
        return Graph.like("add", block_ffn(b.g, sh, rms_norm(residual)), residual)

    return _nextn_graph(b, block, sh.io, sh.rows_before_ffn)


@dataclass(frozen=True)
class NextnShape(Recipe):
    """GLM-4.5's NextN block (glm4-moe.cpp:132-290): a trunk layer (attention with ``wo``, routed and
    shared experts) after the same projection of normed token rows and hidden states."""

    block: TransformerShape  # one layer: the NextN block's widths and experts
    io: NextnIo = NextnIo()

    def graph(self, r: Reserve) -> Graph:
        return nextn_graph(self, r)


def nextn_graph(sh: NextnShape, r: Reserve) -> Graph:
    """A GLM-4.5 MTP context's reserve graph (tagged under ``placed``)."""
    b = Builder(sh.block, r)

    def block(inp_sa: Tensor, _out_ids: Tensor) -> Tensor:
        ffn_inp = Graph.like("add", b.attention(rms_norm(inp_sa), 0), inp_sa)
        return Graph.like("add", b.ffn(rms_norm(ffn_inp), 0), ffn_inp)

    return _nextn_graph(b, block, sh.io)


def _nextn_graph(
    b: Builder, block: Callable[[Tensor, Tensor], Tensor], io: NextnIo, rows_in_block: bool = False
) -> Graph:
    """What the MTP graphs share: the token rows and the trunk's hidden state (inputs), each normed,
    concatenated and projected (``eh_proj``), all in the NextN layer; the block (given the output rows'
    ids); the head norm (``t_h_nextn``, an output; built with il -1, so not pinned to the layer) and the
    logits of the output rows (``rows_in_block``: already kept)."""
    g, T, E, V = b.g, b.T, b.sh.n_embd, b.sh.n_vocab
    W = Graph.weight

    def own(name: str, default: str) -> int | None:  # a nextn.* weight is the layer's, the model's is not
        return io.layer if name != default else None

    with in_layer(own(io.embed, "token_embd")):
        tokens = Graph.get_rows(W((E, V), io.embed), Graph.input((T,), I32))
    with in_layer(io.layer):
        e_norm, h_norm = rms_norm(tokens, "nextn.enorm"), rms_norm(Graph.input((E, T)), "nextn.hnorm")
        concat = Graph.op("concat", (2 * E, T), e_norm, h_norm)
        out_ids = Graph.input((max(1, min(b.r.n_outputs, T)),), I32)
        cur = block(Graph.mul_mat(W((2 * E, E), "nextn.eh_proj"), concat), out_ids)
    with in_layer(own(io.head_norm, "output_norm")):
        norm_w = W((E,), io.head_norm)
    h_nextn = Graph.like("mul", Graph.like("rms_norm", cur), norm_w)
    with in_layer(own(io.head, "output")):
        head_w = W((E, V), io.head)
    logits = Graph.mul_mat(head_w, h_nextn if rows_in_block else Graph.get_rows(h_nextn, out_ids))
    g.expand(logits)
    h_nextn.is_output = logits.is_output = True  # t_h_nextn and t_logits (llama-graph.cpp:1396-1408)
    return g


@dataclass(frozen=True)
class Eagle3Shape(TransformerShape):
    """An EAGLE3 drafter's one block: a transformer's widths, its own graph."""

    any_v_layout: ClassVar[bool] = False
    placeable: ClassVar[bool] = False  # its context's graph on one backend only

    def graph(self, r: Reserve) -> Graph:
        return _eagle3_graph(self, r)

    def first_layer(self) -> Recipe | None:
        return None


def _eagle3_graph(sh: TransformerShape, r: Reserve) -> Graph:
    """An EAGLE3 drafter's context graph (``src/models/eagle3.cpp:152-326``, the decoder graph the context
    reserves): the target's token rows and the fused target features (an input), each normed and concatenated
    into the attention's input; one block; the block's output is ``t_h_nextn`` and the logits of every token
    follow (the graph has no output-row selection)."""
    b = Builder(sh, r)
    g, T, E, V = b.g, b.T, sh.n_embd, sh.n_vocab
    W = Graph.weight
    tokens = Graph.input((T,), I32)
    inp_g = Graph.input((E, T))
    embd_norm = rms_norm(Graph.get_rows(W((E, V)), tokens))
    concat = Graph.op("concat", (2 * E, T), embd_norm, rms_norm(inp_g))
    ffn_inp = Graph.like("add", b.attention(concat, 0), inp_g)
    h = Graph.like("add", gated_ffn(rms_norm(ffn_inp), sh.n_ff[0]), ffn_inp)
    logits = Graph.mul_mat(W((E, V)), rms_norm(h))
    g.expand(logits)
    h.is_output = logits.is_output = True  # ggml_set_output(t_h_nextn), t_logits
    if r.samplers is not None:
        backend_samplers(g, logits, max(1, r.n_seqs), r.samplers)
    return g

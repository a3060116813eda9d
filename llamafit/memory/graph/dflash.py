"""The reserve graph of a DFlash or DSpark drafter's context, node by node, for ``llamafit.memory.graph.galloc``.

Mirrors ``src/models/dflash.cpp:567-857`` (the token batch the context reserves with; the embedding
batch that injects the target's features into the cache is another graph): the target's token rows,
Qwen3 blocks whose attention reads the cache without a causal mask (``graph_attention.Builder``), the
output norm (``t_embd``) and the logits of every token (no output-row selection). A reduced draft
vocabulary scatters its logits into a ``-inf``-filled tensor of the target's vocabulary
(``ggml_fill`` over a new leaf, then ``ggml_set_rows`` through ``d2t``). The server samples the draft on
the backend (common/speculative.cpp:1102-1117: a top-k chain per sequence): ``build_sampling`` pads the
logits by a row (llama-graph.cpp:3926) and, per output row of a sequence, the top-k ids and their
logits (llama-sampler.cpp:1477-1499). DSpark's Markov head (dflash.cpp:296-405) is only built when a
sequence's tokens fit in one block (small ubatches over several sequences).
"""

from __future__ import annotations

from dataclasses import dataclass

from llamafit.memory.builds import DSPARK_DSV4_GRAPH_SINCE
from llamafit.memory.graph.attention import Builder, TransformerShape
from llamafit.memory.graph.dsv4 import Dsv4Shape, draft_embd
from llamafit.memory.graph.galloc import I32, Graph, Tensor, in_layer
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.sampling import backend_samplers
from llamafit.memory.graph.trunk import rms_norm


@dataclass(frozen=True)
class DflashShape(Recipe):
    # the blocks: Qwen3's (Q/K norms, dense gated FFN), or DeepSeek-V4's (DSpark on its backbone); n_vocab:
    # the target's
    trunk: TransformerShape | Dsv4Shape
    n_vocab_draft: int  # rows of the draft head (the target's vocabulary without a d2t map)
    d2t: bool
    markov: Markov | None = None  # DSpark's head

    def graph(self, r: Reserve) -> Graph:
        return _dflash_graph(self, r)

    def since(self) -> int:
        return DSPARK_DSV4_GRAPH_SINCE if isinstance(self.trunk, Dsv4Shape) else 0


@dataclass(frozen=True)
class Markov:
    """DSpark's Markov head (dflash.cpp:124-137, 296-405)."""

    block_size: int  # the trained block (dflash.block_size)
    rank: int  # markov_w1's rows
    confidence: bool  # conf_proj present
    confidence_bias: bool
    w2_scale: bool  # markov_w2.scale present: build_lora_mm multiplies by it
    sample_from_anchor: bool  # dflash.sample_from_anchor (default true): slot 0 is a prediction too


def _dflash_graph(sh: DflashShape, r: Reserve) -> Graph:
    """The pp reserve graph (its weights and caches tagged under ``galloc.placed``), with the slots'
    backend samplers (``r.sampled_rows``: the draft depth + 1 rows per sequence)."""
    n_seqs = max(1, r.n_seqs)
    T, E, V = -(-r.n_tokens // n_seqs) * n_seqs, sh.trunk.n_embd, sh.trunk.n_vocab  # a multiple of n_seqs
    W = Graph.weight
    tokens = Graph.input((T,), I32)
    if isinstance(sh.trunk, Dsv4Shape):  # t_embd is the head's mix before the output norm (dflash.cpp:1011-1020)
        g = Graph()
        embd = draft_embd(sh.trunk, r, g, tokens)
        logits = Graph.mul_mat(W((E, sh.n_vocab_draft), "output"), rms_norm(embd, "output_norm"))
    else:
        b = Builder(sh.trunk, r)
        g = b.g
        inp_l = Graph.get_rows(W((E, V), "token_embd"), tokens)
        for il in range(sh.trunk.n_layer):
            with in_layer(il):
                ffn_inp = Graph.like("add", b.attention(rms_norm(inp_l), il), inp_l)
                inp_l = Graph.like("add", b.ffn(rms_norm(ffn_inp), il), ffn_inp)
        embd = rms_norm(inp_l, "output_norm")
        logits = Graph.mul_mat(W((E, sh.n_vocab_draft), "output"), embd)
    if sh.d2t:
        logits = _scatter(sh, logits, (1, V, T))
    g.expand(logits)
    if sh.markov is not None and T // n_seqs <= sh.markov.block_size:
        logits = _markov_head(g, sh, sh.markov, tokens, logits, embd, n_seqs)
    embd.is_output = logits.is_output = True  # t_embd, t_logits (llama-graph.cpp:1396-1403)
    if r.samplers is not None:
        backend_samplers(g, logits, n_seqs, r.samplers)
    return g


def _scatter(sh: DflashShape, rows: Tensor, fill_shape: tuple[int, int, int]) -> Tensor:
    """A reduced draft vocabulary's rows scattered into the target's through d2t (dflash.cpp:340-347,
    828-840): set_rows into a filled new tensor (a leaf: allocated before the first node)."""
    nd, n = sh.n_vocab_draft, rows.ne[1]
    filled = Graph.like("fill", Graph.new(fill_shape))
    ids = Graph.reshape(Graph.weight((nd,), "d2t"), (nd, 1, 1))
    return Graph.reshape(Graph.set_rows(filled, Graph.reshape(rows, (1, nd, n)), ids), (fill_shape[1], n))


def _markov_head(
    g: Graph, sh: DflashShape, mk: Markov, tokens: Tensor, base: Tensor, embd: Tensor, n_blocks: int
) -> Tensor:
    """build_dspark_markov_head: per block position the Markov bias of the previous token (chained by
    argmax), added to that position's logits and concatenated; the result (block-major again) replaces
    t_logits, and the confidences broadcast to the embedding's rows become t_h_nextn. Returns t_logits."""
    V, n_tok, E = base.ne[0], base.ne[1], embd.ne[0]
    W = Graph.weight
    drafts = n_tok // n_blocks
    prev = Graph.op("cont", (n_blocks,), Graph.view(tokens, (1, n_blocks), (drafts * I32,)), esize=I32)
    cat: Tensor | None = None
    cat_conf: Tensor | None = None
    stride = (drafts * base.nb[1],)
    if not mk.sample_from_anchor:
        cat = Graph.op("cont", (V, n_blocks), Graph.view(base, (V, n_blocks), stride))
        if mk.confidence:
            cat_conf = Graph.like("unary", Graph.op("cont", (1, n_blocks), Graph.view(base, (1, n_blocks), stride)))
    for i in range(0 if mk.sample_from_anchor else 1, drafts):
        w1_prev = Graph.get_rows(W((mk.rank, V), "markov_w1"), prev)
        bias = Graph.mul_mat(W((mk.rank, sh.n_vocab_draft), "markov_w2"), w1_prev)
        if mk.w2_scale:
            bias = Graph.like("mul", bias, W((1,), "markov_w2.scale"))
        if sh.d2t:
            bias = _scatter(sh, bias, (1, V, n_blocks))
        col = Graph.like("add", Graph.view(base, (V, n_blocks), stride), bias)
        cat = col if cat is None else Graph.op("concat", (V, cat.ne[1] + n_blocks), cat, col)
        if mk.confidence:
            inp_i = Graph.op("cont", (E, n_blocks), Graph.view(embd, (E, n_blocks), (drafts * embd.nb[1],)))
            feat = Graph.op("concat", (E + mk.rank, n_blocks), inp_i, w1_prev)
            conf = Graph.mul_mat(W((E + mk.rank, 1), "conf_proj"), feat)
            if mk.confidence_bias:
                conf = Graph.like("add", conf, W((1,), "conf_proj.bias"))
            conf = Graph.like("unary", conf)
            cat_conf = conf if cat_conf is None else Graph.op("concat", (1, cat_conf.ne[1] + n_blocks), cat_conf, conf)
        if i + 1 < drafts:
            prev = Graph.op("argmax", (n_blocks,), col, esize=I32)
    assert cat is not None
    out = Graph.op("cont", (V, drafts, n_blocks), Graph.reshape(cat, (V, n_blocks, drafts)))  # the permute's copy
    out = Graph.reshape(out, (V, n_tok))
    if cat_conf is not None:
        c = Graph.op("cont", (1, drafts, n_blocks), Graph.reshape(cat_conf, (1, n_blocks, drafts)))
        h_nextn = Graph.op("repeat", embd.ne, Graph.reshape(c, (1, n_tok)), embd)
        g.expand(h_nextn)
        h_nextn.is_output = True
    g.expand(out)
    return out

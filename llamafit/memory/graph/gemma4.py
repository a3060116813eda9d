"""Gemma 4's reserve graph (E2B, E4B, 31B, 26B-A4B), node by node, for ``llamafit.memory.graph.galloc``.

Mirrors ``src/models/gemma4.cpp:155-433`` over ``attention.Attending``: the token rows scaled by sqrt(n_embd),
the per-layer embeddings (``build_inp_per_layer``, 469-506: the rows of the lazily read table, scaled and
expanded at once; ``project_per_layer_inputs``, 508-528: the projection of the scaled rows, expanded where
the first layer reads its slice), then per layer Q with its norm and RoPE (a full layer's with ``rope_freqs``),
K and V with theirs (V normed without a weight, or K's projection where the layer has no ``attn_v``) or the
cache of an earlier layer (the last ``shared_kv_layers``: llama-model.cpp:2796-2805), the sandwich norms (the
FFN's post-norm is not a layer's: built with layer -1, never pinned), a router's layers' shared MLP beside the
routed experts (``trunk.moe_ffn``, on logits of Gemma's own router), the per-layer input's gate and
projection, ``layer_output_scale``; the output rows taken after the output norm (``t_h_nextn``, an output) and
the soft-capped logits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from llamafit.gguf.hparams import Hparams
from llamafit.memory.builds import GEMMA4_GRAPH_SINCE
from llamafit.memory.graph.attention import Attending
from llamafit.memory.graph.galloc import I32, Graph, Tensor, in_layer
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.sampling import backend_samplers
from llamafit.memory.graph.trunk import Experts, Logits, gated_ffn, input_embeddings, moe_ffn, output_head, rms_norm


@dataclass(frozen=True)
class GemmaLayers(Recipe):
    """What the shapes of Gemma 4 and of its assistant share: each layer's heads, FFN and window."""

    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head: tuple[int, ...]  # each layer's head size, K's and V's (the loaders refuse them unequal: gemma4.cpp:43-48)
    n_ff: tuple[int, ...]
    is_swa: tuple[bool, ...]
    since_build: int

    any_v_layout: ClassVar[bool] = True

    def since(self) -> int:
        return self.since_build

    def first_layer(self) -> Recipe | None:
        return replace(self, n_layer=1)

    def v_width(self) -> int:
        """The widest layer's V row (n_embd_v_gqa_max)."""
        return max(h * kv for h, kv in zip(self.head, self.n_head_kv, strict=True))


def read_layers(hp: Hparams, n: int, since: int = GEMMA4_GRAPH_SINCE) -> dict[str, Any]:
    """``GemmaLayers``' fields for the first ``n`` layers of a Gemma 3n, Gemma 4 or assistant header."""
    return {
        "n_layer": n,
        "n_embd": hp.n_embd,
        "n_vocab": hp.n_vocab,
        "n_head": tuple(hp.n_head[:n]),
        "n_head_kv": tuple(hp.n_head_kv[:n]),
        "head": tuple(hp.head_k_swa if hp.is_swa[il] else hp.head_k for il in range(n)),
        "n_ff": tuple(hp.n_ff[:n]),
        "is_swa": tuple(hp.is_swa[:n]),
        "since_build": since,
    }


def reused_cache(n_kv_from_start: int, is_swa: tuple[bool, ...], il: int) -> int | None:
    """The layer whose cache layer ``il`` of Gemma 3n or 4 reads, None where it has its own: the last sliding or
    full layer before the shared ones (llama-model.cpp:2796-2805)."""
    if il < n_kv_from_start:
        return None
    return n_kv_from_start - (2 if is_swa[il] else 1)


def per_layer_inputs(g: Graph, inp_l: Tensor, sh: GemmaLayers, n_pl: int, T: int) -> Tensor:
    """Gemma 3n's and 4's per-layer inputs, ``[n_pl, n_tokens, n_layer]``: the table's rows for the tokens (expanded
    here) plus the projection of the scaled token rows ``inp_l`` (made here, expanded by its first reader):
    build_inp_per_layer and project_per_layer_inputs (gemma4.cpp:469-528, gemma3n.cpp:322-375)."""
    n = sh.n_layer
    rows = Graph.get_rows(Graph.weight((n_pl * n, sh.n_vocab), "per_layer_token_embd"), Graph.input((T,), I32))
    rows = Graph.like("scale", Graph.reshape(rows, (n_pl, n, T)))
    g.expand(rows)
    # block 0's weights (gemma4.cpp:60-61, gemma3n.cpp:40-41); the norm is built with layer -1: not pinned
    with in_layer(0):
        proj_w = Graph.weight((sh.n_embd, n_pl * n), "per_layer_model_proj")
        norm_w = Graph.weight((n_pl,), "per_layer_proj_norm")
    proj = Graph.reshape(Graph.like("scale", Graph.mul_mat(proj_w, inp_l)), (n_pl, n, T))
    proj = Graph.like("mul", Graph.like("rms_norm", proj), norm_w)
    summed = Graph.like("scale", Graph.like("add", proj, rows))
    perm = Graph.view(summed, (n_pl, T, n), (summed.nb[2], summed.nb[1], summed.nb[3]), op="permute")
    return Graph.op("cont", (n_pl, T, n), perm)


@dataclass(frozen=True)
class Gemma4Shape(GemmaLayers):
    n_kv_from_start: int  # the layers from here on read an earlier layer's cache
    per_layer: int  # n_embd_per_layer: the per-layer inputs' width (0: none)
    v_proj: tuple[bool, ...]  # the layer has attn_v (else V is K's projection, normed apart)
    out_scale: tuple[bool, ...]  # the layer has layer_output_scale
    softcap: bool  # final_logit_softcapping (30 unless the header says 0)
    experts: Experts | None = None  # the layers with a router (``moe``): a shared MLP beside routed experts
    moe: tuple[bool, ...] = ()

    def graph(self, r: Reserve) -> Graph:
        return _Builder(self, r).graph()


class _Builder(Attending):
    def __init__(self, sh: Gemma4Shape, r: Reserve) -> None:
        super().__init__(r, sh.v_width(), 1)
        self.sh = sh

    def graph(self) -> Graph:
        sh, g, r = self.sh, self.g, self.r
        inp_l = self.scaled_rows(input_embeddings(g, sh.n_embd, sh.n_vocab, self.T, mixed=r.mixed_batch))
        out_ids = Graph.input((max(1, min(r.n_outputs, self.T)),), I32)
        per_layer = per_layer_inputs(g, inp_l, sh, sh.per_layer, self.T) if sh.per_layer else None
        for il in range(sh.n_layer):
            with in_layer(il):
                inp_l = self.layer(il, inp_l, per_layer)
        head = Logits("softcapped" if sh.softcap else "plain")
        output_head(g, inp_l, sh.n_vocab, r.pooling, max(1, r.n_seqs), r.samplers, rows=out_ids, logits=head)
        return g

    def layer(self, il: int, inp_l: Tensor, per_layer: Tensor | None) -> Tensor:
        sh, T = self.sh, self.T
        W = Graph.weight
        nh, hd, n_kv_h = sh.n_head[il], sh.head[il], sh.n_head_kv[il]
        kind = "swa" if sh.is_swa[il] else "full"
        freqs = () if sh.is_swa[il] else (W((hd // 2,), "rope_freqs"),)  # the full layers' proportional RoPE
        cur = rms_norm(inp_l, "attn_norm")
        q = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nh), "attn_q"), cur), (hd, nh, T))
        q = Graph.like("rope", rms_norm(q, "attn_q_norm"), self.pos, *freqs)
        reused = reused_cache(sh.n_kv_from_start, sh.is_swa, il)
        if reused is None:
            k_lin = Graph.mul_mat(W((sh.n_embd, hd * n_kv_h), "attn_k"), cur)
            v_lin = Graph.mul_mat(W((sh.n_embd, hd * n_kv_h), "attn_v"), cur) if sh.v_proj[il] else k_lin
            k = rms_norm(Graph.reshape(k_lin, (hd, n_kv_h, T)), "attn_k_norm")
            v = Graph.like("rms_norm", Graph.reshape(v_lin, (hd, n_kv_h, T)))
            k = Graph.like("rope", k, self.pos, *freqs)
            out = self.attend(q, k, v, kind, two_caches=True)
        else:
            out = self.attend(q, None, None, kind, two_caches=True, shared=(reused, sh.n_head_kv[reused]))
        cur = rms_norm(Graph.mul_mat(W((hd * nh, sh.n_embd), "attn_output"), out), "post_attention_norm")
        attn_out = Graph.like("add", cur, inp_l)
        if sh.experts is not None and sh.moe[il]:
            cur = self.moe(attn_out, il, sh.experts)
        else:
            cur = gated_ffn(rms_norm(attn_out, "ffn_norm"), sh.n_ff[il])
        cur = Graph.like("mul", Graph.like("rms_norm", cur), W((sh.n_embd,), "post_ffw_norm"))
        cur = Graph.like("add", cur, attn_out)
        if per_layer is not None:
            gate = Graph.like("unary", Graph.mul_mat(W((sh.n_embd, sh.per_layer), "inp_gate"), cur))
            x = Graph.like("mul", gate, Graph.view(per_layer, (sh.per_layer, T)))
            x = rms_norm(Graph.mul_mat(W((sh.per_layer, sh.n_embd), "proj"), x), "post_norm")
            cur = Graph.like("add", cur, x)
        if sh.out_scale[il]:
            cur = Graph.like("mul", cur, W((1,), "layer_output_scale"))
        return cur

    def moe(self, attn_out: Tensor, il: int, ex: Experts) -> Tensor:
        """A router's layer (gemma4.cpp:296-346): the dense FFN as a shared MLP, beside the routed experts on
        their own norm, routed by the unweighted norm of the layer's input, scaled, times ``ffn_gate_inp.scale``."""
        sh, W = self.sh, Graph.weight
        mlp = rms_norm(gated_ffn(rms_norm(attn_out, "ffn_norm"), sh.n_ff[il]), "post_ffw_norm_1")
        moe_in = rms_norm(attn_out, "pre_ffw_norm_2")
        router = Graph.like(
            "mul", Graph.like("scale", Graph.like("rms_norm", attn_out)), W((sh.n_embd,), "ffn_gate_inp.scale")
        )
        logits = Graph.mul_mat(W((sh.n_embd, ex.n_expert), "ffn_gate_inp"), router)
        routed = rms_norm(moe_ffn(self.g, moe_in, ex, logits=logits), "post_ffw_norm_2")
        return Graph.like("add", mlp, routed)


@dataclass(frozen=True)
class AssistantShape(GemmaLayers):
    """A Gemma 4 assistant (src/models/gemma4-assistant.cpp:84-200): the MTP drafter whose layers read its
    target's caches and the target's token rows (``n_backbone``: the target's width)."""

    n_backbone: int

    poolings: ClassVar[tuple[str | None, ...]] = (None,)

    def graph(self, r: Reserve) -> Graph:
        return _AssistantBuilder(self, r).graph()


class _AssistantBuilder(Attending):
    def __init__(self, sh: AssistantShape, r: Reserve) -> None:
        super().__init__(r, sh.v_width(), 1)
        self.sh = sh

    def graph(self) -> Graph:
        """The target's token rows, scaled, beside the target's hidden states (an input), projected; each layer's
        attention over the target's cache (no K or V of its own), the output rows taken in the last layer; the
        logits and the next hidden state (``t_h_nextn``), both outputs."""
        sh, g, r, T, W = self.sh, self.g, self.r, self.T, Graph.weight
        tokens, hidden = Graph.input((T,), I32), Graph.input((sh.n_backbone, T))
        # the target's token_embd: an input-layer weight of the other model (the host's, unless -ot moves it)
        rows = Graph.like("scale", Graph.get_rows(W((sh.n_backbone, sh.n_vocab), "target.token_embd"), tokens))
        both = Graph.op("concat", (2 * sh.n_backbone, T), rows, hidden)
        with in_layer(0):  # block 0's weight (gemma4-assistant.cpp:55)
            cur = Graph.mul_mat(W((2 * sh.n_backbone, sh.n_embd), "nextn.pre_projection"), both)
        out_ids = Graph.input((max(1, min(r.n_outputs, T)),), I32)
        for il in range(sh.n_layer):
            with in_layer(il):
                cur = self.layer(il, cur, out_ids)
        normed = rms_norm(cur, "output_norm")  # layer -1: not pinned
        logits = Graph.mul_mat(W((sh.n_embd, sh.n_vocab), "output"), normed)
        h_next = Graph.mul_mat(W((sh.n_embd, sh.n_backbone), "nextn.post_projection"), normed)
        g.expand(logits)
        g.expand(h_next)
        logits.is_output = h_next.is_output = True  # t_logits, t_h_nextn (llama-graph.cpp:1396-1408)
        if r.samplers is not None:
            backend_samplers(g, logits, max(1, r.n_seqs), r.samplers)
        return g

    def layer(self, il: int, inp_l: Tensor, out_ids: Tensor) -> Tensor:
        sh, T, W = self.sh, self.T, Graph.weight
        nh, hd = sh.n_head[il], sh.head[il]
        freqs = () if sh.is_swa[il] else (W((hd // 2,), "rope_freqs"),)
        x = rms_norm(inp_l, "attn_norm")
        q = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nh), "attn_q"), x), (hd, nh, T))
        q = Graph.like("rope", rms_norm(q, "attn_q_norm"), self.pos, *freqs)
        kind = "swa" if sh.is_swa[il] else "full"
        self.g.expand(q)
        with in_layer(None):  # the target's caches, where its layers are (replay: ContextParams.kv_devices)
            k_cache, v_cache = self.caches(hd, hd, sh.n_head_kv[il], kind, f"target.cache_{kind}")
        out = self.mha(q, k_cache, v_cache, kind, None)
        cur = Graph.mul_mat(W((hd * nh, sh.n_embd), "attn_output"), out)
        if il == sh.n_layer - 1:
            cur, inp_l = Graph.get_rows(cur, out_ids), Graph.get_rows(inp_l, out_ids)
        attn_out = Graph.like("add", rms_norm(cur, "post_attention_norm"), inp_l)
        cur = gated_ffn(rms_norm(attn_out, "ffn_norm"), sh.n_ff[il])
        cur = Graph.like("mul", Graph.like("rms_norm", cur), W((sh.n_embd,), "post_ffw_norm"))  # layer -1
        cur = Graph.like("add", cur, attn_out)
        return Graph.like("mul", cur, W((1,), "layer_output_scale"))

"""Gemma 3n's reserve graph (E2B, E4B), node by node, for ``llamafit.memory.graph.galloc``.

Mirrors ``src/models/gemma3n.cpp:89-463`` over ``attention.Attending``: the token rows scaled by sqrt(n_embd);
the per-layer inputs (``build_inp_per_layer``, 322-351: the table's rows for the tokens, scaled and expanded at
once; ``project_per_layer_inputs``, 356-375); the stream made four by AltUp (the rows repeated, projected and
rescaled to the first stream's magnitude, concatenated); then per layer AltUp's prediction (a router's
modalities, its coefficients times the streams permuted), LAuReL's low-rank branch beside the attention of the
active stream (Q, K normed, V normed without a weight, or the cache of an earlier layer from the 20th layer on:
llama-model.cpp:2796-2805), the sandwich norms (the FFN's post-norm is built with layer -1: never pinned), the
gated GELU FFN with its activation sparsity in the first ten layers (a Gaussian top-k: mean, deviation, cutoff),
AltUp's correction and the per-layer input's gate and projection added to the other streams; at the end the
streams folded back to one (projected, rescaled, averaged), the output rows taken before the output norm, and
the soft-capped logits. AltUp's width (4 streams), LAuReL's rank (64) and the per-layer inputs' width (256) are
llama.cpp's defaults, read from no key (llama-hparams.h:264-268): the reader takes them from the tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamafit.gguf.model import ModelInfo
from llamafit.memory.builds import GEMMA3N_GRAPH_SINCE
from llamafit.memory.graph.attention import Attending
from llamafit.memory.graph.galloc import I32, Graph, Tensor, in_layer, pin_norm
from llamafit.memory.graph.gemma4 import GemmaLayers, per_layer_inputs, read_layers, reused_cache
from llamafit.memory.graph.recipe import Reserve
from llamafit.memory.graph.trunk import Logits, input_embeddings, output_head, rms_norm

SPARSE_LAYERS = 10  # n_layer_sparsity: the layers whose FFN gate keeps its top 5 % (models.h:849)


@dataclass(frozen=True)
class Gemma3nShape(GemmaLayers):
    n_kv_from_start: int  # the layers from here on read an earlier layer's cache
    n_altup: int  # AltUp's streams
    rank: int  # LAuReL's rank
    per_layer: int  # the per-layer inputs' width

    def graph(self, r: Reserve) -> Graph:
        return _Builder(self, r).graph()


def gemma3n_shape(model: ModelInfo) -> Gemma3nShape | None:
    """Gemma 3n (gemma3n.cpp load_arch_tensors); None for a fused QKV or without the AltUp tensors."""
    hp = model.hparams
    shapes = {t.name: t.info.shape for t in model.tensors}
    n = hp.n_layer
    altup, laurel, table = shapes.get("altup_proj.weight"), shapes.get("blk.0.laurel_l.weight"), "per_layer_token_embd"
    if hp.n_nextn or altup is None or len(altup) != 3 or laurel is None or f"{table}.weight" not in shapes:
        return None
    if any(f"blk.{il}.attn_qkv.weight" in shapes for il in range(n)) or hp.n_layer_kv_from_start < 2:
        return None
    return Gemma3nShape(
        **read_layers(hp, n, GEMMA3N_GRAPH_SINCE),
        n_kv_from_start=hp.n_layer_kv_from_start,
        n_altup=altup[2] + 1,
        rank=laurel[1],
        per_layer=shapes[f"{table}.weight"][0] // n,
    )


def magnitude(x: Tensor) -> Tensor:
    """calc_magnitude (gemma3n.cpp:316-318): the root of each row's sum of squares."""
    return Graph.like("sqrt", Graph.op("sum_rows", (1, *x.ne[1:]), Graph.like("sqr", x)))


def stream(x: Tensor, i: int) -> Tensor:
    """gemma3n_view_2d_slice: the ``i``-th stream of ``[n_embd, n_tokens, n_altup]``, a view (its offset is no
    concern of the allocator's: a view takes no memory)."""
    return Graph.view(x, x.ne[:2], (x.nb[1],))


def streams_after_first(x: Tensor) -> Tensor:
    """The streams after the first (a 3-D view, gemma3n.cpp:253-255, 272-274)."""
    return Graph.view(x, (x.ne[0], x.ne[1], x.ne[2] - 1), (x.nb[1], x.nb[2]))


class _Builder(Attending):
    def __init__(self, sh: Gemma3nShape, r: Reserve) -> None:
        super().__init__(r, sh.v_width(), 1)
        self.sh = sh

    def graph(self) -> Graph:
        sh, g, r, T = self.sh, self.g, self.r, self.T
        inp_l = self.scaled_rows(input_embeddings(g, sh.n_embd, sh.n_vocab, T, mixed=r.mixed_batch))
        out_ids = Graph.input((max(1, min(r.n_outputs, T)),), I32)
        per_layer = per_layer_inputs(g, inp_l, sh, sh.per_layer, T)
        cur = self.rescaled(inp_l, Graph.op("repeat", (sh.n_embd, T, sh.n_altup - 1), inp_l), "altup_proj")
        cur = Graph.op("concat", (sh.n_embd, T, sh.n_altup), inp_l, cur)
        for il in range(sh.n_layer):
            with in_layer(il):
                cur = self.layer(il, cur, per_layer)
        unembd = self.rescaled(stream(cur, 0), streams_after_first(cur), "altup_unembd_proj")
        out = stream(cur, 0)
        for i in range(sh.n_altup - 1):
            out = Graph.like("add", out, stream(unembd, i))
        out = Graph.get_rows(Graph.like("scale", out), out_ids)
        output_head(g, out, sh.n_vocab, r.pooling, max(1, r.n_seqs), r.samplers, logits=Logits("softcapped"))
        return g

    def rescaled(self, like: Tensor, x: Tensor, name: str) -> Tensor:
        """``x`` projected stream by stream (an output-layer weight), rescaled to ``like``'s magnitude
        (gemma3n.cpp:114-126, 268-283)."""
        sh = self.sh
        target = magnitude(like)
        proj = Graph.mul_mat(Graph.weight((sh.n_embd, sh.n_embd, sh.n_altup - 1), name), x)
        return Graph.like("div", Graph.like("mul", proj, target), magnitude(proj))

    def modalities(self, x: Tensor, router: tuple[Tensor, Tensor]) -> Tensor:
        """altup_compute_router_modalities (gemma3n.cpp:406-415): ``[n_altup, n_tokens]``. ``router``: the layer's
        norm and router weights, one tensor each for both of the layer's calls (a weight the scheduler copies to
        another backend is copied once, and its second reader starts a split without an input of its own)."""
        norm_w, router_w = router
        router_in = Graph.like("scale", Graph.like("mul", pin_norm(Graph.like("rms_norm", x)), norm_w))
        return Graph.like("unary", Graph.mul_mat(router_w, router_in))

    def predict(self, cur: Tensor, router: tuple[Tensor, Tensor]) -> Tensor:
        """altup_predict (gemma3n.cpp:418-440): the coefficients times the streams, permuted there and back."""
        sh, T, n_a = self.sh, self.T, self.sh.n_altup
        mods = self.modalities(stream(cur, 0), router)
        coefs = Graph.reshape(Graph.mul_mat(Graph.weight((n_a, n_a * n_a), "altup_predict_coef"), mods), (n_a, n_a, T))
        perm = Graph.view(cur, (n_a, sh.n_embd, T), (cur.nb[0], cur.nb[1], cur.nb[3]), op="permute")
        pred = Graph.mul_mat(Graph.op("cont", perm.ne, perm), coefs)  # [n_embd, n_altup, n_tokens]
        back = Graph.view(pred, (sh.n_embd, T, n_a), (pred.nb[2], pred.nb[1], pred.nb[3]), op="permute")
        return Graph.like("add", Graph.op("cont", back.ne, back), cur)

    def correct(self, pred: Tensor, activated: Tensor, router: tuple[Tensor, Tensor]) -> Tensor:
        """altup_correct (gemma3n.cpp:443-463): the innovation, repeated over the streams, times one coefficient
        per stream and token, plus the prediction."""
        sh, T, n_a = self.sh, self.T, self.sh.n_altup
        mods = self.modalities(activated, router)
        innovation = Graph.like("sub", activated, stream(pred, 0))
        coefs = Graph.like("scale", Graph.mul_mat(Graph.weight((n_a, n_a), "altup_correct_coef"), mods))
        coefs = Graph.op("cont", (1, T, n_a), Graph.transpose(coefs))
        innovation = Graph.op("repeat", (sh.n_embd, T, n_a), innovation)
        return Graph.like("add", Graph.like("mul", innovation, coefs), pred)

    def layer(self, il: int, inp_l: Tensor, per_layer: Tensor) -> Tensor:
        sh, T, W = self.sh, self.T, Graph.weight
        nh, hd = sh.n_head[il], sh.head[il]
        router = (W((sh.n_embd,), "altup_router_norm"), W((sh.n_embd, sh.n_altup), "altup_router"))
        pred = self.predict(inp_l, router)
        active = stream(pred, 0)
        cur = rms_norm(active, "attn_norm")
        laurel = rms_norm(Graph.mul_mat(W((sh.rank, sh.n_embd), "laurel_r"), self.laurel_l(cur)), "laurel_post_norm")
        laurel = Graph.like("add", laurel, cur)
        q = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nh), "attn_q"), cur), (hd, nh, T))
        kind = "swa" if sh.is_swa[il] else "full"
        reused = reused_cache(sh.n_kv_from_start, sh.is_swa, il)
        if reused is None:
            n_kv_h = sh.n_head_kv[il]
            k = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * n_kv_h), "attn_k"), cur), (hd, n_kv_h, T))
            v = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * n_kv_h), "attn_v"), cur), (hd, n_kv_h, T))
            q, k, v = rms_norm(q, "attn_q_norm"), rms_norm(k, "attn_k_norm"), Graph.like("rms_norm", v)
            q, k = Graph.like("rope", q, self.pos), Graph.like("rope", k, self.pos)
            out = self.attend(q, k, v, kind, two_caches=True)
        else:
            q = Graph.like("rope", rms_norm(q, "attn_q_norm"), self.pos)
            out = self.attend(q, None, None, kind, two_caches=True, shared=(reused, sh.n_head_kv[reused]))
        cur = rms_norm(Graph.mul_mat(W((hd * nh, sh.n_embd), "attn_output"), out), "post_attention_norm")
        attn_laurel = Graph.like("scale", Graph.like("add", Graph.like("add", cur, active), laurel))
        cur = self.ffn(rms_norm(attn_laurel, "ffn_norm"), il)
        cur = Graph.like("mul", Graph.like("rms_norm", cur), W((sh.n_embd,), "post_ffw_norm"))  # layer -1
        corrected = self.correct(pred, Graph.like("add", cur, attn_laurel), router)
        first = Graph.like("mul", stream(corrected, 0), W((sh.n_embd,), "altup_correct_scale"))
        first = Graph.like("unary", Graph.mul_mat(W((sh.n_embd, sh.per_layer), "inp_gate"), first))
        first = Graph.like("mul", first, stream(per_layer, il))
        first = rms_norm(Graph.mul_mat(W((sh.per_layer, sh.n_embd), "proj"), first), "post_norm")
        rest = Graph.like("add", streams_after_first(corrected), first)
        return Graph.op("concat", (sh.n_embd, T, sh.n_altup), stream(corrected, 0), rest)

    def laurel_l(self, cur: Tensor) -> Tensor:
        return Graph.mul_mat(Graph.weight((self.sh.n_embd, self.sh.rank), "laurel_l"), cur)

    def ffn(self, cur: Tensor, il: int) -> Tensor:
        """Up, gate (its Gaussian top-k in the first ten layers: gemma3n.cpp:212-222, 391-399), GELU, their product,
        down."""
        sh = self.sh
        n_ff = sh.n_ff[il]
        up = Graph.mul_mat(Graph.weight((sh.n_embd, n_ff), "ffn_up"), cur)
        gate = Graph.mul_mat(Graph.weight((sh.n_embd, n_ff), "ffn_gate"), cur)
        if il < SPARSE_LAYERS:
            mean = Graph.op("mean", (1, *gate.ne[1:]), gate)
            dev = Graph.op("sum_rows", mean.ne, Graph.like("sqr", Graph.like("sub", gate, mean)))
            cutoff = Graph.like("add", mean, Graph.like("scale", Graph.like("sqrt", Graph.like("scale", dev))))
            gate = Graph.like("unary", Graph.like("sub", gate, cutoff))
        out = Graph.like("mul", up, Graph.like("unary", gate))
        return Graph.mul_mat(Graph.weight((n_ff, sh.n_embd), "ffn_down"), out)

"""The reserve graph of a DeepSeek-V2/V3-style MLA model, node by node, for ``llamafit.memory.graph.galloc``.

Mirrors ``src/models/deepseek2.cpp`` (the MLA branch with the absorbed K: the query through its LoRA,
the compressed KV and its RoPE part, ``wk_b`` absorbed into the query, one K-only cache whose first
``kv_lora_rank`` columns are V), ``build_attn`` for a K-only cache (llama-graph.cpp:3056-3112: Q, V, K
expanded in that order), build_attn_mha with ``v_mla`` (2691-2830: without flash attention V is made
contiguous transposed, ``n_kv x kv_lora_rank`` per stream), the dense lead layers' FFN and the MoE
layers' experts plus the shared expert (``graph_trunk``). DeepSeek-V3.2 and GLM-5's sparse attention
(``src/models/deepseek32.cpp:210-420``, ``glm-dsa.cpp``) add the lightning indexer: its rotated query and
key, the key stored in the indexer's own cache, the scores over that cache and their top-k, which
unmask the attention's mask (``build_attn`` for the DSA input, llama-graph.cpp:3114-3187).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from llamafit.memory.graph.attention import kq_mask
from llamafit.memory.graph.galloc import F32, I32, I64, Graph, Tensor, in_layer
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.trunk import Experts, gated_ffn, input_embeddings, moe_ffn, output_head, rms_norm


@dataclass(frozen=True)
class Indexer:
    """The DSA lightning indexer of a layer that computes its own top-k (GLM-5's shared layers reuse the
    last one: ``full``)."""

    n_head: int
    head_dim: int
    top_k: int
    rot: int  # the Hadamard rotation of its cache, always made for it (llama-kv-cache.cpp:321-351)
    full: tuple[bool, ...]


@dataclass(frozen=True)
class MlaShape(Recipe):
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int
    q_lora_rank: int  # 0: the query straight from the hidden state (the Lite variants)
    n_dense_lead: int
    n_ff: int  # the dense layers' FFN
    n_ff_shexp: int  # the shared expert's FFN (0: none)
    experts: Experts
    indexer: Indexer | None = None

    def graph(self, r: Reserve) -> Graph:
        return _Builder(self, r).graph()

    def first_layer(self) -> Recipe | None:
        return replace(self, n_layer=1)

    def rotations(self, rot: tuple[int, int], quantized: bool) -> tuple[int, int] | None:
        if self.indexer is not None and quantized:
            return None  # the lightning indexer's cache beside a quantized one: not held to a load
        # the K-only cache's build_attn rotates nothing (llama-graph.cpp:3056-3112), and a quantized cache
        # needs flash attention there (K and V one type): the cache's type changes no node of the graph
        return 0, 0


@dataclass(frozen=True)
class HostDownMlaShape(MlaShape):
    """Mistral 4's MLA (DeepSeek-V3's graph): its experts' down projections carry F32 precision on their input
    (llama-graph.cpp:2356-2359), which the GPU backends refuse (ggml-cuda.cu:5329-5331, ggml-vulkan.cpp:15410-15412),
    so the scheduler runs them on the host and copies their weights there each batch, which the replica does not
    model: replayed on one backend only."""

    placeable: ClassVar[bool] = False


class _Builder:
    def __init__(self, sh: MlaShape, r: Reserve) -> None:
        self.sh, self.r, self.g = sh, r, Graph()
        n_seqs = max(1, r.n_seqs)
        self.T = -(-r.n_tokens // n_seqs) * n_seqs
        self.ns = max(1, r.n_stream)
        self.pos = Graph.input((self.T,), I32)
        self.k_idxs = Graph.input((self.T,), I64)
        self.mask = kq_mask((r.n_kv, self.T // self.ns, 1, self.ns), r.flash_attn, r.mla_mask_f16)
        self.top_k: Tensor | None = None
        if (ix := sh.indexer) is not None:  # build_attn_inp_k_dsa_impl (llama-graph.cpp:3411-3441)
            self.k_idxs_lid = Graph.input((self.T,), I64)
            # F16: the fused ggml_lightning_indexer's mask (cparams.fused_lid; a backend without that op
            # scores op by op, deepseek32.cpp:284-316, which is not replayed)
            self.mask_lid = kq_mask((r.n_kv, self.T // self.ns, 1, self.ns), True, r.mla_mask_f16)
            self.k_rot = Graph.input((ix.rot, ix.rot), F32)

    def graph(self) -> Graph:
        sh, g, T = self.sh, self.g, self.T
        inp_l = input_embeddings(g, sh.n_embd, sh.n_vocab, T, mixed=self.r.mixed_batch)
        out_ids = Graph.input((max(1, min(self.r.n_outputs, T)),), I32)
        for il in range(sh.n_layer):
            with in_layer(il):
                cur = self.attention(rms_norm(inp_l), il)
                if il == sh.n_layer - 1:
                    cur = Graph.get_rows(cur, out_ids)
                    inp_l = Graph.get_rows(inp_l, out_ids)
                ffn_inp = Graph.like("add", cur, inp_l)
                cur = rms_norm(ffn_inp)
                if il < sh.n_dense_lead:
                    cur = gated_ffn(cur, sh.n_ff)
                else:
                    moe = moe_ffn(g, cur, sh.experts)
                    cur = Graph.like("add", moe, gated_ffn(cur, sh.n_ff_shexp, "_shexp")) if sh.n_ff_shexp else moe
                inp_l = Graph.like("add", cur, ffn_inp)
        output_head(g, inp_l, sh.n_vocab, self.r.pooling, max(1, self.r.n_seqs), self.r.samplers)
        return g

    def attention(self, cur: Tensor, il: int) -> Tensor:
        sh, r, g, T, ns = self.sh, self.r, self.g, self.T, self.ns
        W = Graph.weight
        rank, rope, nh = sh.kv_lora_rank, sh.rope_dim, sh.n_head
        k_mla = sh.nope_dim + rope
        if sh.q_lora_rank:
            qr = rms_norm(Graph.mul_mat(W((sh.n_embd, sh.q_lora_rank), "attn_q_a"), cur))
            if sh.indexer is not None and sh.indexer.full[il]:
                self.top_k = self.index(cur, qr, sh.indexer)
            q = Graph.mul_mat(W((sh.q_lora_rank, nh * k_mla), "attn_q_b"), qr)
        else:
            q = Graph.mul_mat(W((sh.n_embd, nh * k_mla), "attn_q"), cur)
        q = Graph.reshape(q, (k_mla, nh, T))
        kv_pe = Graph.mul_mat(W((sh.n_embd, rank + rope), "attn_kv_a_mqa"), cur)
        kv_cmpr = Graph.view(kv_pe, (rank, T), (kv_pe.nb[1],))
        k_pe = Graph.like("rope", Graph.view(kv_pe, (rope, 1, T), (kv_pe.nb[1], kv_pe.nb[1])), self.pos)
        kv_cmpr = rms_norm(kv_cmpr)
        q_nope = Graph.view(q, (sh.nope_dim, nh, T), (q.nb[1], q.nb[2]))
        q_pe = Graph.like("rope", Graph.view(q, (rope, nh, T), (q.nb[1], q.nb[2])), self.pos)
        q_nope = Graph.view(q_nope, (sh.nope_dim, T, nh), op="permute")
        absorbed = Graph.op("mul_mat", (rank, T, nh), W((sh.nope_dim, rank, nh), "attn_k_b"), q_nope)
        absorbed = Graph.view(absorbed, (rank, nh, T), op="permute")
        q_cur = Graph.op("concat", (rank + rope, nh, T), absorbed, q_pe)
        v_cur = Graph.reshape(kv_cmpr, (rank, 1, T))
        k_cur = Graph.op("concat", (rank + rope, 1, T), v_cur, k_pe)
        for t in (q_cur, v_cur, k_cur):  # llama-graph.cpp:3069-3071
            g.expand(t)
        cache = Graph.cache((rank + rope, r.n_kv * ns), r.cache_esize)
        g.expand(Graph.set_rows(cache, Graph.view(k_cur, (rank + rope, T), (k_cur.nb[2],)), self.k_idxs))
        mask = self.mask if self.top_k is None else self.sparse_mask(self.top_k)
        qs = Graph.view(q_cur, (rank + rope, T // ns, nh, ns))
        kp = Graph.view(cache, (rank + rope, r.n_kv, 1, ns))
        # V is the first kv_lora_rank columns of each cache row: a view with the cache's row stride
        vp = Graph.view(cache, (rank, r.n_kv, 1, ns), (cache.nb[1], cache.nb[1] * r.n_kv, cache.nb[1] * r.n_kv))
        v_mla = W((rank, sh.v_dim, nh), "attn_v_b")
        if r.flash_attn:
            out = Graph.op("flash_attn_ext", (rank, nh, T // ns, ns), qs, kp, vp, mask)
            out = Graph.view(out, (rank, T // ns, nh, ns), op="permute")
            out = Graph.op("mul_mat", (sh.v_dim, T // ns, nh, ns), v_mla, out)
            out = Graph.op("cont", (sh.v_dim, nh, T // ns, ns), Graph.view(out, (sh.v_dim, nh, T // ns, ns)))
            attn = Graph.reshape(out, (sh.v_dim * nh, T))
        else:
            kq = Graph.like("soft_max", Graph.op("mul_mat", (r.n_kv, T // ns, nh, ns), kp, qs), mask)
            vt = Graph.transpose(vp)
            v = Graph.op("cont", vt.ne, vt, esize=r.cache_esize)  # ggml_cont keeps the cache's type
            kqv = Graph.op("mul_mat", (rank, T // ns, nh, ns), v, kq)
            kqv = Graph.op("mul_mat", (sh.v_dim, T // ns, nh, ns), v_mla, kqv)
            attn = Graph.op("cont", (sh.v_dim * nh, T), Graph.view(kqv, (sh.v_dim, nh, T // ns, ns), op="permute"))
        g.expand(attn)
        return Graph.mul_mat(W((sh.v_dim * nh, sh.n_embd), "attn_output"), attn)

    def index(self, cur: Tensor, qr: Tensor, ix: Indexer) -> Tensor:
        """The lightning indexer (deepseek32.cpp:226-321): the top-k cells of its scores, per token."""
        r, g, T, ns = self.r, self.g, self.T, self.ns
        W = Graph.weight
        hd, nih = ix.head_dim, ix.n_head
        iq = Graph.reshape(Graph.mul_mat(W((self.sh.q_lora_rank, nih * hd), "indexer.attn_q_b"), qr), (hd, nih, T))
        iq = Graph.like("rope", iq, self.pos)
        ik = Graph.mul_mat(W((self.sh.n_embd, hd), "indexer.attn_k"), cur)
        # build_norm(LLM_NORM) with a bias: the norm, then the weight and the bias in place
        ik = Graph.like(
            "add",
            Graph.like("mul", Graph.like("norm", ik), W((hd,), "indexer.k_norm")),
            W((hd,), "indexer.k_norm.bias"),
        )
        ik = Graph.like("rope", Graph.reshape(ik, (hd, 1, T)), self.pos)
        iq = Graph.mul_mat(self.k_rot, iq)  # the Hadamard transform of both
        ik = Graph.mul_mat(self.k_rot, ik)
        cache = Graph.cache((hd, r.n_kv * ns), r.cache_esize)
        g.expand(Graph.set_rows(cache, Graph.view(ik, (hd, T), (ik.nb[2],)), self.k_idxs_lid))
        weights = Graph.mul_mat(W((self.sh.n_embd, nih), "indexer.proj"), cur)
        keys = Graph.view(cache, (hd, 1, r.n_kv, ns))
        iq = Graph.view(iq, (hd, nih, T // ns, ns))
        weights = Graph.like("scale", Graph.view(weights, (nih, T // ns, 1, ns)))
        score = Graph.op("lightning_indexer", (r.n_kv, T // ns, 1, ns), iq, keys, weights, self.mask_lid)
        top = Graph.op("top_k", (min(r.n_kv, ix.top_k), T // ns, 1, ns), score, esize=I32)
        return Graph.op("cont", top.ne, top, esize=I32)

    def sparse_mask(self, top_k: Tensor) -> Tensor:
        """The attention's mask with only the top-k cells open (llama-graph.cpp:3144-3170): a mask of -inf,
        zeros written at the top-k cells through set_rows, then the causal mask added."""
        m = self.mask
        filled = Graph.like("fill", m)
        rows = Graph.view(filled, (1, m.ne[0], m.ne[1], m.ne[3]), (filled.nb[0], filled.nb[1], filled.nb[2]))
        idx = Graph.view(top_k, (top_k.ne[0], top_k.ne[1], top_k.ne[3], 1))
        zeros = Graph.like("fill", Graph.new((1, top_k.ne[0], top_k.ne[1], top_k.ne[3])))
        opened = Graph.set_rows(rows, zeros, idx)
        opened = Graph.view(opened, m.ne)
        return Graph.like("add", opened, m)

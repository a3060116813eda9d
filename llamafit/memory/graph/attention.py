"""The reserve graph of a transformer with a KV cache, node by node, for ``llamafit.memory.graph.galloc``.

Mirrors ``src/models/llama.cpp:99-247`` (Llama, dense or with experts), ``src/models/qwen2.cpp`` and
``qwen2vl.cpp`` (Llama's graph with biased Q, K and V: build_qkv adds each bias the file has; M-RoPE),
``src/models/qwen3.cpp`` and ``qwen3moe.cpp`` (Q/K norms before RoPE; ``qwen3vl.cpp`` and ``qwen3vlmoe.cpp``
with M-RoPE and the deepstack slices added after the first layers), ``src/models/gemma3.cpp:81-217``
(Gemma 3: the scaled embedding rows, Q/K norms, the scaled Q, the sandwich norms, sliding-window layers),
``src/models/gemma2.cpp`` (Gemma 2: the same without Q/K norms, its scores and logits soft-capped),
``src/models/mistral3.cpp`` (Llama's with the attention temperature of Llama 4's scaling), ``seed-oss.cpp``
(Llama's with biased Q, K and V), ``smollm3.cpp`` (Llama's with every fourth layer without RoPE), ``glm4.cpp``
(GLM-4: biased Q, K and V, sandwich norms, one up projection split by its SwiGLU), ``ernie4-5.cpp`` and
``ernie4-5-moe.cpp`` (ERNIE 4.5: Llama's attention, dense lead layers, softmax routing beside a shared expert),
``exaone4.cpp`` (EXAONE 4: only the attention's and the FFN's outputs normed, no RoPE on the full layers of the
sliding-window model), ``olmo2.cpp`` (OLMo 2 and 3: EXAONE 4's norms, Q and K normed over their whole width),
``granite.cpp`` (Granite 3, dense and MoE: the embedding, residual and logit scales),
``src/models/phi3.cpp`` (Phi-3 and Phi-4: Q, K and V views of a fused product, one up projection split by its
SwiGLU), ``src/models/minimax-m2.cpp`` (MiniMax-M2: Q and K normed over their whole width before the heads are
split, sigmoid routing with a selection bias) and
``src/models/openai-moe.cpp:59-168`` (gpt-oss: biased projections, attention sinks, every other layer on the
sliding-window cache, biased experts weighted by a softmax of the selected, the output rows after the last
layer, whose output stays), over
``src/llama-graph.cpp``: build_inp_embd (2413-2533), build_attn for one cache (2943-3054: Q, V, K
expanded in that order) or two (3190-3283: Q, K, V), build_attn_mha (2691-2830), build_ffn (1799-1930),
build_moe_ffn (``graph_trunk``) and the caches' views and stores (``src/llama-kv-cache.cpp:1296-1465``;
without flash attention V is stored transposed, one row per element, so its index input is
``n_tokens x n_embd_v_gqa`` I64).

Only what ggml-alloc sees matters: shapes, the order ggml_build_forward_expand gives, which results
are views. Quantized caches (their Hadamard rotation inputs) are not replayed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from llamafit.gguf.model import ModelInfo
from llamafit.memory.graph.galloc import F32, I32, I64, Graph, Tensor, in_layer, of_layer
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.routing import read_experts
from llamafit.memory.graph.trunk import Experts, gated_ffn, input_embeddings, output_head, rms_norm, routed_and_shared

MROPE_SECTIONS = 4  # M-RoPE (and qwen35's IMROPE): four positions per token (llama-hparams.cpp:285-288)


@dataclass(frozen=True)
class TransformerShape(Recipe):
    arch: str  # "llama", "qwen2", "qwen3", "gemma3", ... (TRANSFORMER)
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: tuple[int, ...]
    head_k: int
    head_v: int
    n_ff: tuple[int, ...]
    is_swa: tuple[bool, ...]
    experts: Experts | None = None  # the FFN of the layers from n_dense_lead on is a mixture of experts
    n_pos: int = 1  # positions per token (4 with M-RoPE)
    qk_norm: bool = False  # RMS norms on Q and K before RoPE (Qwen3, Gemma 3, GLM-4.5)
    # the norms over Q's and K's whole width, before the heads are split (MiniMax-M2: minimax-m2.cpp:83-93)
    qk_norm_flat: bool = False
    no_rope: tuple[bool, ...] = ()  # the layers without RoPE (SmolLM3's every fourth, EXAONE 4's full layers)
    scales: tuple[bool, bool, bool] = (False, False, False)  # Granite's embedding, residual and logit scales
    n_dense_lead: int = 0  # leading layers with a dense FFN (GLM-4.5)
    n_ff_shexp: int = 0  # the shared expert's FFN beside the routed ones (GLM-4.5)
    biases: tuple[str, ...] = ()  # the projections with a bias (gpt-oss: Q, K, V and output; Qwen2: Q, K, V)
    sinks: bool = False  # attention sinks: one more source of the softmax or flash attention (gpt-oss)
    rows_at_end: bool = False  # the output rows taken after the last layer, whose output stays (t_h_nextn)
    attn_temp: bool = False  # Q times a per-token temperature input (Llama 4's scaling: Ministral 3, mistral3.cpp)
    n_deepstack: int = 0  # Qwen3-VL: the first layers each add a slice of a wider input (qwen3vl.cpp)

    any_v_layout: ClassVar[bool] = True

    def graph(self, r: Reserve) -> Graph:
        return Builder(self, r).graph()

    def first_layer(self) -> Recipe | None:
        return replace(self, n_layer=1)


def kq_mask(shape: tuple[int, int, int, int], fa: bool, f16: bool = True) -> Tensor:
    """The KQ mask the attention reads: F16 under flash attention (src/llama-graph.cpp:29-46). Builds before
    KQ_MASK_F16_SINCE made it F32 and cast it (``ggml_cast``): an input and a node the first attention adds."""
    if not fa:
        return Graph.input(shape, F32)
    if f16:
        return Graph.input(shape, 2)
    return Graph.op("cpy", shape, Graph.input(shape, F32), esize=2)


class Attending:
    """What every graph attending over a KV cache shares: the reserve's tokens and streams, the caches' index and
    mask inputs (``v_width``: the widest layer's V row, n_embd_v_gqa_max, which sizes a transposed V's indices:
    llama-kv-cache.cpp:1450-1465), the positions (``n_pos`` per token) and ``attend``."""

    def __init__(self, r: Reserve, v_width: int, n_pos: int, softcap: bool = False) -> None:
        self.r = r
        self.softcap = softcap  # the scores soft-capped before the softmax (attn_soft_cap: Gemma 2)
        self.g = Graph()
        n_seqs = max(1, r.n_seqs)
        self.T = -(-r.n_tokens // n_seqs) * n_seqs  # graph_reserve: a multiple of n_seqs
        self.ns = max(1, r.n_stream)
        self.v_trans = not r.flash_attn and r.v_trans
        v_rows = self.T * v_width if self.v_trans else self.T
        self.inputs = {
            kind: {
                "k_idxs": Graph.input((self.T,), I64),
                "v_idxs": Graph.input((v_rows,), I64),
                "mask": kq_mask((n_kv, self.T // self.ns, 1, self.ns), r.flash_attn, r.mask_f16),
                "k_rot": Graph.input((r.rot_k, r.rot_k)),
                "v_rot": Graph.input((r.rot_v, r.rot_v)),
            }
            for kind, n_kv in (("full", r.n_kv), ("swa", r.n_kv_swa))
        }
        self.pos = Graph.input((self.T * n_pos,), I32)

    def scaled_rows(self, rows: Tensor) -> Tensor:
        """build_inp_embd's token rows scaled by tok_scale (Gemma's sqrt(n_embd)): a per-row scale input after
        the select (llama-graph.cpp:2512-2527); before the mixed path, ggml_scale of the selected rows
        (gemma3.cpp:88-91 of 11393)."""
        if not self.r.mixed_batch:
            return Graph.like("scale", rows)
        scaled = Graph.like("mul", rows, Graph.input((1, self.T)))
        self.g.expand(scaled)
        return scaled

    def attend(
        self,
        q: Tensor,
        k: Tensor | None,
        v: Tensor | None,
        kind: str,
        *,
        two_caches: bool = False,
        sinks: Tensor | None = None,
        shared: tuple[int, int] | None = None,
    ) -> Tensor:
        """build_attn from the expansions of Q, K and V to the attention output (before ``wo``): the
        stores into the cache, then build_attn_mha over the cache's views (``sinks``: one more source of the
        softmax or flash attention, no node of its own: ggml_soft_max_add_sinks). ``shared``: no K and V, the
        cache of an earlier layer read (its index, its KV heads; heads as wide as Q's: Gemma 3n and 4,
        llama-graph.cpp:3220-3258)."""
        r, g, T = self.r, self.g, self.T
        if k is None or v is None:
            assert shared is not None
            if r.rot_k:  # Q is rotated for a quantized K cache, whoever's cache it reads (llama-graph.cpp:3205-3213)
                q = hadamard(q, self.inputs[kind]["k_rot"])
            g.expand(q)
            with in_layer(shared[0]):  # the caches are that layer's, on its device
                k_cache, v_cache = self.caches(q.ne[0], q.ne[0], shared[1], kind)
            return self.mha(q, k_cache, v_cache, kind, sinks)
        hk, n_kv_h, hv = k.ne[0], k.ne[1], v.ne[0]
        inp = self.inputs[kind]
        if r.rot_k:
            q, k = hadamard(q, inp["k_rot"]), hadamard(k, inp["k_rot"])
        if r.rot_v:
            v = hadamard(v, inp["v_rot"])
        for t in (q, k, v) if two_caches else (q, v, k):
            g.expand(t)
        k_cache, v_cache = self.caches(hk, hv, n_kv_h, kind)
        k2 = Graph.view(k, (hk * n_kv_h, T), (k.nb[2],))
        g.expand(Graph.set_rows(k_cache, k2, inp["k_idxs"]))
        if not self.v_trans:
            v2 = Graph.view(v, (hv * n_kv_h, T), (v.nb[2],))
            g.expand(Graph.set_rows(v_cache, v2, inp["v_idxs"]))
        else:  # the transposed V: one row per element (llama-kv-cache.cpp:1418-1436), a copy where its rows are
            # views of a wider tensor (a fused QKV's): their dims do not merge
            rows = hv * n_kv_h
            v2 = Graph.reshape(v, (rows, T)) if v.nb[2] == v.esize * rows else Graph.op("cont", (rows, T), v)
            v2 = Graph.reshape(v2, (1, rows * T))
            v_view = Graph.reshape(v_cache, (1, v_cache.ne[0] * v_cache.ne[1]))
            g.expand(Graph.set_rows(v_view, v2, inp["v_idxs"]))
        return self.mha(q, k_cache, v_cache, kind, sinks)

    def caches(self, hk: int, hv: int, n_kv_h: int, kind: str, name: str = "cache") -> tuple[Tensor, Tensor]:
        """A layer's K and V caches (``kind``: the full or the sliding-window one), whole streams; ``name``: as
        ``Graph.cache`` places them."""
        r = self.r
        n_kv = r.n_kv_swa if kind == "swa" else r.n_kv
        k_cache = Graph.cache((hk * n_kv_h, n_kv * self.ns), r.cache_esize, name)
        v_cache = Graph.cache((hv * n_kv_h, n_kv * self.ns), r.cache_esize_v, name)
        return k_cache, v_cache

    def mha(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, kind: str, sinks: Tensor | None) -> Tensor:
        """build_attn_mha over the caches' views: the query split into streams and permuted, the cache views
        permuted (views all)."""
        r, g, T, ns = self.r, self.g, self.T, self.ns
        inp = self.inputs[kind]
        n_kv = r.n_kv_swa if kind == "swa" else r.n_kv
        hk, nh = q.ne[0], q.ne[1]
        n_kv_h = k_cache.ne[0] // hk
        hv = v_cache.ne[0] // n_kv_h
        qs = Graph.view(q, (hk, T // ns, nh, ns))
        kp = Graph.view(k_cache, (hk, n_kv, n_kv_h, ns))
        vp = Graph.view(v_cache, (n_kv, hv, n_kv_h, ns) if self.v_trans else (hv, n_kv, n_kv_h, ns))
        mask = inp["mask"]
        extra = (sinks,) if sinks is not None else ()
        if r.flash_attn:
            out = of_layer(Graph.op("flash_attn_ext", (hv, nh, T // ns, ns), qs, kp, vp, mask, *extra))
            cur = Graph.reshape(out, (hv * nh, T))
        else:
            kq = Graph.op("mul_mat", (n_kv, T // ns, nh, ns), kp, qs)
            if self.softcap:  # scale, tanh, scale (llama-graph.cpp:2783-2790); flash attention takes it as a value
                kq = Graph.like("scale", Graph.like("unary", Graph.like("scale", kq)))
            kq = Graph.like("soft_max", kq, mask, *extra)
            if not self.v_trans:  # llama-graph.cpp:2801-2805
                vp = Graph.op("cont", (n_kv, hv, n_kv_h, ns), Graph.transpose(vp), esize=vp.esize)
            kqv = Graph.op("mul_mat", (hv, T // ns, nh, ns), vp, kq)
            perm = Graph.view(kqv, (hv, nh, T // ns, ns), (kqv.nb[2], kqv.nb[1], kqv.nb[3]))
            cur = Graph.op("cont", (hv * nh, T), perm)
        g.expand(cur)
        return hadamard(cur, inp["v_rot"]) if r.rot_v else cur


class Builder(Attending):
    """One reserve graph of a transformer; ``attend`` is shared with the MTP head's graph."""

    def __init__(self, sh: TransformerShape, r: Reserve) -> None:
        super().__init__(r, max(sh.n_head_kv) * sh.head_v, sh.n_pos, softcap=sh.arch == "gemma2")
        self.sh = sh
        self.gemma = sh.arch in ("gemma2", "gemma3")
        self.phi3 = sh.arch == "phi3"  # a fused QKV, a sequential SwiGLU, the residual added first (phi3.cpp:166)
        self.fused_up = sh.arch in _FUSED_UP
        # EXAONE 4 and OLMo 2 norm only the outputs (exaone4.cpp:113, 147-161; olmo2.cpp:90, 157-176)
        self.pre_norms = sh.arch not in _OUTPUT_NORMS
        self.post_norms = self.gemma or sh.arch in ("glm4", *_OUTPUT_NORMS)  # the attention's and FFN's outputs normed
        # the FFN's output norm is built as no layer's (il -1: gemma2.cpp:141-143, exaone4.cpp:161,
        # olmo2.cpp:174-176) but GLM-4's
        self.pin_ffn_post = sh.arch == "glm4"
        self.iswa = any(sh.is_swa)  # two caches: Q, K, V expanded in that order (llama-graph.cpp:3222-3230)
        # build_inp_attn_scale: one value a token, 1 x 1 x n_tokens (llama-graph.cpp:2554-2567)
        self.attn_scale = Graph.input((1, 1, self.T)) if sh.attn_temp else None

    def graph(self) -> Graph:
        sh, g, T = self.sh, self.g, self.T
        n_inp = sh.n_embd * (1 + sh.n_deepstack)  # n_embd_inp (llama-hparams.cpp:118-130)
        rows = input_embeddings(g, sh.n_embd, sh.n_vocab, T, mixed=self.r.mixed_batch, n_embd_inp=n_inp)
        inp_l = rows
        emb_scale, res_scale, logit_scale = sh.scales
        if emb_scale:  # build_inp_embd scales the selected rows (llama-graph.cpp:2508-2514)
            inp_l = Graph.like("scale", rows)
            g.expand(inp_l)
        elif sh.arch == "gemma2":  # the rows scaled by a node of its own after build_inp_embd (gemma2.cpp:66-69)
            inp_l = Graph.like("scale", rows)
        elif self.gemma:
            inp_l = self.scaled_rows(rows)
        out_ids = Graph.input((max(1, min(self.r.n_outputs, T)),), I32)
        for il in range(sh.n_layer):
            with in_layer(il):
                cur = self.attention(rms_norm(inp_l) if self.pre_norms else inp_l, il)
                if il == sh.n_layer - 1 and not sh.rows_at_end:
                    cur = Graph.get_rows(cur, out_ids)
                    inp_l = Graph.get_rows(inp_l, out_ids)
                if self.post_norms:
                    cur = rms_norm(cur)
                # Granite's residual branches scaled before each is added (granite.cpp:250-251, 310-311)
                ffn_inp = Graph.like("add", Graph.like("scale", cur) if res_scale else cur, inp_l)
                cur = self.ffn(rms_norm(ffn_inp) if self.pre_norms else ffn_inp, il)
                if self.post_norms:
                    cur = rms_norm(cur, pin=self.pin_ffn_post)
                if res_scale:
                    cur = Graph.like("scale", cur)
                inp_l = Graph.like("add", ffn_inp, cur) if self.phi3 else Graph.like("add", cur, ffn_inp)
                if il < sh.n_deepstack:  # the layer's slice of t_inp_embd, a view (qwen3vl.cpp deepstack_out)
                    inp_l = Graph.like("add", inp_l, Graph.view(rows, rows.ne, (rows.nb[1],)))
        if sh.rows_at_end:  # openai-moe.cpp:148-152: t_h_nextn, every token's, then the rows
            inp_l.is_output = True
            inp_l = Graph.get_rows(inp_l, out_ids)
        # gemma2.cpp:166-169, where Gemma 3 has none; Granite's scaled (granite.cpp:198)
        logits = "softcapped" if sh.arch == "gemma2" else "scaled" if logit_scale else "plain"
        output_head(g, inp_l, sh.n_vocab, self.r.pooling, max(1, self.r.n_seqs), self.r.samplers, logits=logits)
        return g

    def ffn(self, cur: Tensor, il: int) -> Tensor:
        """A dense gated FFN, or the routed experts plus the shared expert (glm4-moe.cpp, deepseek2.cpp)."""
        sh = self.sh
        if self.fused_up:  # build_ffn's SWIGLU of one up projection twice as wide (phi3.cpp:144-149)
            up = Graph.mul_mat(Graph.weight((sh.n_embd, 2 * sh.n_ff[il]), "ffn_up"), cur)
            glu = Graph.op("glu", (sh.n_ff[il], *up.ne[1:]), up)
            return Graph.mul_mat(Graph.weight((sh.n_ff[il], sh.n_embd), "ffn_down"), glu)
        if sh.experts is None or il < sh.n_dense_lead:
            return gated_ffn(cur, sh.n_ff[il])
        return routed_and_shared(self.g, cur, sh.experts, sh.n_ff_shexp, gated=False)

    def attention(self, cur: Tensor, il: int) -> Tensor:
        sh, T = self.sh, self.T
        W = Graph.weight
        n_kv_h = sh.n_head_kv[il]
        hk, hv, nh = sh.head_k, sh.head_v, sh.n_head

        def proj(name: str, rows: int, dims: tuple[int, int, int], flat_norm: bool = False) -> Tensor:
            t = self.bias(Graph.mul_mat(W((sh.n_embd, rows), name), cur), name)  # build_qkv's separate path
            return Graph.reshape(rms_norm(t) if flat_norm else t, dims)

        if self.phi3:  # build_qkv's fused path: Q, K and V views of one product (llama-graph.cpp:1700-1725)
            qkv = Graph.mul_mat(W((sh.n_embd, hk * nh + (hk + hv) * n_kv_h), "attn_qkv"), cur)
            q, k, v = (
                Graph.view(qkv, (h, n, T), (h * qkv.esize, qkv.nb[1]))
                for h, n in ((hk, nh), (hk, n_kv_h), (hv, n_kv_h))
            )
        else:
            q = proj("attn_q", hk * nh, (hk, nh, T), sh.qk_norm_flat)
            k = proj("attn_k", hk * n_kv_h, (hk, n_kv_h, T), sh.qk_norm_flat)
            v = proj("attn_v", hv * n_kv_h, (hv, n_kv_h, T))
        if sh.qk_norm:
            q, k = rms_norm(q), rms_norm(k)
        if not (sh.no_rope and sh.no_rope[il]):
            q = Graph.like("rope", q, self.pos)
            k = Graph.like("rope", k, self.pos)
        if self.gemma or self.phi3:
            q = Graph.like("scale", q)
        if self.attn_scale is not None:  # after RoPE (mistral3.cpp:153-157)
            q = Graph.like("mul", q, self.attn_scale)
        # one cache: Q, V, K (llama-graph.cpp:2971-2975); two caches: Q, K, V (llama-graph.cpp:3222-3230)
        sinks = W((nh,), "attn_sinks") if sh.sinks else None
        out = self.attend(q, k, v, "swa" if sh.is_swa[il] else "full", two_caches=self.iswa, sinks=sinks)
        return self.bias(Graph.mul_mat(W((hv * nh, sh.n_embd), "attn_output"), out), "attn_output")

    def bias(self, t: Tensor, name: str) -> Tensor:
        """A projection's bias added (llama-graph.cpp:1746-1780, 3274-3276), where the model has them."""
        return Graph.like("add", t, Graph.weight((t.ne[0],), f"{name}.bias")) if name in self.sh.biases else t


def rotation_size(head: int) -> int:
    """A K cache's Hadamard rotation: the largest power-of-two multiple of 64 dividing its head size
    (llama-kv-cache.cpp:340-347; the caller checks the head is a multiple of 64)."""
    rot = 64
    while head and head % (2 * rot) == 0:
        rot *= 2
    return rot


def hadamard(x: Tensor, rot: Tensor) -> Tensor:
    """llama_mul_mat_hadamard (src/llama-impl.h:57-75): rows of the rotation's size times the rotation
    (an input), reshaped back. The tensors it rotates here are contiguous."""
    n = rot.ne[0]
    total = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3]
    return Graph.reshape(Graph.mul_mat(rot, Graph.reshape(x, (n, total // n))), x.ne)


# arch -> the sliding-window types its builder knows
TRANSFORMER: dict[str, tuple[str, ...]] = {
    "llama": ("none",),
    "qwen2": ("none",),
    "qwen2vl": ("none",),
    "mistral3": ("none",),
    "phi3": ("none",),
    "qwen3": ("none",),
    "qwen3moe": ("none",),
    "qwen3vl": ("none",),
    "qwen3vlmoe": ("none",),
    "glm4moe": ("none",),
    "minimax-m2": ("none",),
    "glm4": ("none",),
    "ernie4_5": ("none",),
    "ernie4_5-moe": ("none",),
    "exaone4": ("none", "standard"),  # the 32B's sliding window (exaone4.cpp:3-9)
    "olmo2": ("none", "standard"),  # OLMo 3's sliding window (olmo2.cpp:6-16)
    "granite": ("none",),
    "granitemoe": ("none",),
    "seed_oss": ("none",),
    "smollm3": ("none",),
    "gemma2": ("standard",),
    "gemma3": ("standard",),
    "gpt-oss": ("standard",),
}
_OUTPUT_NORMS = ("exaone4", "olmo2")  # no norm before the attention or the FFN, their outputs normed
_FUSED_UP = ("phi3", "glm4")  # one up projection twice the FFN's width, no gate (phi3.cpp:46-52, glm4.cpp:46-48)
# their FFN is routed experts (Llama's may be)
_ROUTED = ("qwen3moe", "qwen3vlmoe", "glm4moe", "gpt-oss", "minimax-m2", "ernie4_5-moe", "granitemoe")
_DENSE_LEAD = ("glm4moe", "ernie4_5-moe")  # dense leading layers, then experts with a shared expert beside them
_SHARED_EXPERT = (*_DENSE_LEAD, "granitemoe")  # a shared expert added beside the routed ones where the file has one
_GRANITE = ("granite", "granitemoe")  # Granite's scales (granite.cpp)
_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output")
_GPT_OSS_LAYER = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_sinks.weight")
_GPT_OSS_EXPERTS = ("ffn_gate_inp.bias", "ffn_up_exps.bias", "ffn_gate_exps.bias", "ffn_down_exps.bias")


def transformer_shape(model: ModelInfo) -> TransformerShape | None:
    """The shape of a plain transformer (an architecture of ``TRANSFORMER``) read from its tensors and header; None
    where the file has what its builder does not make (fused QKV outside Phi-3, biases in some layers only, ...)."""
    hp = model.hparams
    if hp.swa_type not in TRANSFORMER.get(hp.arch, ()) or hp.n_layer_kv_from_start >= 0:
        return None
    if hp.n_nextn and hp.arch != "glm4moe":
        return None  # glm4-moe.cpp leaves its NextN blocks to the MTP graph; other trunks are not known here
    if bool(hp.n_expert) != (hp.arch in _ROUTED) and hp.arch != "llama":
        return None  # experts only where the builder routes them
    if isinstance(model.kv.get(f"{hp.arch}.expert_used_count"), list):
        return None  # a per-layer expert count
    if not hp.causal or len(set(hp.n_head)) != 1 or not hp.n_head[0]:
        return None
    shapes = {t.name: t.info.shape for t in model.tensors}
    names = set(shapes)
    lead = hp.n_layer_dense_lead if hp.arch in _DENSE_LEAD else 0
    if hp.arch == "ernie4_5-moe" and model.number("interleave_moe_layer_step") != 1:
        return None  # dense layers between the MoE ones (ernie4-5-moe.cpp:63-64)
    experts = read_experts(model, shapes, hp.n_layer - 1) if hp.n_expert else None
    if hp.n_expert and experts is None:
        return None
    shexp = shapes.get(f"blk.{hp.n_layer - 1}.ffn_up_shexp.weight")
    for il in range(hp.n_layer):
        ffn = f"blk.{il}.ffn_up_exps.weight" if experts and il >= lead else f"blk.{il}.ffn_gate.weight"
        need = {f"blk.{il}.attn_q.weight", f"blk.{il}.attn_k.weight", ffn}
        if hp.arch in _FUSED_UP:
            if (
                f"blk.{il}.ffn_gate.weight" in names
                or shapes.get(f"blk.{il}.ffn_up.weight", (0, 0))[1] != 2 * hp.n_ff[il]
            ):
                return None
            need = {f"blk.{il}.ffn_up.weight"}
            qkv = ("attn_qkv",) if hp.arch == "phi3" else ("attn_q", "attn_k")
            need |= {f"blk.{il}.{p}.weight" for p in qkv}
        if hp.arch in ("qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "gemma3"):
            need |= {f"blk.{il}.attn_q_norm.weight", f"blk.{il}.attn_k_norm.weight"}
        if hp.arch == "gpt-oss":  # every bias and the sinks: the graph adds each (openai-moe.cpp:38-50)
            need |= {f"blk.{il}.{t}" for t in (*_GPT_OSS_LAYER, *_GPT_OSS_EXPERTS)}
        if not need <= names or (f"blk.{il}.attn_qkv.weight" in names and hp.arch != "phi3"):
            return None  # fused QKV or a non-gated FFN: other nodes
    if hp.arch in ("gemma2", "gemma3") and (hp.head_k_swa != hp.head_k or hp.head_v_swa != hp.head_v):
        return None
    if hp.arch in _GRANITE and f"{hp.arch}.deepstack_mapping" in model.kv:
        return None  # Granite Vision's deepstack streams (granite.cpp:12-31, 152-160)
    deepstack = int(model.number("n_deepstack_layers")) if hp.arch in ("qwen3vl", "qwen3vlmoe") else 0
    if not 0 <= deepstack <= hp.n_layer:
        return None  # more deepstack slices than layers: not a header llama.cpp's graph reads
    if "output.bias" in names or any(f"blk.0.ffn_{p}.bias" in names for p in ("up", "gate", "down")):
        return None  # the logits' bias (qwen2.cpp's output_b), the FFN's (mistral3.cpp's): nodes it does not make
    # the projections' biases build_qkv and build_attn add where the file has them (llama-graph.cpp:1746-1780)
    # (ERNIE 4.5 loads an output bias and adds none: ernie4-5.cpp:45, 118-120)
    added = _PROJECTIONS[:3] if hp.arch.startswith("ernie4_5") else _PROJECTIONS
    biases = tuple(p for p in added if all(f"blk.{il}.{p}.bias" in names for il in range(hp.n_layer)))
    if any(f"blk.{il}.{p}.bias" in names for p in added if p not in biases for il in range(hp.n_layer)):
        return None  # biases in some layers only
    qk_norm = "blk.0.attn_q_norm.weight" in names and "blk.0.attn_k_norm.weight" in names
    flat = qk_norm and shapes["blk.0.attn_q_norm.weight"][0] != hp.head_k  # one weight over all the heads
    sections = model.kv.get(f"{hp.arch}.rope.dimension_sections")
    mrope = isinstance(sections, list) and any(isinstance(x, int) and x for x in sections)
    return TransformerShape(
        arch=hp.arch,
        n_layer=hp.n_layer,
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=hp.n_head[0],
        n_head_kv=tuple(hp.n_head_kv[: hp.n_layer]),
        head_k=hp.head_k,
        head_v=hp.head_v,
        n_ff=tuple(hp.n_ff[: hp.n_layer]),
        is_swa=tuple(hp.is_swa[: hp.n_layer]),
        experts=experts,
        n_pos=MROPE_SECTIONS if mrope else 1,
        qk_norm=qk_norm and not flat,
        qk_norm_flat=qk_norm and flat,
        n_dense_lead=lead,
        n_ff_shexp=shexp[1] if shexp is not None and hp.arch in _SHARED_EXPERT else 0,
        biases=biases,
        sinks=hp.arch == "gpt-oss",
        rows_at_end=hp.arch == "gpt-oss",
        attn_temp=hp.arch == "mistral3" and bool(model.kv.get("mistral3.attention.temperature_scale")),
        n_deepstack=deepstack,
        no_rope=_no_rope(model, hp.is_swa[: hp.n_layer]),
        scales=_granite_scales(model),
    )


def _no_rope(model: ModelInfo, is_swa: Sequence[bool]) -> tuple[bool, ...]:
    """The layers built without RoPE: SmolLM3's every fourth (n_no_rope_layer_step, set by the loader and read from
    no key: llama-hparams.h:259, smollm3.cpp:5, 69, 83-95), EXAONE 4's full-attention layers where it has sliding
    ones (exaone4.cpp:111), every layer of a Granite whose ``rope.scaling.finetuned`` is false (granite.cpp:33-37,
    its has_rope)."""
    arch = model.hparams.arch
    if arch == "smollm3":
        return tuple((il + 1) % 4 == 0 for il in range(len(is_swa)))
    if arch == "exaone4" and any(is_swa):
        return tuple(not s for s in is_swa)
    if arch == "granite" and model.kv.get(f"{arch}.rope.scaling.finetuned", True) is False:
        return (True,) * len(is_swa)
    return ()


def _granite_scales(model: ModelInfo) -> tuple[bool, bool, bool]:
    """Granite's embedding and residual scales where the file sets them, its logits always scaled (the key is
    required: granite.cpp:7-9, 198)."""
    if model.hparams.arch not in _GRANITE:
        return (False, False, False)
    return (model.number("embedding_scale") != 0.0, model.number("residual_scale") != 0.0, True)

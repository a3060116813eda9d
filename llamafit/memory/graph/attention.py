"""The reserve graph of a transformer with a KV cache, node by node, for ``llamafit.memory.graph.galloc``.

One builder for every family ``llamafit.memory.graph.transformers`` reads (Llama's graph, ``src/models/llama.cpp``,
and each family's differences as a field of ``TransformerShape``: biased projections, Q/K norms per head or over
the whole width, fused QKV views, sandwich or output-only norms, one up projection split by its SwiGLU, layers
without RoPE, sliding-window layers, soft-capped scores and logits, attention sinks, Llama 4's attention
temperature, M-RoPE and deepstack slices, Granite's scales, routed experts with a shared expert beside them), over
``src/llama-graph.cpp``: build_inp_embd (2413-2533), build_attn for one cache (2943-3054: Q, V, K
expanded in that order) or two (3190-3283: Q, K, V), build_attn_mha (2691-2830), build_ffn (1799-1930),
build_moe_ffn (``graph_trunk``) and the caches' views and stores (``src/llama-kv-cache.cpp:1296-1465``;
without flash attention V is stored transposed, one row per element, so its index input is
``n_tokens x n_embd_v_gqa`` I64).

Only what ggml-alloc sees matters: shapes, the order ggml_build_forward_expand gives, which results
are views. Quantized caches (their Hadamard rotation inputs) are not replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from llamafit.gguf.hparams import Hparams
from llamafit.memory.graph.galloc import F32, I32, I64, Graph, Tensor, in_layer, of_layer
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.trunk import (
    Experts,
    Logits,
    gated_ffn,
    input_embeddings,
    output_head,
    rms_norm,
    routed_and_shared,
)

MROPE_SECTIONS = 4  # M-RoPE (and qwen35's IMROPE): four positions per token (llama-hparams.cpp:285-288)
OUTPUT_NORMS = ("exaone4", "olmo2")  # no norm before the attention or the FFN, their outputs normed
COHERE = ("command-r", "cohere2")  # the attention and the FFN in parallel over layer norms
FUSED_UP = ("phi3", "glm4")  # one up projection twice the FFN's width, no gate (phi3.cpp:46-52, glm4.cpp:46-48)


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
    qk_norm_late: bool = False  # the Q/K norms after RoPE (Hunyuan-A13B: hunyuan-moe.cpp:100-118)
    no_rope: tuple[bool, ...] = ()  # the layers without RoPE (SmolLM3's every fourth, EXAONE 4's full layers)
    scales: tuple[bool, bool, bool] = (False, False, False)  # Granite's embedding, residual and logit scales
    shexp_gate: str = ""  # the shared expert's gate (``trunk.routed_and_shared``): Qwen2-MoE's "silu_div"
    n_dense_lead: int = 0  # leading layers with a dense FFN (GLM-4.5)
    n_ff_shexp: int = 0  # the shared expert's FFN beside the routed ones (GLM-4.5)
    biases: tuple[str, ...] = ()  # the projections with a bias (gpt-oss: Q, K, V and output; Qwen2: Q, K, V)
    sinks: bool = False  # attention sinks: one more source of the softmax or flash attention (gpt-oss)
    rows_at_end: bool = False  # the output rows taken after the last layer, whose output stays (t_h_nextn)
    attn_temp: bool = False  # Q times a per-token temperature input (Llama 4's scaling: Ministral 3, mistral3.cpp)
    # Llama 4 (llama4.cpp:143-185): Q times that input in place of RoPE on the layers without it, Q and K L2-normed
    # (an RMS norm without weight) after RoPE on the others
    temp_nope: bool = False
    l2_qk: bool = False
    moe_layers: tuple[bool, ...] = ()  # the layers whose FFN is the experts (Llama 4's interleave); (): every layer
    n_deepstack: int = 0  # Qwen3-VL: the first layers each add a slice of a wider input (qwen3vl.cpp)

    any_v_layout: ClassVar[bool] = True

    def graph(self, r: Reserve) -> Graph:
        return Builder(self, r).graph()

    def first_layer(self) -> Recipe | None:
        return replace(self, n_layer=1)

    @classmethod
    def of(cls, hp: Hparams, arch: str, is_swa: tuple[bool, ...] | None = None) -> TransformerShape:
        """The widths of the header's layers (the NextN layers past them left out); the family's differences are
        set on it with ``dataclasses.replace``."""
        n = hp.n_layer
        return cls(
            arch=arch,
            n_layer=n,
            n_embd=hp.n_embd,
            n_vocab=hp.n_vocab,
            n_head=hp.n_head[0],
            n_head_kv=tuple(hp.n_head_kv[:n]),
            head_k=hp.head_k,
            head_v=hp.head_v,
            n_ff=tuple(hp.n_ff[:n]),
            is_swa=tuple(hp.is_swa[:n]) if is_swa is None else is_swa,
        )


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
        self.fused_up = sh.arch in FUSED_UP
        # EXAONE 4 and OLMo 2 norm only the outputs (exaone4.cpp:113, 147-161; olmo2.cpp:90, 157-176)
        self.pre_norms = sh.arch not in OUTPUT_NORMS
        self.post_norms = self.gemma or sh.arch in ("glm4", *OUTPUT_NORMS)  # the attention's and FFN's outputs normed
        # the FFN's output norm is built as no layer's (il -1: gemma2.cpp:141-143, exaone4.cpp:161,
        # olmo2.cpp:174-176) but GLM-4's
        self.pin_ffn_post = sh.arch == "glm4"
        self.cohere = sh.arch in COHERE  # one norm before the attention and the FFN side by side
        self.op = "norm" if self.cohere else "rms_norm"  # Cohere's are layer norms (LLM_NORM)
        self.iswa = any(sh.is_swa)  # two caches: Q, K, V expanded in that order (llama-graph.cpp:3222-3230)
        # build_inp_attn_scale: one value a token, 1 x 1 x n_tokens (llama-graph.cpp:2554-2567)
        self.attn_scale = Graph.input((1, 1, self.T)) if sh.attn_temp or sh.temp_nope else None

    def graph(self) -> Graph:
        sh, g, T = self.sh, self.g, self.T
        n_inp = sh.n_embd * (1 + sh.n_deepstack)  # n_embd_inp (llama-hparams.cpp:118-130)
        rows = input_embeddings(g, sh.n_embd, sh.n_vocab, T, mixed=self.r.mixed_batch, n_embd_inp=n_inp)
        inp_l = rows
        emb_scale, _, logit_scale = sh.scales
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
                rows_of = out_ids if il == sh.n_layer - 1 and not sh.rows_at_end else None
                inp_l = self.parallel(inp_l, il, rows_of) if self.cohere else self.layer(inp_l, il, rows_of)
                if il < sh.n_deepstack:  # the layer's slice of t_inp_embd, a view (qwen3vl.cpp deepstack_out)
                    inp_l = Graph.like("add", inp_l, Graph.view(rows, rows.ne, (rows.nb[1],)))
        if sh.rows_at_end:  # openai-moe.cpp:148-152: t_h_nextn, every token's, then the rows
            inp_l.is_output = True
            inp_l = Graph.get_rows(inp_l, out_ids)
        # gemma2.cpp:166-169, where Gemma 3 has none; Granite's scaled (granite.cpp:198)
        logits = Logits("softcapped" if sh.arch == "gemma2" else "scaled" if logit_scale else "plain", self.op)
        output_head(g, inp_l, sh.n_vocab, self.r.pooling, max(1, self.r.n_seqs), self.r.samplers, logits=logits)
        return g

    def layer(self, inp_l: Tensor, il: int, out_ids: Tensor | None) -> Tensor:
        """One layer: the attention, then the FFN, each added to its input (``out_ids``: the last layer's rows)."""
        res_scale = self.sh.scales[1]
        cur = self.attention(self.norm(inp_l) if self.pre_norms else inp_l, il)
        if out_ids is not None:
            cur = Graph.get_rows(cur, out_ids)
            inp_l = Graph.get_rows(inp_l, out_ids)
        if self.post_norms:
            cur = self.norm(cur)
        # Granite's residual branches scaled before each is added (granite.cpp:250-251, 310-311)
        ffn_inp = Graph.like("add", Graph.like("scale", cur) if res_scale else cur, inp_l)
        cur = self.ffn(self.norm(ffn_inp) if self.pre_norms else ffn_inp, il)
        if self.post_norms:
            cur = self.norm(cur, pin=self.pin_ffn_post)
        if res_scale:
            cur = Graph.like("scale", cur)
        return Graph.like("add", ffn_inp, cur) if self.phi3 else Graph.like("add", cur, ffn_inp)

    def parallel(self, inp_l: Tensor, il: int, out_ids: Tensor | None) -> Tensor:
        """Cohere's layer: the attention and the FFN both on the one normed input, both added to the layer's input
        (command-r.cpp:66-125, cohere2.cpp:69-138)."""
        ffn_inp = self.norm(inp_l)
        cur = self.attention(ffn_inp, il)
        if out_ids is not None:
            cur, inp_l, ffn_inp = (Graph.get_rows(t, out_ids) for t in (cur, inp_l, ffn_inp))
        return Graph.like("add", Graph.like("add", self.ffn(ffn_inp, il), inp_l), cur)

    def norm(self, x: Tensor, pin: bool = True) -> Tensor:
        return rms_norm(x, pin=pin, op=self.op)

    def ffn(self, cur: Tensor, il: int) -> Tensor:
        """A dense gated FFN, or the routed experts plus the shared expert (glm4-moe.cpp, deepseek2.cpp)."""
        sh = self.sh
        if self.fused_up:  # build_ffn's SWIGLU of one up projection twice as wide (phi3.cpp:144-149)
            up = Graph.mul_mat(Graph.weight((sh.n_embd, 2 * sh.n_ff[il]), "ffn_up"), cur)
            glu = Graph.op("glu", (sh.n_ff[il], *up.ne[1:]), up)
            return Graph.mul_mat(Graph.weight((sh.n_ff[il], sh.n_embd), "ffn_down"), glu)
        if sh.arch == "arcee":  # build_ffn's RELU_SQR of one up projection (arcee.cpp:123-128)
            up = Graph.mul_mat(Graph.weight((sh.n_embd, sh.n_ff[il]), "ffn_up"), cur)
            act = Graph.like("sqr", Graph.like("unary", up))
            return Graph.mul_mat(Graph.weight((sh.n_ff[il], sh.n_embd), "ffn_down"), act)
        if sh.experts is None or il < sh.n_dense_lead or (sh.moe_layers and not sh.moe_layers[il]):
            return gated_ffn(cur, sh.n_ff[il])
        return routed_and_shared(self.g, cur, sh.experts, sh.n_ff_shexp, sh.shexp_gate)

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
        if sh.qk_norm and not sh.qk_norm_late:
            q, k = self.norm(q), self.norm(k)
        if not (sh.no_rope and sh.no_rope[il]):
            q = Graph.like("rope", q, self.pos)
            k = Graph.like("rope", k, self.pos)
        if sh.qk_norm and sh.qk_norm_late:
            q, k = self.norm(q), self.norm(k)
            if sh.l2_qk:
                q, k = Graph.like("rms_norm", q), Graph.like("rms_norm", k)
        elif self.attn_scale is not None and sh.temp_nope:
            q = Graph.like("mul", q, self.attn_scale)
        if self.gemma or self.phi3:
            q = Graph.like("scale", q)
        if self.attn_scale is not None and sh.attn_temp:  # after RoPE (mistral3.cpp:153-157)
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

"""The reserve graph of a hybrid whose every layer is one kind, node by node, for ``galloc``: LFM2 (short
convolutions and attention, each with a dense FFN or experts), Nemotron-H (Mamba-2, attention, MLP and
expert layers) and Granite-4.0-H (Mamba-2 or attention, each with a dense FFN or experts).

Mirrors ``src/models/lfm2.cpp:97-296`` (graph<iswa>: build_shortconv_block, build_attn_block with Q/K
norms and RoPE over one cache or the sliding-window cache of ``build_inp_mem_hybrid_iswa``, the residual
before the FFN, the last layer's output rows) and ``src/models/nemotron-h.cpp:188-340`` (build_mamba2_layer
of mamba-base.cpp:153-300, attention without RoPE, the squared-ReLU MLP of build_ffn, llama-graph.cpp:1931;
after the last layer the output norm over every token (``t_h_nextn``), then its output rows and the logits,
all three graph outputs: ``embeddings_nextn_masked`` is off outside an MTP context) and
``src/models/granite-hybrid.cpp:143-302`` (the embedding, residual and logit scales, RoPE only where the file
asks for it, softmax-routed experts beside a gated shared expert).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from llamafit.gguf.model import ModelInfo
from llamafit.memory.graph.attention import Builder, TransformerShape
from llamafit.memory.graph.galloc import I32, Graph, Tensor, in_layer
from llamafit.memory.graph.mamba import MambaLayers, MambaShape
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.trunk import (
    Experts,
    Logits,
    RecurrentStates,
    gated_ffn,
    input_embeddings,
    moe_ffn,
    output_head,
    rms_norm,
)

CONV, MAMBA2, ATTN, MLP, MOE = "conv", "mamba2", "attn", "mlp", "moe"


@dataclass(frozen=True)
class LayeredShape(Recipe):
    arch: str  # "lfm2" | "nemotron_h"
    kinds: tuple[str, ...]  # each layer's kind: CONV (LFM2), MAMBA2, ATTN, MLP or MOE (Nemotron-H)
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: tuple[int, ...]
    head_dim: int
    n_ff: tuple[int, ...]
    swa: bool = False  # LFM2's attention layers on the sliding-window cache
    l_cache: int = 0  # LFM2's short-convolution length (its state keeps l_cache - 1 columns)
    mamba: MambaShape | None = None  # Nemotron-H's Mamba-2 layers
    experts: Experts | None = None  # LFM2-MoE's FFN from n_dense_lead on, Nemotron-H MoE's MOE layers
    n_dense_lead: int = 0
    n_ff_shexp: int = 0  # Nemotron-H MoE's shared expert (squared ReLU, no gate)
    latent: int = 0  # Nemotron-H MoE's experts on a latent projection of this width (0: none)
    rope: bool = False  # RoPE on Q and K (LFM2 always, with Q/K norms; Granite-4.0-H where the file says)
    qk_norm: bool = False
    scales: tuple[bool, bool, bool] = (False, False, False)  # Granite's embedding, residual and logit scales

    any_v_layout: ClassVar[bool] = True

    def graph(self, r: Reserve) -> Graph:
        return _layered_graph(self, r)

    def first_layer(self) -> Recipe | None:
        return replace(self, kinds=self.kinds[:1], n_head_kv=self.n_head_kv[:1], n_ff=self.n_ff[:1])

    def rotations(self, rot: tuple[int, int], quantized: bool) -> tuple[int, int] | None:
        # build_inp_mem_hybrid_iswa makes no rotation inputs (llama-graph.cpp:3741-3770)
        return (0, 0) if self.swa else rot


def _layered_graph(sh: LayeredShape, r: Reserve) -> Graph:
    """The reserve graph (its weights, caches and states tagged under ``galloc.placed``)."""
    n_layer = len(sh.kinds)
    trunk = TransformerShape(
        arch=sh.arch,
        n_layer=n_layer,
        n_embd=sh.n_embd,
        n_vocab=sh.n_vocab,
        n_head=sh.n_head,
        n_head_kv=sh.n_head_kv,
        head_k=sh.head_dim,
        head_v=sh.head_dim,
        n_ff=sh.n_ff,
        is_swa=(sh.swa,) * n_layer,
        qk_norm=sh.qk_norm,
    )
    builder: type[_Layers] = {"nemotron_h": _NemotronH, "nemotron_h_moe": _NemotronH, "granitehybrid": _Granite}.get(
        sh.arch, _Lfm2
    )
    return builder(sh, Builder(trunk, r)).graph()


class _Layers:
    def __init__(self, sh: LayeredShape, b: Builder) -> None:
        self.sh, self.b, self.g, self.r = sh, b, b.g, b.r
        self.n_seqs = max(1, b.r.n_seqs)
        self.nst = b.T // self.n_seqs
        self.K = b.r.n_rs_seq + 1 if b.r.n_rs_seq > 0 else 1
        self.mamba = MambaLayers(sh.mamba, b.r, g=self.g) if sh.mamba else None
        self.rs = self.mamba.rs if self.mamba else RecurrentStates(self.g, self.n_seqs, b.r.rs_one_gather)

    def graph(self) -> Graph:
        raise NotImplementedError  # each architecture's trunk

    def attention(self, cur: Tensor, il: int) -> Tensor:
        """build_qkv's separate projections, LFM2's Q/K norms, RoPE, build_attn, the output projection."""
        sh, b, T = self.sh, self.b, self.b.T
        W = Graph.weight
        hd, nh, nkv = sh.head_dim, sh.n_head, sh.n_head_kv[il]
        q = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nh), "attn_q"), cur), (hd, nh, T))
        k = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nkv), "attn_k"), cur), (hd, nkv, T))
        v = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nkv), "attn_v"), cur), (hd, nkv, T))
        if sh.qk_norm:
            q, k = rms_norm(q, "attn_q_norm"), rms_norm(k, "attn_k_norm")
        if sh.rope:
            q, k = Graph.like("rope", q, b.pos), Graph.like("rope", k, b.pos)
        out = b.attend(q, k, v, "swa" if sh.swa else "full", two_caches=sh.swa)
        return Graph.mul_mat(W((hd * nh, sh.n_embd), "attn_output"), out)

    def ffn(self, cur: Tensor, il: int) -> Tensor:
        """A layer's dense gated FFN, or its experts (with a gated shared expert beside them)."""
        sh = self.sh
        if sh.experts is None or il < sh.n_dense_lead:
            return gated_ffn(cur, sh.n_ff[il])
        out = moe_ffn(self.g, cur, sh.experts)
        return Graph.like("add", out, gated_ffn(cur, sh.n_ff_shexp, "_shexp")) if sh.n_ff_shexp else out


class _Lfm2(_Layers):
    def graph(self) -> Graph:
        sh, g, T = self.sh, self.g, self.b.T
        inp_l = input_embeddings(g, sh.n_embd, sh.n_vocab, T, mixed=self.r.mixed_batch)
        out_ids = Graph.input((max(1, min(self.r.n_outputs, T)),), I32)
        last = len(sh.kinds) - 1
        for il, kind in enumerate(sh.kinds):
            with in_layer(il):
                prev = inp_l
                cur = rms_norm(inp_l)
                cur = self.shortconv(cur) if kind == CONV else self.attention(cur, il)
                if il == last:
                    cur, prev = Graph.get_rows(cur, out_ids), Graph.get_rows(prev, out_ids)
                cur = Graph.like("add", prev, cur)
                inp_l = Graph.like("add", cur, self.ffn(rms_norm(cur), il))
        output_head(g, inp_l, sh.n_vocab, self.r.pooling, self.n_seqs, self.r.samplers)
        return g

    def shortconv(self, cur: Tensor) -> Tensor:
        """build_shortconv_block: B, C and x out of one projection, the conv over the gathered state and
        B*x, its last window(s) saved (with rollback, one per snapshot), C times the conv, the projection."""
        sh, nst, ns, E = self.sh, self.nst, self.n_seqs, self.sh.n_embd
        W = Graph.weight
        d_conv = sh.l_cache - 1
        cur = Graph.reshape(cur, (E, nst, ns))
        bcx = Graph.mul_mat(W((E, 3 * E), "shortconv.in_proj"), cur)
        b, c, x = (Graph.view(bcx, (E, nst, ns), (bcx.nb[1], bcx.nb[2])) for _ in range(3))
        bx = Graph.transpose(Graph.like("mul", b, x))
        n_embd_r = d_conv * E
        conv_all = Graph.cache((n_embd_r, self.K * self.rs.n_rs))
        conv = Graph.reshape(self.rs.gather(conv_all, n_embd_r), (d_conv, E, ns))
        bx = Graph.op("concat", (d_conv + nst, E, ns), conv, bx)
        for _slot in range(min(nst, self.K)):
            snap = Graph.view(bx, (d_conv, E, ns), (bx.nb[1], bx.nb[2]))
            self.rs.cpy(snap, Graph.view(conv_all, (n_embd_r, ns)))
        conv_out = Graph.op("ssm_conv", (E, nst, ns), bx, W((sh.l_cache, E), "shortconv.conv"))
        y = Graph.mul_mat(W((E, E), "shortconv.out_proj"), Graph.like("mul", c, conv_out))
        return Graph.reshape(y, (E, self.b.T))


class _NemotronH(_Layers):
    def graph(self) -> Graph:
        sh, g, T = self.sh, self.g, self.b.T
        inp_l = input_embeddings(g, sh.n_embd, sh.n_vocab, T, mixed=self.r.mixed_batch)
        out_ids = Graph.input((max(1, min(self.r.n_outputs, T)),), I32)
        assert self.mamba is not None or MAMBA2 not in sh.kinds
        in_layer_rows = not self.r.rows_after_norm  # before NEMOTRON_ROWS_AFTER_NORM_SINCE
        for il, kind in enumerate(sh.kinds):
            with in_layer(il):
                sa = inp_l
                cur = rms_norm(inp_l)
                if kind == MAMBA2 and self.mamba is not None:
                    cur = self.mamba.mamba2(cur)
                elif kind == ATTN:
                    cur = self.attention(cur, il)
                elif kind == MOE:
                    cur = self.moe(cur)
                else:
                    cur = self.mlp(cur, sh.n_ff[il])
                if in_layer_rows and il == len(sh.kinds) - 1:
                    cur, sa = Graph.get_rows(cur, out_ids), Graph.get_rows(sa, out_ids)
                inp_l = Graph.like("add", cur, sa)
        rows = None if in_layer_rows else out_ids
        output_head(g, inp_l, sh.n_vocab, self.r.pooling, self.n_seqs, self.r.samplers, rows=rows)
        return g

    @staticmethod
    def mlp(cur: Tensor, n_ff: int, suffix: str = "") -> Tensor:
        """build_ffn with no gate and LLM_FFN_RELU_SQR: up, ReLU, square, down (``suffix``: ``_shexp``)."""
        up = Graph.mul_mat(Graph.weight((cur.ne[0], n_ff), f"ffn_up{suffix}"), cur)
        act = Graph.like("sqr", Graph.like("unary", up))
        return Graph.mul_mat(Graph.weight((n_ff, cur.ne[0]), f"ffn_down{suffix}"), act)

    def moe(self, cur: Tensor) -> Tensor:
        """build_ffn_layer's MoE (nemotron-h.cpp:292-336): routed on the layer's input, the squared-ReLU
        experts on its latent projection (and back), the shared expert on the input, added."""
        sh, W = self.sh, Graph.weight
        assert sh.experts is not None
        E = sh.n_embd
        latent = Graph.mul_mat(W((E, sh.latent), "ffn_latent_down"), cur) if sh.latent else cur
        logits = Graph.mul_mat(W((E, sh.experts.n_expert), "ffn_gate_inp"), cur)
        out = moe_ffn(self.g, latent, sh.experts, logits)
        if sh.latent:
            out = Graph.mul_mat(W((sh.latent, E), "ffn_latent_up"), out)
        return Graph.like("add", out, self.mlp(cur, sh.n_ff_shexp, "_shexp"))


class _Granite(_Layers):
    def graph(self) -> Graph:
        sh, g, T = self.sh, self.g, self.b.T
        emb_scale, res_scale, logit_scale = sh.scales
        inp_l = input_embeddings(g, sh.n_embd, sh.n_vocab, T, mixed=self.r.mixed_batch)
        if emb_scale:  # build_inp_embd scales the selected rows (llama-graph.cpp:2509-2514)
            inp_l = Graph.like("scale", inp_l)
            g.expand(inp_l)
        out_ids = Graph.input((max(1, min(self.r.n_outputs, T)),), I32)
        last = len(sh.kinds) - 1
        assert self.mamba is not None
        for il, kind in enumerate(sh.kinds):
            with in_layer(il):
                sa = inp_l
                cur = rms_norm(inp_l)
                cur = self.mamba.mamba2(cur) if kind == MAMBA2 else self.attention(cur, il)
                if il == last:
                    cur, sa = Graph.get_rows(cur, out_ids), Graph.get_rows(sa, out_ids)
                # build_layer_ffn: each residual branch scaled before it is added
                ffn_inp = Graph.like("add", Graph.like("scale", cur) if res_scale else cur, sa)
                out = self.ffn(rms_norm(ffn_inp), il)
                inp_l = Graph.like("add", Graph.like("scale", out) if res_scale else out, ffn_inp)
        output_head(
            g,
            inp_l,
            sh.n_vocab,
            self.r.pooling,
            self.n_seqs,
            self.r.samplers,
            logits=Logits("scaled" if logit_scale else "plain"),
        )
        return g


# each layer kind's tensors (the file's names in the layer, without ``.weight``): a layer with any other
# (biases, a fused QKV, experts of another layout) has nodes the builder does not make
_LAYER_TENSORS = {
    CONV: {"attn_norm", "shortconv.conv", "shortconv.in_proj", "shortconv.out_proj"},
    MAMBA2: {
        "attn_norm",
        "ssm_in",
        "ssm_conv1d",
        "ssm_conv1d.bias",
        "ssm_dt.bias",
        "ssm_a",
        "ssm_d",
        "ssm_norm",
        "ssm_out",
    },
    ATTN: {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output"},
    MLP: {"attn_norm", "ffn_up", "ffn_down"},
    MOE: {
        "attn_norm",
        "ffn_gate_inp",
        "exp_probs_b.bias",
        "ffn_up_exps",
        "ffn_down_exps",
        "ffn_up_shexp",
        "ffn_down_shexp",
    },
}
_LFM2_ATTN = {"attn_q_norm", "attn_k_norm"}
_LFM2_FFN = {"ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}
_LFM2_MOE = {"ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "exp_probs_b.bias"}
_LATENT = {"ffn_latent_down", "ffn_latent_up"}
_GRANITE_MOE = {"ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}
_SHEXP = {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"}


def layered_shape(model: ModelInfo) -> LayeredShape | None:
    """LFM2 and LFM2-MoE (no ColBERT head) and Nemotron-H and its MoE (no MTP block) whose layers hold exactly
    their kind's tensors; one head count, K and V heads of one width, one expert count per layer."""
    hp = model.hparams
    lfm2 = hp.arch in ("lfm2", "lfm2moe")
    n = hp.n_layer
    if hp.n_nextn or hp.head_k != hp.head_v or not hp.causal or len(set(hp.n_head[:n])) != 1:
        return None
    if lfm2 and (hp.shortconv_l_cache < 2 or hp.swa_type not in ("none", "standard")):
        return None
    names: dict[int, set[str]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for t in model.tensors:
        shapes[t.name] = t.info.shape
        if t.name.startswith("blk.") and t.layer is not None:
            names.setdefault(t.layer, set()).add(t.name.split(".", 2)[2].removesuffix(".weight"))
        elif t.name.startswith("dense_2_out"):  # LFM2-ColBERT's projection head
            return None
    latent = next((s[1] for name, s in shapes.items() if name.endswith(".ffn_latent_down.weight")), 0)
    granite = hp.arch == "granitehybrid"
    kinds = []
    for il in range(n):
        layer = names.get(il, set())
        if lfm2 or granite:  # a mixer, then an FFN or experts (from n_dense_lead) in every layer
            kind = (CONV if lfm2 else MAMBA2) if hp.is_recr[il] else ATTN
            moe = (hp.arch == "lfm2moe" and il >= hp.n_layer_dense_lead) or (granite and hp.n_expert > 0)
            ffn = (_LFM2_MOE if lfm2 else _GRANITE_MOE | (_SHEXP if hp.n_ff_shexp else set())) if moe else _LFM2_FFN
            want = _LAYER_TENSORS[kind] | ffn | (_LFM2_ATTN if lfm2 and kind == ATTN else set())
        else:
            kind = MAMBA2 if hp.is_recr[il] else ATTN if hp.n_ff[il] == 0 else MOE if "ffn_gate_inp" in layer else MLP
            want = _LAYER_TENSORS[kind] | (_LATENT if kind == MOE and latent else set())
        if layer != want:
            return None
        kinds.append(kind)
    has_moe = MOE in kinds or (hp.arch == "lfm2moe" and hp.n_layer_dense_lead < n) or (granite and hp.n_expert > 0)
    experts = _experts(model, shapes, kinds) if has_moe else None
    if has_moe and experts is None:
        return None
    mamba = None
    if not lfm2:
        if not hp.ssm_dt_rank or hp.ssm_d_inner % hp.ssm_dt_rank or hp.ssm_d_inner % max(1, hp.ssm_n_group):
            return None
        mamba = MambaShape(
            2,
            n,
            hp.n_embd,
            hp.n_vocab,
            hp.ssm_d_conv,
            hp.ssm_d_inner,
            hp.ssm_d_state,
            hp.ssm_dt_rank,
            max(1, hp.ssm_n_group),
        )
    shexp = shapes.get("blk.0.ffn_up_shexp.weight") or next(
        (shapes[f"blk.{il}.ffn_up_shexp.weight"] for il, k in enumerate(kinds) if k == MOE), (0, 0)
    )
    scale = [model.number(k) != 0.0 for k in ("embedding_scale", "residual_scale", "logit_scale")]
    return LayeredShape(
        arch=hp.arch,
        kinds=tuple(kinds),
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=hp.n_head[0],
        n_head_kv=tuple(hp.n_head_kv[:n]),
        head_dim=hp.head_k,
        n_ff=tuple(hp.n_ff[:n]),
        swa=lfm2 and hp.swa_type == "standard",
        l_cache=hp.shortconv_l_cache if lfm2 else 0,
        mamba=mamba,
        experts=experts,
        n_dense_lead=hp.n_layer_dense_lead if hp.arch == "lfm2moe" else 0,
        n_ff_shexp=shexp[1],
        latent=latent,
        rope=lfm2 or (granite and model.kv.get(f"{hp.arch}.rope.scaling.finetuned", True) is not False),
        qk_norm=lfm2,
        scales=(scale[0], scale[1], scale[2]) if granite else (False, False, False),
    )


def _experts(model: ModelInfo, shapes: dict[str, tuple[int, ...]], kinds: list[str]) -> Experts | None:
    """The routing of the MoE layers (None: one the builder does not make): LFM2-MoE's gating from the file
    with normalized weights (lfm2.cpp build_moe_feed_forward), Nemotron-H's sigmoid over a biased selection
    and up-only squared-ReLU experts (nemotron-h.cpp:300-321), the same experts in every MoE layer."""
    hp, kv = model.hparams, model.kv
    moe = [
        il
        for il, k in enumerate(kinds)
        if k == MOE or (hp.arch == "lfm2moe" and il >= hp.n_layer_dense_lead) or hp.arch == "granitehybrid"
    ]
    up = shapes[f"blk.{moe[0]}.ffn_up_exps.weight"]
    if len(up) != 3 or isinstance(kv.get(f"{hp.arch}.expert_used_count"), list):
        return None  # Nemotron 3 Puzzle's per-layer expert counts
    if any(shapes.get(f"blk.{il}.ffn_up_exps.weight") != up for il in moe):
        return None
    scale = model.number("expert_weights_scale")
    if hp.arch == "granitehybrid":  # softmax, normalized (granite-hybrid.cpp:262-271)
        return Experts(up[2], hp.n_expert_used, up[1], norm_w=True, scale=scale)
    if hp.arch == "lfm2moe":
        gating = kv.get(f"{hp.arch}.expert_gating_func")
        if gating not in (1, 2):
            return None
        return Experts(up[2], hp.n_expert_used, up[1], sigmoid=gating == 2, probs_bias=True, norm_w=True, scale=scale)
    norm_w = bool(kv.get(f"{hp.arch}.expert_weights_norm", False))
    return Experts(
        up[2], hp.n_expert_used, up[1], sigmoid=True, probs_bias=True, norm_w=norm_w, scale=scale, relu_sqr=True
    )

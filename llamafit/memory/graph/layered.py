"""The reserve graph of a hybrid whose every layer is one kind, node by node, for ``galloc``: LFM2 (short
convolutions and attention, each with a dense FFN) and Nemotron-H (Mamba-2, attention and MLP layers).

Mirrors ``src/models/lfm2.cpp:97-296`` (graph<iswa>: build_shortconv_block, build_attn_block with Q/K
norms and RoPE over one cache or the sliding-window cache of ``build_inp_mem_hybrid_iswa``, the residual
before the FFN, the last layer's output rows) and ``src/models/nemotron-h.cpp:188-340`` (build_mamba2_layer
of mamba-base.cpp:153-300, attention without RoPE, the squared-ReLU MLP of build_ffn, llama-graph.cpp:1931;
after the last layer the output norm over every token (``t_h_nextn``), then its output rows and the logits,
all three graph outputs: ``embeddings_nextn_masked`` is off outside an MTP context).
"""

from __future__ import annotations

from dataclasses import dataclass

from llamafit.memory.graph.attention import Builder, Reserve, TransformerShape
from llamafit.memory.graph.galloc import I32, Graph, Tensor, in_layer
from llamafit.memory.graph.mamba import MambaLayers, MambaShape
from llamafit.memory.graph.sampling import backend_samplers
from llamafit.memory.graph.trunk import RecurrentStates, gated_ffn, input_embeddings, output_head, pool, rms_norm

CONV, MAMBA2, ATTN, MLP = "conv", "mamba2", "attn", "mlp"


@dataclass(frozen=True)
class LayeredShape:
    arch: str  # "lfm2" | "nemotron_h"
    kinds: tuple[str, ...]  # each layer's kind: CONV (LFM2), MAMBA2, ATTN or MLP (Nemotron-H)
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: tuple[int, ...]
    head_dim: int
    n_ff: tuple[int, ...]
    swa: bool = False  # LFM2's attention layers on the sliding-window cache
    l_cache: int = 0  # LFM2's short-convolution length (its state keeps l_cache - 1 columns)
    mamba: MambaShape | None = None  # Nemotron-H's Mamba-2 layers


def layered_graph(sh: LayeredShape, r: Reserve) -> Graph:
    """The reserve graph (its weights, caches and states tagged under ``galloc.placed``)."""
    n_layer = len(sh.kinds)
    lfm2 = sh.arch == "lfm2"
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
        qk_norm=lfm2,
    )
    return (_Lfm2 if lfm2 else _NemotronH)(sh, Builder(trunk, r)).graph()


class _Layers:
    def __init__(self, sh: LayeredShape, b: Builder) -> None:
        self.sh, self.b, self.g, self.r = sh, b, b.g, b.r
        self.n_seqs = max(1, b.r.n_seqs)
        self.nst = b.T // self.n_seqs
        self.K = b.r.n_rs_seq + 1 if b.r.n_rs_seq > 0 else 1
        self.mamba = (
            MambaLayers(sh.mamba, b.r.n_tokens, b.r.n_seqs, b.r.n_outputs, b.r.n_rs_seq, g=self.g) if sh.mamba else None
        )
        self.rs = self.mamba.rs if self.mamba else RecurrentStates(self.g, self.n_seqs)

    def attention(self, cur: Tensor, il: int, rope: bool) -> Tensor:
        """build_qkv's separate projections, LFM2's Q/K norms and RoPE, build_attn, the output projection."""
        sh, b, T = self.sh, self.b, self.b.T
        W = Graph.weight
        hd, nh, nkv = sh.head_dim, sh.n_head, sh.n_head_kv[il]
        q = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nh), "attn_q"), cur), (hd, nh, T))
        k = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nkv), "attn_k"), cur), (hd, nkv, T))
        v = Graph.reshape(Graph.mul_mat(W((sh.n_embd, hd * nkv), "attn_v"), cur), (hd, nkv, T))
        if rope:
            q, k = rms_norm(q, "attn_q_norm"), rms_norm(k, "attn_k_norm")
            q, k = Graph.like("rope", q, b.pos), Graph.like("rope", k, b.pos)
        out = b.attend(q, k, v, "swa" if sh.swa else "full", two_caches=sh.swa)
        return Graph.mul_mat(W((hd * nh, sh.n_embd), "attn_output"), out)


class _Lfm2(_Layers):
    def graph(self) -> Graph:
        sh, g, T = self.sh, self.g, self.b.T
        inp_l = input_embeddings(g, sh.n_embd, sh.n_vocab, T)
        out_ids = Graph.input((max(1, min(self.r.n_outputs, T)),), I32)
        last = len(sh.kinds) - 1
        for il, kind in enumerate(sh.kinds):
            with in_layer(il):
                prev = inp_l
                cur = rms_norm(inp_l)
                cur = self.shortconv(cur) if kind == CONV else self.attention(cur, il, rope=True)
                if il == last:
                    cur, prev = Graph.get_rows(cur, out_ids), Graph.get_rows(prev, out_ids)
                cur = Graph.like("add", prev, cur)
                inp_l = Graph.like("add", cur, gated_ffn(rms_norm(cur), sh.n_ff[il]))
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
        inp_l = input_embeddings(g, sh.n_embd, sh.n_vocab, T)
        out_ids = Graph.input((max(1, min(self.r.n_outputs, T)),), I32)
        assert self.mamba is not None or MAMBA2 not in sh.kinds
        for il, kind in enumerate(sh.kinds):
            with in_layer(il):
                cur = rms_norm(inp_l)
                if kind == MAMBA2 and self.mamba is not None:
                    cur = self.mamba.mamba2(cur)
                elif kind == ATTN:
                    cur = self.attention(cur, il, rope=False)
                else:
                    cur = self.mlp(cur, sh.n_ff[il])
                inp_l = Graph.like("add", cur, inp_l)
        h_nextn = rms_norm(inp_l, "output_norm")
        embd = Graph.get_rows(h_nextn, out_ids)
        logits = Graph.mul_mat(Graph.weight((sh.n_embd, sh.n_vocab), "output"), embd)
        g.expand(logits)
        h_nextn.is_output = embd.is_output = logits.is_output = True  # llama-graph.cpp:1396-1408
        pool(g, embd, self.r.pooling, self.n_seqs)
        if self.r.samplers is not None:
            backend_samplers(g, logits, self.n_seqs, self.r.samplers)
        return g

    @staticmethod
    def mlp(cur: Tensor, n_ff: int) -> Tensor:
        """build_ffn with no gate and LLM_FFN_RELU_SQR: up, ReLU, square, down."""
        up = Graph.mul_mat(Graph.weight((cur.ne[0], n_ff), "ffn_up"), cur)
        act = Graph.like("sqr", Graph.like("unary", up))
        return Graph.mul_mat(Graph.weight((n_ff, cur.ne[0]), "ffn_down"), act)

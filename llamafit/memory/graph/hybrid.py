"""The reserve graph of a Qwen3.5-style hybrid (gated delta-net layers and gated full attention), node by
node, for ``llamafit.memory.graph.galloc``.

Mirrors ``src/models/qwen35.cpp:137-497``: each layer's input norm is expanded first; a linear layer
projects q/k/v (fused) and the output gate z, beta and alpha, runs the conv over the gathered conv
states (``build_conv_state``, delta-net-base.cpp:449-525), gathers the SSM states (``build_rs``), and
the fused gated delta-net op returns the output and the new state(s) (``build_recurrent_attn``,
delta-net-base.cpp:527-606; with speculative rollback, ``n_rs_seq + 1`` snapshots); an attention layer
is the MTP head's gated attention (``graph_mtp``); the FFN is dense. After the last layer the output
norm (``t_h_nextn``), its output rows (``t_embd``) and the logits are all graph outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from llamafit.memory.graph.attention import Builder, TransformerShape
from llamafit.memory.graph.galloc import F32, I32, Graph, Tensor, in_layer
from llamafit.memory.graph.mtp import MtpShape, block_ffn, gated_attention
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.trunk import RecurrentStates, input_embeddings, output_head, rms_norm


@dataclass(frozen=True)
class HybridShape(Recipe):
    block: MtpShape  # the widths shared with the MTP head: embedding, vocabulary, attention heads, FFN
    is_recr: tuple[bool, ...]  # the trunk's layers (no NextN block)
    d_conv: int
    d_inner: int
    d_state: int  # head_k_dim of the delta-net
    n_group: int  # num_k_heads
    n_v_heads: int  # ssm.time_step_rank
    # Qwen3-Next (qwen3next.cpp:314-563): one beta/alpha projection (ssm_ba), q/k/v/z from one projection
    # (ssm_in, the legacy GGUFs) unless split as Qwen3.5's, and q/k repeated to the value heads
    qwen3next: bool = False
    legacy_qkvz: bool = False

    any_v_layout: ClassVar[bool] = True

    def graph(self, r: Reserve) -> Graph:
        return _hybrid_graph(self, r)

    def first_layer(self) -> Recipe | None:
        return replace(self, is_recr=self.is_recr[:1])


def _hybrid_graph(sh: HybridShape, r: Reserve) -> Graph:
    """The reserve graph (its weights, caches and states tagged under ``galloc.placed``)."""
    n_layer, a = len(sh.is_recr), sh.block
    shape = TransformerShape(
        arch="qwen35",
        n_layer=n_layer,
        n_embd=a.n_embd,
        n_vocab=a.n_vocab,
        n_head=a.n_head,
        n_head_kv=(a.n_head_kv,) * n_layer,
        head_k=a.head_dim,
        head_v=a.head_dim,
        n_ff=(a.n_ff,) * n_layer,
        is_swa=(False,) * n_layer,
        n_pos=a.n_pos,
    )
    b = Builder(shape, r)
    _Linear(b, sh, r.n_rs_seq).build()
    return b.g


class _Linear:
    def __init__(self, b: Builder, sh: HybridShape, n_rs_seq: int) -> None:
        self.b, self.sh, self.g = b, sh, b.g
        self.n_seqs = max(1, b.r.n_seqs)
        self.nst = b.T // self.n_seqs
        self.K = n_rs_seq + 1
        self.rs = RecurrentStates(self.g, self.n_seqs, b.r.rs_one_gather)
        self.conv_ch = sh.d_inner + 2 * sh.n_group * sh.d_state
        self.head_v = sh.d_inner // sh.n_v_heads
        self.n_embd_r = (sh.d_conv - 1) * self.conv_ch
        self.n_embd_s = self.head_v * self.head_v * sh.n_v_heads

    def build(self) -> None:
        b, sh, g, a = self.b, self.sh, self.g, self.sh.block
        inp_l = input_embeddings(g, a.n_embd, a.n_vocab, b.T, mixed=b.r.mixed_batch)
        out_ids = Graph.input((max(1, min(b.r.n_outputs, b.T)),), I32)
        for il, recr in enumerate(sh.is_recr):
            with in_layer(il):
                cur = rms_norm(inp_l)
                g.expand(cur)
                cur = self.layer(cur) if recr else gated_attention(b, cur, a.n_head, a.n_head_kv, a.head_dim)
                residual = Graph.like("add", cur, inp_l)
                inp_l = Graph.like("add", block_ffn(g, a, rms_norm(residual)), residual)
        output_head(g, inp_l, a.n_vocab, b.r.pooling, self.n_seqs, b.r.samplers, rows=out_ids)

    def layer(self, cur: Tensor) -> Tensor:
        """qwen35.cpp build_layer_attn_linear (qwen3next.cpp:395-563 with ``qwen3next``)."""
        sh, b, nst, ns = self.sh, self.b, self.nst, self.n_seqs
        W = Graph.weight
        E, nv, nk, hk, hv = sh.block.n_embd, sh.n_v_heads, sh.n_group, sh.d_state, self.head_v
        if sh.legacy_qkvz:
            qkv, z = self.qkvz_legacy(cur)
        else:
            qkv = Graph.reshape(Graph.mul_mat(W((E, self.conv_ch), "attn_qkv"), cur), (self.conv_ch, nst, ns))
            z = Graph.mul_mat(W((E, sh.d_inner), "attn_gate"), cur)
        if sh.qwen3next:
            beta, alpha = self.beta_alpha(cur)
        else:
            beta = Graph.like("unary", Graph.reshape(Graph.mul_mat(W((E, nv), "ssm_beta"), cur), (1, nv, nst, ns)))
            alpha = Graph.reshape(Graph.mul_mat(W((E, nv), "ssm_alpha"), cur), (nv, nst, ns))
        gate = Graph.like("unary", Graph.like("add", alpha, W((nv,), "ssm_dt.bias")))
        gate = Graph.like("mul", gate, W((nv,), "ssm_a"))
        gate = Graph.reshape(gate, (1, nv, nst, ns))
        rows = self.K * self.rs.n_rs
        conv_all, ssm_all = Graph.cache((self.n_embd_r, rows)), Graph.cache((self.n_embd_s, rows))
        # build_conv_state: the gathered conv states, then the new tokens; the last window(s) saved
        conv = Graph.reshape(self.rs.gather(conv_all, self.n_embd_r), (sh.d_conv - 1, self.conv_ch, ns))
        conv_in = Graph.op("concat", (sh.d_conv - 1 + nst, self.conv_ch, ns), conv, Graph.transpose(qkv))
        for _ in range(self.K):
            last = Graph.view(conv_in, (sh.d_conv - 1, self.conv_ch, ns), (conv_in.nb[1], conv_in.nb[2]))
            self.rs.cpy(last, Graph.view(conv_all, (self.n_embd_r, ns)))
        state = Graph.reshape(self.rs.gather(ssm_all, self.n_embd_s), (hv, hv, nv, ns))
        conv_w = W((sh.d_conv, self.conv_ch), "ssm_conv1d")
        mix = Graph.like("unary", Graph.op("ssm_conv", (self.conv_ch, nst, ns), conv_in, conv_w))
        q = Graph.like("scale", Graph.like("rms_norm", Graph.view(mix, (hk, nk, nst, ns), (hk * F32, mix.nb[1]))))
        k = Graph.like("scale", Graph.like("rms_norm", Graph.view(mix, (hk, nk, nst, ns), (hk * F32, mix.nb[1]))))
        v = Graph.view(mix, (hv, nv, nst, ns), (hv * F32, mix.nb[1]))
        if sh.qwen3next and nk != nv:  # repeat-interleaved to the value heads (qwen3next.cpp:517-538)
            q, k = self.repeat(q), self.repeat(k)
        # the fused gated delta-net: the output rows, then K state snapshots (ggml.c:6398-6416)
        gdn = Graph.op("gated_delta_net", (hv * nv, b.T + self.K * hv * ns), q, k, v, gate, beta, state)
        written = min(nst, self.K) if self.K > 1 else 1
        self.rs.cpy(Graph.view(gdn, (self.n_embd_s, ns, written)), Graph.view(ssm_all, (self.n_embd_s, ns, written)))
        out = Graph.view(gdn, (hv, nv, nst, ns))
        z4 = Graph.reshape(z, (hv, nv, nst, ns))
        normed = Graph.like("mul", rms_norm(out, "ssm_norm"), Graph.like("unary", z4))
        y = Graph.mul_mat(W((sh.d_inner, E), "ssm_out"), Graph.reshape(normed, (hv * nv, nst, ns)))
        return Graph.reshape(y, (E, b.T))

    def qkvz_legacy(self, cur: Tensor) -> tuple[Tensor, Tensor]:
        """qwen3next.cpp build_qkvz's legacy path: one projection viewed per k head as q, k, v and z; z made
        contiguous, q, k and v each made contiguous and concatenated (the conv's input)."""
        sh, nst, ns = self.sh, self.nst, self.n_seqs
        E, nv, nk, hk, hv = sh.block.n_embd, sh.n_v_heads, sh.n_group, sh.d_state, self.head_v
        per_k = 2 * hk + 2 * hv * (nv // nk)
        mixed = Graph.mul_mat(Graph.weight((E, per_k * nk), "ssm_in"), cur)
        r = Graph.reshape(mixed, (per_k, nk, nst, ns))

        def part(width: int) -> Tensor:
            return Graph.view(r, (width, nk, nst, ns), (r.nb[1], r.nb[2], r.nb[3]))

        z = Graph.op("cont", (hv * nv // nk, nk, nst, ns), part(hv * nv // nk))
        q = Graph.op("cont", (hk * nk, nst, ns), part(hk))
        k = Graph.op("cont", (hk * nk, nst, ns), part(hk))
        v = Graph.op("cont", (hv * nv, nst, ns), part(hv * nv // nk))
        qk = Graph.op("concat", (2 * hk * nk, nst, ns), q, k)
        return Graph.op("concat", (self.conv_ch, nst, ns), qk, v), z

    def beta_alpha(self, cur: Tensor) -> tuple[Tensor, Tensor]:
        """qwen3next.cpp:418-448: beta and alpha viewed per k head out of one projection, each made
        contiguous; beta through its sigmoid."""
        sh, nst, ns = self.sh, self.nst, self.n_seqs
        nv, nk = sh.n_v_heads, sh.n_group
        mixed = Graph.mul_mat(Graph.weight((sh.block.n_embd, 2 * nv), "ssm_ba"), cur)
        r = Graph.reshape(mixed, (2 * nv // nk, nk, nst, ns))
        b = Graph.view(r, (nv // nk, nk, nst, ns), (r.nb[1], r.nb[2], r.nb[3]))
        a = Graph.view(r, (nv // nk, nk, nst, ns), (r.nb[1], r.nb[2], r.nb[3]))
        beta = Graph.like("unary", Graph.op("cont", b.ne, b))
        return Graph.reshape(beta, (1, nv, nst, ns)), Graph.op("cont", (nv, nst, ns), a)

    def repeat(self, x: Tensor) -> Tensor:
        """ggml_repeat_4d of (head_k, 1, k heads, tokens) to (head_k, v/k, k heads, tokens), reshaped to
        (head_k, v heads, tokens per sequence, sequences)."""
        sh = self.sh
        hk, nk, rf, T = sh.d_state, sh.n_group, sh.n_v_heads // sh.n_group, self.b.T
        rep = Graph.op("repeat", (hk, rf, nk, T), Graph.reshape(x, (hk, 1, nk, T)))
        return Graph.reshape(rep, (hk, nk * rf, self.nst, self.n_seqs))

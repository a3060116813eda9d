"""What llama.cpp's text graphs share, for the replays (``graph_attention``, ``graph_mla``, ``graph_mamba``):
how they begin and end, their feed-forward blocks, and the recurrent states they gather.

The start is ``build_inp_embd`` (``src/llama-graph.cpp:2413-2533``): the token rows, the embedding
input and the mixed path are all in the graph (``ggml_build_forward_select`` expands the three), so the
unused embedding input and the mixed path's copy are allocated and never freed. The end is the output
norm and the logits, both graph outputs (``llm_graph_result::set_outputs``, llama-graph.cpp:1396-1403).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llamafit.memory.graph.galloc import I32, I64, Graph, Tensor, pin_norm
from llamafit.memory.graph.sampling import Samplers, backend_samplers


def rms_norm(x: Tensor, name: str = "", pin: bool = True, op: str = "rms_norm") -> Tensor:
    """build_norm(x, w, NULL, LLM_NORM_RMS): the norm (a layer's is pinned where llama.cpp pins it; ``pin`` False:
    a norm built as no layer's, ``il`` -1), then the weight (in place). ``op`` "norm": LLM_NORM's layer norm,
    which ggml-alloc never computes in place (ggml-alloc.c ggml_op_can_inplace)."""
    norm = Graph.like(op, x)
    return Graph.like("mul", pin_norm(norm) if pin else norm, Graph.weight((x.ne[0],), name))


def input_embeddings(
    g: Graph, n_embd: int, n_vocab: int, n_tokens: int, *, mixed: bool = True, n_embd_inp: int = 0
) -> Tensor:
    """The token rows (the selected input) after every input of build_inp_embd is expanded; ``mixed``: the
    mixed token/embedding path is one of them (a build before MIXED_BATCH_SINCE selects of two). ``n_embd_inp``:
    an input wider than the rows (Qwen3-VL's deepstack features beside them): the token rows padded to it and
    the first ``n_embd`` of each viewed, expanded at once (llama-graph.cpp:2451-2454, 2498-2500, 2531-2533)."""
    width = max(n_embd_inp, n_embd)
    tok_embd = Graph.weight((n_embd, n_vocab), "token_embd")

    def tok(ids: Tensor) -> Tensor:
        rows = Graph.get_rows(tok_embd, ids)
        return Graph.op("pad", (width, n_tokens), rows) if width > n_embd else rows

    rows = tok(Graph.input((n_tokens,), I32))
    inputs = [rows, Graph.input((width, n_tokens))]
    if mixed:
        dup = Graph.like("dup", Graph.input((width, n_tokens)))
        inputs.append(Graph.set_rows(dup, tok(Graph.input((n_tokens,), I32)), Graph.input((n_tokens,), I64)))
    for t in inputs:
        g.expand(t)
    if width > n_embd:
        rows = Graph.view(rows, (n_embd, n_tokens), (rows.nb[1],))
        g.expand(rows)
    return rows


@dataclass(frozen=True)
class Logits:
    """How the output head ends: ``kind`` "plain"; "scaled", the scaled logits are the output (Granite's, Cohere's:
    granite-hybrid.cpp:190-197); "softcapped", soft-capped (scale, tanh, scale: gemma4.cpp:425-429), the last of them
    the output. ``norm``: the output norm's op ("norm": Cohere's layer norm)."""

    kind: str = "plain"
    norm: str = "rms_norm"


PLAIN = Logits()


def output_head(
    g: Graph,
    hidden: Tensor,
    n_vocab: int,
    pooling: str | None = None,
    n_seqs: int = 1,
    samplers: Samplers | None = None,
    *,
    rows: Tensor | None = None,
    logits: Logits = PLAIN,
) -> None:
    """The output norm and the logits (as ``logits`` says), expanded last and marked as outputs (never freed or
    reused), then the pooling of an embedding context or the backend samplers (-bs). ``rows``: the output rows' ids
    are taken after the norm, which stays an output too (``t_h_nextn``: Qwen3.5, Nemotron-H)."""
    normed = rms_norm(hidden, "output_norm", op=logits.norm)
    embd = normed if rows is None else Graph.get_rows(normed, rows)
    out = Graph.mul_mat(Graph.weight((hidden.ne[0], n_vocab), "output"), embd)
    if logits.kind == "scaled":
        out = Graph.like("scale", out)
    elif logits.kind == "softcapped":
        out = Graph.like("scale", Graph.like("unary", Graph.like("scale", out)))
    g.expand(out)
    normed.is_output = embd.is_output = out.is_output = True  # llama-graph.cpp:1396-1408
    pool(g, embd, pooling, n_seqs)
    if samplers is not None:
        backend_samplers(g, out, n_seqs, samplers)


def pool(g: Graph, embd: Tensor, pooling: str | None, n_seqs: int) -> None:
    """build_pooling (llama-graph.cpp:3797-3895) after the trunk of an embedding context: mean pooling
    multiplies the transposed embeddings by a ``n_tokens x n_seqs`` input, cls and last gather a row per
    sequence; the pooled embeddings are an output. ``None``: not an embedding context."""
    if pooling is None or pooling == "none":
        return
    n_embd, n_tokens = embd.ne[0], embd.ne[1]
    if pooling == "mean":
        t = Graph.op("cont", (n_tokens, n_embd), Graph.transpose(embd))
        out = Graph.op("mul_mat", (n_embd, n_seqs), t, Graph.input((n_tokens, n_seqs)))
    else:  # cls, last
        out = Graph.get_rows(embd, Graph.input((n_seqs,), I32))
    g.expand(out)
    out.is_output = True


def gated_ffn(cur: Tensor, n_ff: int, suffix: str = "") -> Tensor:
    """build_ffn with a parallel gate (llama-graph.cpp:1799-1930): up, gate, the GLU of (gate, up), down
    (``suffix``: ``_shexp`` for a shared expert's weights)."""
    n_embd = cur.ne[0]
    up = Graph.mul_mat(Graph.weight((n_embd, n_ff), f"ffn_up{suffix}"), cur)
    gate = Graph.mul_mat(Graph.weight((n_embd, n_ff), f"ffn_gate{suffix}"), cur)
    glu = Graph.op("glu", gate.ne, gate, up)  # ggml_swiglu_split / geglu_split: the shape of the gate
    return Graph.mul_mat(Graph.weight((n_ff, n_embd), f"ffn_down{suffix}"), glu)


@dataclass(frozen=True)
class Experts:
    n_expert: int
    n_used: int
    n_ff: int  # one expert's FFN width
    sigmoid: bool = False  # expert_gating_func 2 (else softmax)
    sqrt_softplus: bool = False  # expert_gating_func 4: sqrt(softplus(logits)) (DeepSeek-V4)
    probs_bias: bool = False  # exp_probs_b: selection on biased probabilities
    norm_w: bool = False  # expert_weights_norm
    scale: float = 0.0  # expert_weights_scale (0 and 1: none)
    relu_sqr: bool = False  # up-only experts with a squared ReLU (LLM_FFN_RELU_SQR, no gate: Nemotron-H)
    softmax_weight: bool = False  # gating SOFTMAX_WEIGHT: top-k on the logits, a softmax of the k (gpt-oss)
    biased: bool = False  # the router's and each expert's up, gate and down biases (gpt-oss)
    gate_up: bool = False  # gate and up fused in one tensor (ffn_gate_up_exps): one product, viewed in two halves
    down_scale: bool = False  # a scale per expert on the down projection (ffn_down_exps.scale: Gemma 4)
    # Llama 4's: the top-k of the logits, the weights applied to the input before the experts (llama-graph.cpp:2071,
    # 2121-2125, 2208-2215, 2371-2374)
    weight_before: bool = False


def moe_ffn(g: Graph, cur: Tensor, ex: Experts, logits: Tensor | None = None, selected: Tensor | None = None) -> Tensor:
    """build_moe_ffn (llama-graph.cpp:2044-2380) without expert groups: the router's top-k, the experts'
    up/gate/down by mul_mat_id, weighted, then summed view by view (each expanded as it is made);
    ``logits``: the router's, made by the caller (probs_in: Nemotron-H routes on the layer's input and runs
    the experts on its latent projection); ``selected``: the experts chosen by the caller
    (selected_experts_in: DeepSeek-V4's hash-routed layers), no top-k then."""
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    W = Graph.weight
    if logits is None:
        logits = Graph.mul_mat(W((n_embd, ex.n_expert), "ffn_gate_inp"), cur)
    if ex.biased:
        logits = Graph.like("add", logits, W((ex.n_expert,), "ffn_gate_inp.bias"))
    # SOFTMAX_WEIGHT: the softmax comes after the selection
    if ex.sqrt_softplus:
        probs = Graph.like("sqrt", Graph.like("unary", logits))
    else:
        probs = logits if ex.softmax_weight else Graph.like("unary" if ex.sigmoid else "soft_max", logits)
    if selected is None:
        selection = Graph.like("add", probs, W((ex.n_expert,), "exp_probs_b.bias")) if ex.probs_bias else probs
        if ex.weight_before:
            selection = logits
        order = Graph.op("argsort", (ex.n_expert, n_tokens), selection, esize=I32)
        selected = Graph.view(order, (ex.n_used, n_tokens), (order.nb[1],))  # ggml_argsort_top_k
    weights = Graph.get_rows(Graph.reshape(probs, (1, ex.n_expert, n_tokens)), selected)
    if ex.softmax_weight:  # llama-graph.cpp:2175-2180
        soft = Graph.like("soft_max", Graph.reshape(weights, (ex.n_used, n_tokens)))
        weights = Graph.reshape(soft, (1, ex.n_used, n_tokens))
    if ex.norm_w:
        w2 = Graph.reshape(weights, (ex.n_used, n_tokens))
        total = Graph.like("clamp", Graph.op("sum_rows", (1, n_tokens), w2))
        weights = Graph.reshape(Graph.like("div", w2, total), (1, ex.n_used, n_tokens))
    if ex.scale not in (0.0, 1.0):
        weights = Graph.like("scale", weights)
    g.expand(weights)
    x = Graph.reshape(cur, (n_embd, 1, n_tokens))
    if ex.weight_before:  # ggml_repeat_4d to every selected expert, then weighted
        x = Graph.like("mul", Graph.op("repeat", (n_embd, ex.n_used, n_tokens), x), weights)
    shape = (ex.n_ff, ex.n_used, n_tokens)

    def biased(t: Tensor, name: str) -> Tensor:  # ggml_add_id of the selected experts' biases
        return Graph.like("add_id", t, W((t.ne[0], ex.n_expert), f"{name}.bias"), selected) if ex.biased else t

    if ex.gate_up:  # llama-graph.cpp:2220-2238: the gate's half and the up's half are views of one product
        fused = W((n_embd, 2 * ex.n_ff, ex.n_expert), "ffn_gate_up_exps")
        gate_up = Graph.op("mul_mat_id", (2 * ex.n_ff, ex.n_used, n_tokens), fused, x, selected)
        halves = [Graph.view(gate_up, shape, (gate_up.nb[1], gate_up.nb[2])) for _ in range(2)]
        glu = Graph.op("glu", shape, *halves)
    else:
        up = Graph.op("mul_mat_id", shape, W((n_embd, ex.n_ff, ex.n_expert), "ffn_up_exps"), x, selected)
        up = biased(up, "ffn_up_exps")
        if ex.relu_sqr:  # llama-graph.cpp:2342-2350
            glu = Graph.like("sqr", Graph.like("unary", up))
        else:
            gate = Graph.op("mul_mat_id", shape, W((n_embd, ex.n_ff, ex.n_expert), "ffn_gate_exps"), x, selected)
            glu = Graph.op("glu", shape, biased(gate, "ffn_gate_exps"), up)  # swiglu / geglu / swiglu_oai
    down_w = W((ex.n_ff, n_embd, ex.n_expert), "ffn_down_exps")
    down = Graph.op("mul_mat_id", (n_embd, ex.n_used, n_tokens), down_w, glu, selected)
    if ex.down_scale:  # build_lora_mm_id's w_s (llama-graph.cpp:1603-1610): the selected experts' scales
        scales = Graph.reshape(W((ex.n_expert,), "ffn_down_exps.scale"), (1, ex.n_expert, 1))
        down = Graph.like("mul", down, Graph.get_rows(scales, selected))
    down = biased(down, "ffn_down_exps")
    experts = down if ex.weight_before else Graph.like("mul", down, weights)
    g.expand(experts)
    views = [Graph.view(experts, (n_embd, n_tokens), (experts.nb[2],)) for _ in range(ex.n_used)]
    for v in views:
        g.expand(v)
    out = views[0]
    for v in views[1:]:
        out = Graph.like("add", out, v)
        g.expand(out)
    return Graph.like("cont", out) if ex.n_used == 1 else out


def routed_and_shared(g: Graph, cur: Tensor, ex: Experts, n_ff_shexp: int, gate: str = "") -> Tensor:
    """The routed experts, then the shared expert beside them (``n_ff_shexp``; 0: none) added: plain
    (glm4-moe.cpp, deepseek2.cpp) or scaled by a gate of one value per token (ffn_gate_inp_shexp): ``gate``
    "sigmoid" (qwen35moe.cpp:494-545, qwen3next.cpp:565-625) or "silu_div", a sigmoid as silu(x) / x
    (qwen2moe.cpp:147-151)."""
    routed = moe_ffn(g, cur, ex)
    if not n_ff_shexp:
        return routed
    shared = gated_ffn(cur, n_ff_shexp, "_shexp")
    if gate:
        logit = Graph.mul_mat(Graph.weight((cur.ne[0],), "ffn_gate_inp_shexp"), cur)
        sig = Graph.like("unary", logit)
        if gate == "silu_div":
            sig = Graph.like("div", sig, logit)
        shared = Graph.like("mul", shared, sig)
    return Graph.like("add", routed, shared)


class RecurrentStates:
    """build_rs over the full recurrent memory of a reserve (llama-graph.cpp:3587-3676; one state per
    sequence: llama-memory-recurrent.cpp:1291-1346), shared by the Mamba and delta-net replays. Builds before
    RS_ONE_GATHER_SINCE gathered the ubatch's states and the extra ones apart (``one_gather`` False)."""

    def __init__(self, g: Graph, n_seqs: int, one_gather: bool = True) -> None:
        self.g, self.n_seqs, self.n_rs, self.one_gather = g, n_seqs, n_seqs, one_gather
        self.s_copy = Graph.input((self.n_rs,), I32)
        self.s_copy_main = Graph.view(self.s_copy, (n_seqs,))
        self.s_copy_tail = Graph.view(self.s_copy, (self.n_rs - 1,))
        self.s_copy_extra = Graph.view(self.s_copy, (self.n_rs - n_seqs,))

    def cpy(self, a: Tensor, dst: Tensor) -> None:
        """``ggml_build_forward_expand(ggml_cpy(a, dst))``: the result is a view of ``dst``."""
        self.g.expand(Graph.view(dst, dst.ne, op="cpy", src=(a, dst)))

    def gather(self, s: Tensor, state_size: int, getter: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
        """Every state row gathered and the first n_seqs viewed; with a custom getter (Mamba's scan reads
        its states itself, given s_copy_main) only the extra states are gathered (s_copy_tail)."""
        g, n_seqs, n_rs = self.g, self.n_seqs, self.n_rs
        states = Graph.reshape(s, (state_size, s.ne[1]))
        zero = Graph.view(states, (state_size,))
        g.expand(Graph.view(zero, zero.ne, op="scale", src=(zero,)))  # ggml_scale_inplace
        if not self.one_gather:  # b11368's build_rs (llama-graph.cpp:3520-3552 there)
            out = (getter or Graph.get_rows)(states, self.s_copy_main)
            g.expand(out)
            extra = Graph.get_rows(states, self.s_copy_extra)
            self.cpy(extra, Graph.view(s, (state_size, n_rs - n_seqs)))
            return out
        states_all = Graph.get_rows(states, self.s_copy if getter is None else self.s_copy_tail)
        if getter is None:
            out = Graph.view(states_all, (state_size, n_seqs), (states_all.nb[1],))
        else:
            out = getter(states, self.s_copy_main)
        g.expand(out)
        extra = Graph.view(states_all, (state_size, n_rs - n_seqs), (states_all.nb[1],))
        self.cpy(extra, Graph.view(s, (state_size, n_rs - n_seqs)))
        return out

"""The reserve graph of DeepSeek-V4, node by node, for ``llamafit.memory.graph.galloc``.

Mirrors ``src/models/deepseek4.cpp`` (b11434) over the memory of ``src/llama-kv-cache-dsv4.cpp``:

* the hyper-connections (``hc_mult`` copies of the hidden state): each block's mix is a matmul of the
  flattened, normed copies (deepseek4.cpp:353-409) whose pre and post weights are made op by op and whose
  combination and application are the fused ``dsv4_hc_comb``/``dsv4_hc_pre``/``dsv4_hc_post`` (the CPU, CUDA,
  Vulkan, Metal and SYCL backends have them, so resolve_fused_ops keeps them on, llama-context.cpp:573-581; a
  device without them gets the op-by-op graph, not replayed); the head's mix applies its weights copy by copy
  (deepseek4.cpp:448-468, 300-313);
* attention (deepseek4.cpp:878-1220): the query through its LoRA, one K per position, the raw
  sliding-window cache; layers of ratio 4 add the compressed cache and the lightning indexer's top-k over its
  own compressed cache, layers of ratio 128 the heavily compressed one (deepseek4.cpp:707-858); each
  compressor folds its state and the ubatch's rows into blocks (deepseek4.cpp:470-588) and keeps its state
  (restore, snapshot, persist: deepseek4.cpp:222-264);
* the inputs a reserve makes (llama-graph.cpp:3560-3585, 990-1016; the worst-case plan of
  llama-kv-cache-dsv4.cpp:845-884): every cache and state holds one stream per sequence, whatever ``-kvu``;
* routed experts with sqrt-softplus routing (the leading layers hash-routed by token id) and the shared
  expert (deepseek4.cpp:1277-1330).

A quantized cache rotates the raw and compressed caches' keys (and the attention's query and output) by a
Hadamard matrix (deepseek4.cpp:724-727, 761-763, 995-998, 1125-1128). The MTP draft context runs the NextN
block alone over a plain sliding-window cache (deepseek4.cpp:1363-1500).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llamafit.gguf.ggml import by_name, row_size
from llamafit.gguf.model import ModelInfo
from llamafit.memory.builds import DSV4_GRAPH_SINCE
from llamafit.memory.context import compressed_cells
from llamafit.memory.graph.attention import hadamard, kq_mask, rotation_size
from llamafit.memory.graph.galloc import F32, I32, I64, Graph, Tensor, in_layer
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.routing import read_experts
from llamafit.memory.graph.trunk import Experts, gated_ffn, input_embeddings, moe_ffn, output_head, rms_norm

CSA, HCA = 4, 128  # DSV4_CSA_RATIO, DSV4_HCA_RATIO (deepseek4.cpp:266-267)


@dataclass(frozen=True)
class Dsv4Shape(Recipe):
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    hc: int  # hyper-connection copies
    ratios: tuple[int, ...]  # each layer's compression: 0, 4 or 128
    n_hash: int  # leading layers routed by token id
    experts: Experts
    n_ff_shexp: int
    idx_heads: int
    idx_dim: int
    idx_top_k: int
    idx_rot: int  # the Hadamard rotation of the indexer's cache, always made (llama-kv-cache.cpp:327-332)

    def graph(self, r: Reserve) -> Graph:
        return _Builder(self, r).graph()

    def since(self) -> int:
        return DSV4_GRAPH_SINCE

    def first_layer(self) -> Recipe | None:
        return replace(self, n_layer=1)

    def rotations(self, rot: tuple[int, int], quantized: bool) -> tuple[int, int] | None:
        return (rot[0], 0)  # K-only caches: a quantized V type makes no V rotation


def dsv4_shape(model: ModelInfo) -> Dsv4Shape | None:
    """Sizes read off the tensor table and header (deepseek4.cpp:19-183, dflash.cpp:52-90); None where a
    tensor the graph needs is missing. The model's graph runs the trunk alone: NextN blocks change nothing
    in it."""
    hp = model.hparams
    shapes = {t.name: t.info.shape for t in model.tensors}
    il = hp.n_layer - 1

    def shape(name: str) -> tuple[int, ...]:
        return shapes.get(f"blk.{il}.{name}.weight", ())

    sinks, q_a, shexp, base = shape("attn_sinks"), shape("attn_q_a"), shape("ffn_up_shexp"), shape("hc_attn_base")
    proj = next((s for n, s in shapes.items() if n.endswith("indexer.proj.weight")), ())
    hc = int(model.number("hyper_connection.count"))
    groups, o_rank = int(model.number("attention.output_group_count")), int(model.number("attention.output_lora_rank"))
    if not (sinks and q_a and shexp and base and hc and groups and o_rank):
        return None
    if base[0] != (2 + hc) * hc or sinks[0] % groups:
        return None
    # every layer's, the NextN blocks' too (an MTP context's graph runs one)
    ratios = tuple(hp.compress_ratios[: hp.n_layer_all]) + (0,) * max(0, hp.n_layer_all - len(hp.compress_ratios))
    idx_dim = hp.indexer_head_size
    if any(x not in (0, CSA, HCA) for x in ratios):
        return None
    if CSA in ratios and (len(proj) != 2 or not idx_dim or idx_dim % 64 or not hp.indexer_top_k):
        return None
    if hp.head_k == idx_dim:  # then every cache of the model is rotated (llama-kv-cache.cpp:327-332)
        return None
    experts = read_experts(model, shapes, il)
    if experts is None:
        return None
    return Dsv4Shape(
        n_layer=hp.n_layer,
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=sinks[0],
        head_dim=hp.head_k,
        q_lora_rank=q_a[1],
        o_groups=groups,
        o_lora_rank=o_rank,
        hc=hc,
        ratios=ratios,
        n_hash=int(model.number("hash_layer_count")),
        experts=experts,
        n_ff_shexp=shexp[1],
        idx_heads=proj[1] if proj else 0,
        idx_dim=idx_dim,
        idx_top_k=hp.indexer_top_k,
        idx_rot=rotation_size(idx_dim),
    )


@dataclass
class _Comp:
    """One compressed cache's reserve inputs (dsv4_build_comp_inputs, llama-graph.cpp:990-1016, with the
    sizes of dsv4_build_reserve_comp_plan, llama-kv-cache-dsv4.cpp:845-884)."""

    state_pos: Tensor
    persist_src: Tensor
    persist_dst: Tensor
    restore: tuple[Tensor, Tensor] | None
    snapshot: tuple[Tensor, Tensor] | None
    read: Tensor
    write_idxs: Tensor
    write_pos: Tensor
    mask: Tensor
    cells: int  # per stream
    ratio: int
    state_size: int
    width: int  # a state row (n_embd_state)


@dataclass(frozen=True)
class Dsv4MtpShape(Recipe):
    """DeepSeek-V4's MTP head (its NextN block after the trunk), for the MTP draft context's graph."""

    backbone: Dsv4Shape
    own_embed: bool  # nextn.embed_tokens (else the model's token embeddings)

    def graph(self, r: Reserve) -> Graph:
        return _mtp_graph(self, r)

    def since(self) -> int:
        return DSV4_GRAPH_SINCE

    def rotations(self, rot: tuple[int, int], quantized: bool) -> tuple[int, int] | None:
        return (rot[0], 0)  # build_attn of a K-only ISWA input rotates K alone (llama-graph.cpp:3298-3307)


def dsv4_mtp_shape(model: ModelInfo) -> Dsv4MtpShape | None:
    """The NextN block of a DeepSeek-V4 model (deepseek4.cpp:94-99): one, uncompressed, after a trunk the
    reader of ``dsv4_shape`` reads."""
    hp = model.hparams
    backbone = dsv4_shape(model)
    il = hp.n_layer
    if backbone is None or hp.n_nextn != 1 or not model.has_tensor(f"blk.{il}.nextn.eh_proj.weight"):
        return None
    if backbone.ratios[il] or il < backbone.n_hash:
        return None
    return Dsv4MtpShape(backbone, model.has_tensor(f"blk.{il}.nextn.embed_tokens.weight"))


def _mtp_graph(sh: Dsv4MtpShape, r: Reserve) -> Graph:
    """graph_mtp (deepseek4.cpp:1363-1500): the token rows and the target's hidden copies, each normed, joined
    and projected, one block over the context's K-only sliding window (llama-graph.cpp:3285-3350); the rows of
    the outputs (t_h_nextn, an output) through the head's mix, the norm and the logits."""
    bb, g = sh.backbone, Graph()
    b = _Builder(bb, r, g, draft=True)
    E, hc, T, il = bb.n_embd, bb.hc, b.T, bb.n_layer
    tokens = Graph.input((T,), I32)
    hidden = Graph.input((E * hc, T))
    n_out = max(1, min(r.n_outputs, T))
    out_ids = Graph.input((n_out,), I32)
    with in_layer(il if sh.own_embed else None):
        rows = Graph.get_rows(
            Graph.weight((E, bb.n_vocab), "nextn.embed_tokens" if sh.own_embed else "token_embd"), tokens
        )
    with in_layer(il):
        h_norm = rms_norm(Graph.reshape(hidden, (E, hc, T)), "nextn.hnorm")
        e_norm = Graph.op("repeat", (E, hc, T), Graph.reshape(rms_norm(rows, "nextn.enorm"), (E, 1, T)))
        x = Graph.mul_mat(Graph.weight((2 * E, E), "nextn.eh_proj"), Graph.op("concat", (2 * E, hc, T), e_norm, h_norm))
        x = b.block(x, il, tokens)
    h_nextn = Graph.get_rows(Graph.reshape(x, (E * hc, T)), out_ids)
    h_nextn.is_output = True  # t_h_nextn (llama-graph.cpp:1396-1408)
    head = b.hc_head(Graph.reshape(h_nextn, (E, hc, n_out)))
    output_head(g, head, bb.n_vocab, r.pooling, max(1, r.n_seqs), r.samplers)
    return g


def draft_embd(sh: Dsv4Shape, r: Reserve, g: Graph, tokens: Tensor) -> Tensor:
    """A DSpark drafter on the DeepSeek-V4 backbone (dflash.cpp:862-1033, the token batch it reserves with):
    the target's token rows, the blocks over one K-only sliding-window cache (``build_attn`` for a K-only
    ISWA input, llama-graph.cpp:3285-3350), the head's mix; returns that mix (t_embd, before the norm)."""
    b = _Builder(sh, r, g, draft=True)
    rows = Graph.get_rows(Graph.weight((sh.n_embd, sh.n_vocab), "token_embd"), tokens)
    return b.hc_head(b.trunk(rows))


class _Builder:
    def __init__(self, sh: Dsv4Shape, r: Reserve, g: Graph | None = None, draft: bool = False) -> None:
        self.sh, self.r, self.g, self.draft = sh, r, g or Graph(), draft
        n_seqs = max(1, r.n_seqs)
        self.T = -(-r.n_tokens // n_seqs) * n_seqs
        # one stream per sequence, whatever -kvu (llama-kv-cache-dsv4.cpp:1246-1247, 1290); a drafter's cache: -kvu's
        self.ns = max(1, r.n_stream) if draft else n_seqs
        self.raw_cells = r.n_kv_swa
        mask_es = 2 if r.flash_attn else F32
        T, ns = self.T, self.ns
        self.pos = Graph.input((T,), I32)
        self.k_idxs = Graph.input((T,), I64)
        rot = r.rot_k  # each cache's own rotation input when the K type is quantized (build_input_k_rot)
        self.raw_rot, self.csa_rot, self.hca_rot = (Graph.input((rot, rot), F32) if rot else None for _ in range(3))
        if draft:  # build_attn_inp_k_iswa's sliding-window inputs (llama-graph.cpp:3532-3559)
            self.raw_mask = kq_mask((self.raw_cells, T // ns, 1, ns), r.flash_attn, r.mask_f16)
            return
        # build_inp_dsv4 (llama-graph.cpp:3560-3585): raw first, then csa, hca, lid
        self.raw_mask = Graph.input((self.raw_cells, T // ns, 1, ns), mask_es)
        csa_cells, hca_cells = compressed_cells(r.n_kv, CSA), compressed_cells(r.n_kv, HCA)
        self.csa = self.comp(CSA, True, csa_cells, 2 * sh.head_dim, mask_es)
        self.hca = self.comp(HCA, False, hca_cells, sh.head_dim, mask_es)
        self.lid = self.comp(CSA, True, csa_cells, 2 * sh.idx_dim, 2)  # F16: the fused indexer's mask
        self.lid_rot = Graph.input((sh.idx_rot, sh.idx_rot), F32)

    def comp(self, ratio: int, overlap: bool, cells: int, width: int, mask_es: int) -> _Comp:
        T, ns, n_rs = self.T, self.ns, self.r.n_rs_seq
        state_size = 2 * ratio if overlap else ratio
        n_blocks = T // ratio + ns
        n_persist = min(T, state_size * ns)
        n_restore = state_size * ns if n_rs else 0
        n_snap = n_rs * state_size * ns

        def pair(n: int) -> tuple[Tensor, Tensor] | None:
            return (Graph.input((n,), I32), Graph.input((n,), I32)) if n else None

        persist = pair(n_persist)
        assert persist is not None
        return _Comp(
            state_pos=Graph.input((T,), I32),
            persist_src=persist[0],
            persist_dst=persist[1],
            restore=pair(n_restore),
            snapshot=pair(n_snap),
            read=Graph.input(((2 if overlap else 1) * ratio * n_blocks,), I32),
            write_idxs=Graph.input((n_blocks,), I64),
            write_pos=Graph.input((n_blocks,), I32),
            mask=Graph.input((cells, T // ns, 1, ns), mask_es),
            cells=cells,
            ratio=ratio,
            state_size=state_size,
            width=width,
        )

    def graph(self) -> Graph:
        sh, g, T = self.sh, self.g, self.T
        rows = input_embeddings(g, sh.n_embd, sh.n_vocab, T, mixed=self.r.mixed_batch)
        n_out = max(1, min(self.r.n_outputs, T))
        out_ids = Graph.input((n_out,), I32)
        g.expand(self.raw_mask)
        x = self.trunk(rows)
        flat = Graph.get_rows(Graph.reshape(x, (sh.n_embd * sh.hc, T)), out_ids)
        x = Graph.reshape(flat, (sh.n_embd, sh.hc, n_out))
        output_head(g, self.hc_head(x), sh.n_vocab, self.r.pooling, self.ns, self.r.samplers)
        return g

    def trunk(self, rows: Tensor) -> Tensor:
        """The copies of the token rows through every block (deepseek4.cpp:1234-1321, dflash.cpp:935-999)."""
        sh = self.sh
        x = Graph.op("repeat", (sh.n_embd, sh.hc, self.T), Graph.reshape(rows, (sh.n_embd, 1, self.T)))
        for il in range(sh.n_layer):
            with in_layer(il):
                x = self.block(x, il, rows.src[1])
        return x

    def block(self, x: Tensor, il: int, tokens: Tensor) -> Tensor:
        """One block: attention and the routed and shared experts, each between its hyper-connection mixes
        (the model's graph expands the FFN's residual and mixes early; its drafters' do not)."""
        sh, g = self.sh, self.g
        residual = x
        cur, post, comb = self.hc_pre(x, "hc_attn")
        cur = self.attention(rms_norm(cur, "attn_norm"), il)
        x = Graph.op("dsv4_hc_post", x.ne, cur, residual, post, comb)
        residual = x
        cur, post, comb = self.hc_pre(x, "hc_ffn")
        if not self.draft:
            for t in (residual, post, comb):
                g.expand(t)
        cur = rms_norm(cur, "ffn_norm")
        hashed = il < sh.n_hash
        ex = replace(sh.experts, probs_bias=sh.experts.probs_bias and not hashed)
        # a hash-routed layer's experts are its token ids' rows of tid2eid (deepseek4.cpp:1290-1293)
        chosen = Graph.get_rows(Graph.weight((ex.n_used, sh.n_vocab), "ffn_gate_tid2eid"), tokens) if hashed else None
        moe = moe_ffn(g, cur, ex, selected=chosen)
        cur = Graph.like("add", moe, gated_ffn(cur, sh.n_ff_shexp, "_shexp"))
        return Graph.op("dsv4_hc_post", x.ne, cur, residual, post, comb)

    def mixes(self, x: Tensor, name: str, width: int) -> Tensor:
        flat = Graph.reshape(x, (x.ne[0] * x.ne[1], x.ne[2]))
        return Graph.mul_mat(Graph.weight((flat.ne[0], width), f"{name}_fn"), Graph.like("rms_norm", flat))

    def weights(self, mixes: Tensor, name: str, whole: bool = False) -> Tensor:
        """A mix's pre or post weights (deepseek4.cpp:375-391, 459-463): its rows (``whole``: all of them, the
        head's) times a scale plus a base, through a sigmoid, then scaled (and biased)."""
        hc, nt = self.sh.hc, mixes.ne[1]
        w = mixes if whole else Graph.view(mixes, (hc, nt), (mixes.nb[1],))
        w = Graph.like("mul", w, Graph.weight((1,), f"{name}_scale"))
        w = Graph.like("add", w, Graph.weight((hc,), f"{name}_base"))
        return Graph.like("scale", Graph.like("unary", w))

    def hc_pre(self, x: Tensor, name: str) -> tuple[Tensor, Tensor, Tensor]:
        """build_hc_pre (deepseek4.cpp:353-409), fused: the block's input, its post weights, its combination."""
        hc, nt = self.sh.hc, x.ne[2]
        mixes = self.mixes(x, name, (2 + hc) * hc)
        pre = self.weights(mixes, name)
        post = self.weights(mixes, name)
        comb = Graph.op("dsv4_hc_comb", (hc, hc, nt), mixes, Graph.weight((3,), f"{name}_scale"))
        return Graph.op("dsv4_hc_pre", (x.ne[0], nt), x, pre), post, comb

    def hc_head(self, x: Tensor) -> Tensor:
        """build_hc_head (deepseek4.cpp:448-468): the mix's weights, then each copy weighted and summed."""
        pre = self.weights(self.mixes(x, "output_hc", self.sh.hc), "output_hc", whole=True)

        def weighted() -> Tensor:  # one copy times its weight
            xh = Graph.view(x, (x.ne[0], x.ne[2]), (x.nb[2],))
            return Graph.like("mul", xh, Graph.view(pre, (1, x.ne[2]), (pre.nb[1],)))

        out = weighted()
        for _ in range(1, self.sh.hc):
            out = Graph.like("add", out, weighted())
        return out

    def attention(self, cur: Tensor, il: int) -> Tensor:
        sh, r, g, T = self.sh, self.r, self.g, self.T
        W, hd, nh = Graph.weight, sh.head_dim, sh.n_head
        qr = rms_norm(Graph.mul_mat(W((sh.n_embd, sh.q_lora_rank), "attn_q_a"), cur), "attn_q_a_norm")
        q = Graph.reshape(Graph.mul_mat(W((sh.q_lora_rank, nh * hd), "attn_q_b"), qr), (hd, nh, T))
        q = Graph.like("rope", Graph.like("rms_norm", q), self.pos)
        kv = rms_norm(Graph.mul_mat(W((sh.n_embd, hd), "attn_kv"), cur), "attn_kv_a_norm")
        kv = Graph.like("rope", Graph.reshape(kv, (hd, 1, T)), self.pos)
        ratio = sh.ratios[il]
        if ratio == CSA:
            self.compress(cur, self.csa, "attn_compressor", hd, self.csa_rot)
            self.compress(cur, self.lid, "indexer_compressor", sh.idx_dim, self.lid_rot)
        elif ratio == HCA:
            self.compress(cur, self.hca, "attn_compressor", hd, self.hca_rot)
        if self.raw_rot is not None:
            q, kv = hadamard(q, self.raw_rot), hadamard(kv, self.raw_rot)
        for t in (q, kv):
            g.expand(t)
        raw = Graph.cache((hd, self.raw_cells * self.ns), r.cache_esize)
        g.expand(Graph.set_rows(raw, Graph.view(kv, (hd, T), (kv.nb[2],)), self.k_idxs))
        k = Graph.view(raw, (hd, 1, self.raw_cells, self.ns))
        mask = self.raw_mask
        if ratio:
            comp = self.csa if ratio == CSA else self.hca
            ck = Graph.view(self.comp_cache(comp, hd), (hd, 1, comp.cells, self.ns))
            k = Graph.op("concat", (hd, 1, self.raw_cells + comp.cells, self.ns), k, ck, esize=r.cache_esize)
            k.size = row_size(by_name(r.type_k), hd) * k.ne[2] * self.ns  # a quantized cache's own bytes
            extra = self.top_k_mask(self.top_k(cur, qr)) if ratio == CSA else comp.mask
            mask = Graph.op("concat", (mask.ne[0] + extra.ne[0], *mask.ne[1:]), mask, extra, esize=mask.esize)
        out = self.mha(q, k, mask)
        if self.raw_rot is not None:
            out = hadamard(out, self.raw_rot)
        out = Graph.like("rope_back", Graph.reshape(out, (hd, nh, T)), self.pos)
        gd = nh * hd // sh.o_groups
        out = Graph.view(Graph.reshape(out, (gd, sh.o_groups, T)), (gd, T, sh.o_groups), op="permute")
        oa = Graph.mul_mat(W((gd, sh.o_lora_rank, sh.o_groups), "attn_output_a"), out)
        oa = Graph.op("cont", (sh.o_lora_rank * sh.o_groups, T), Graph.view(oa, (sh.o_lora_rank, sh.o_groups, T)))
        return Graph.mul_mat(W((sh.o_groups * sh.o_lora_rank, sh.n_embd), "attn_output_b"), oa)

    def mha(self, q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
        """build_attn_mha with K as V (llama-graph.cpp:2691-2830; V not transposed: K's layout)."""
        r, T, ns, hd, nh = self.r, self.T, k.ne[3], self.sh.head_dim, self.sh.n_head
        qs = Graph.view(q, (hd, nh, T // ns, ns), (q.nb[1], q.nb[2], q.nb[2] * (T // ns)))
        qp = Graph.view(qs, (hd, T // ns, nh, ns), op="permute")
        kp = Graph.view(k, (hd, k.ne[2], 1, ns), op="permute")
        vp = Graph.view(k, (hd, k.ne[2], 1, ns), op="permute")
        if r.flash_attn:
            if r.cache_esize != 2:  # ggml_cast of an F32 cache, K and V each
                kp, vp = (Graph.op("cpy", t.ne, t, esize=2) for t in (kp, vp))
            out = Graph.reshape(Graph.op("flash_attn_ext", (hd, nh, T // ns, ns), qp, kp, vp, mask), (hd * nh, T))
        else:
            kq = Graph.like("soft_max", Graph.op("mul_mat", (k.ne[2], T // ns, nh, ns), kp, qp), mask)
            vt = Graph.transpose(vp)
            kqv = Graph.op("mul_mat", (hd, T // ns, nh, ns), Graph.op("cont", vt.ne, vt, esize=r.cache_esize), kq)
            out = Graph.op("cont", (hd * nh, T), Graph.view(kqv, (hd, nh, T // ns, ns), op="permute"))
        self.g.expand(out)
        return out

    def comp_cache(self, c: _Comp, width: int) -> Tensor:
        return Graph.cache((width, c.cells * self.ns), self.r.cache_esize)

    def compress(self, cur: Tensor, c: _Comp, name: str, dim: int, rot: Tensor | None) -> None:
        """A compressor's step (deepseek4.cpp:941-1160): the ubatch's rows and scores, the blocks folded
        from the state and them, written to the compressed cache; the state snapshot and persisted."""
        g, W, sw, T = self.g, Graph.weight, c.width, self.T
        st_kv = Graph.mul_mat(W((self.sh.n_embd, sw), f"{name}_kv"), cur)
        st_score = Graph.mul_mat(W((self.sh.n_embd, sw), f"{name}_gate"), cur)
        ape = Graph.get_rows(W((sw, c.ratio), f"{name}_ape"), c.state_pos)
        st_score = Graph.like("add", st_score, ape)
        n_rows = c.state_size * self.ns
        planes = n_rows * (1 + self.r.n_rs_seq)
        restored = []
        for _ in range(2):  # kv, then score (dsv4_build_state_restore)
            every = Graph.view(Graph.cache((sw, planes)), (sw, planes))
            if c.restore is not None:
                every = Graph.set_rows(every, Graph.get_rows(every, c.restore[0]), c.restore[1])
            restored.append(every)
        sources = [
            Graph.op("concat", (sw, n_rows + T), Graph.view(every, (sw, n_rows)), new)
            for every, new in zip(restored, (st_kv, st_score), strict=True)
        ]
        blocks = self.fold(sources[0], sources[1], c, dim, name)
        if rot is not None:
            blocks = hadamard(blocks, rot)
        cache = self.comp_cache(c, dim)
        g.expand(Graph.set_rows(cache, Graph.view(blocks, (dim, blocks.ne[2]), (blocks.nb[2],)), c.write_idxs))
        if c.snapshot is not None:
            for every, new in zip(restored, (st_kv, st_score), strict=True):
                src = Graph.op("concat", (sw, planes + T), every, new)
                g.expand(Graph.set_rows(every, Graph.get_rows(src, c.snapshot[0]), c.snapshot[1]))
        for every, new in zip(restored, (st_kv, st_score), strict=True):
            g.expand(Graph.set_rows(every, Graph.get_rows(new, c.persist_src), c.persist_dst))

    def fold(self, kv: Tensor, score: Tensor, c: _Comp, dim: int, name: str) -> Tensor:
        """build_{overlap,hca}_compressed_kv_from_state (deepseek4.cpp:470-588): the blocks' rows gathered
        (an overlapping compressor's previous and current halves side by side), softmax-weighted and summed,
        normed and rotated."""
        ratio, n_blocks = c.ratio, c.write_pos.ne[0]
        if c.state_size == 2 * ratio:
            kv, score = self.zero_row(kv), self.zero_row(score)
            halves = []
            n_read = ratio * n_blocks
            for t in (kv, score):
                rows = Graph.get_rows(t, c.read)
                prev = Graph.like("cont", Graph.view(rows, (dim, n_read), (rows.nb[1],)))
                now = Graph.like("cont", Graph.view(rows, (dim, n_read), (rows.nb[1],)))
                halves.append((Graph.reshape(prev, (dim, ratio, n_blocks)), Graph.reshape(now, (dim, ratio, n_blocks))))
            (kp, kc), (sp, sc) = halves
            values = Graph.op("concat", (dim, 2 * ratio, n_blocks), kp, kc)
            scores = Graph.op("concat", (dim, 2 * ratio, n_blocks), sp, sc)
        else:
            values = Graph.reshape(Graph.get_rows(kv, c.read), (dim, ratio, n_blocks))
            scores = Graph.reshape(Graph.get_rows(score, c.read), (dim, ratio, n_blocks))
        n = values.ne[1]
        values = Graph.op("cont", (n, dim, n_blocks), Graph.view(values, (n, dim, n_blocks), op="permute"))
        scores = Graph.op("cont", (n, dim, n_blocks), Graph.view(scores, (n, dim, n_blocks), op="permute"))
        comp = Graph.like("mul", values, Graph.like("soft_max", scores))
        comp = Graph.op("sum_rows", (1, dim, n_blocks), comp)
        comp = Graph.op("cont", (dim, 1, n_blocks), Graph.view(comp, (dim, 1, n_blocks), op="permute"))
        return Graph.like("rope", rms_norm(comp, f"{name}_norm"), c.write_pos)

    @staticmethod
    def zero_row(t: Tensor) -> Tensor:
        """dsv4_append_zero_row (deepseek4.cpp:209-215): a zero (or -inf: ggml_scale_bias, the same op) row
        concatenated after ``t``."""
        row = Graph.like("scale", Graph.view(t, (t.ne[0],)))
        return Graph.op("concat", (t.ne[0], t.ne[1] + 1), t, Graph.reshape(row, (t.ne[0], 1)))

    def top_k(self, cur: Tensor, qr: Tensor) -> Tensor:
        """build_lid_top_k (deepseek4.cpp:590-676), the fused indexer."""
        sh, T, ns, lid = self.sh, self.T, self.ns, self.lid
        W, d, nih = Graph.weight, sh.idx_dim, sh.idx_heads
        iq = Graph.reshape(Graph.mul_mat(W((sh.q_lora_rank, nih * d), "indexer.attn_q_b"), qr), (d, nih, T))
        iq = hadamard(Graph.like("rope", iq, self.pos), self.lid_rot)
        w = Graph.like("scale", Graph.mul_mat(W((sh.n_embd, nih), "indexer.proj"), cur))
        keys = Graph.view(self.comp_cache(lid, d), (d, 1, lid.cells, ns))
        iq = Graph.view(iq, (d, nih, T // ns, ns))
        w = Graph.view(w, (nih, T // ns, 1, ns))
        score = Graph.op("lightning_indexer", (lid.cells, T // ns, 1, ns), iq, keys, w, lid.mask)
        top = Graph.op("top_k", (min(lid.cells, sh.idx_top_k), T // ns, 1, ns), score, esize=I32)
        return Graph.op("cont", top.ne, top, esize=I32)

    def top_k_mask(self, top: Tensor) -> Tensor:
        """build_top_k_mask (deepseek4.cpp:678-705): -inf everywhere, zeros at the top-k cells, the mask added."""
        m = self.csa.mask
        filled = Graph.like("fill", m)
        rows = Graph.view(filled, (1, m.ne[0], m.ne[1], m.ne[3]), (filled.nb[0], filled.nb[1], filled.nb[2]))
        idx = Graph.view(top, (top.ne[0], top.ne[1], top.ne[3], 1))
        zeros = Graph.like("fill", Graph.new((1, top.ne[0], top.ne[1], top.ne[3]), m.esize))
        opened = Graph.view(Graph.set_rows(rows, zeros, idx), m.ne)
        return Graph.like("add", opened, m)

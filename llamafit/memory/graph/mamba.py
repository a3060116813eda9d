"""The reserve graph of a pure Mamba model, node by node, for ``llamafit.memory.graph.galloc``.

Mirrors ``src/models/mamba.cpp:87-137`` (the trunk), ``src/models/mamba-base.cpp`` build_mamba_layer
(9-150, Mamba-1 and Falcon-Mamba) and build_mamba2_layer (153-300), ``src/llama-graph.cpp``
build_inp_embd (2413-2533, its three selectable inputs all stay in the graph), build_rs (3587-3626,
3661-3676) and build_inp_out_ids (2569-2589). The reserve ubatch (llama-context.cpp:2526-2566,
600-735) has ``n_seq_max`` sequences of ``n_tokens / n_seq_max`` tokens each and the full recurrent
memory (``n_rs = max(1, n_seq_max)``, head 0, rs_z 0: llama-memory-recurrent.cpp:1291-1346).

The allocator's high-water mark of this graph is the compute buffer the CPU build logs: the layer's
tensors (the in-projection, the conv window, the scan's output with its states) fragment the buffer
in a way no per-token sum of live tensors gives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from llamafit.memory.graph.galloc import F32, I32, Graph, Tensor, in_layer
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.sampling import Samplers
from llamafit.memory.graph.trunk import RecurrentStates, input_embeddings, output_head, rms_norm


@dataclass(frozen=True)
class MambaShape(Recipe):
    version: int  # 1: build_mamba_layer, 2: build_mamba2_layer
    n_layer: int
    n_embd: int
    n_vocab: int
    d_conv: int
    d_inner: int
    d_state: int
    dt_rank: int  # ssm.time_step_rank: Mamba-1's dt rank, Mamba-2's head count
    n_group: int = 1
    dt_b_c_rms: bool = False  # Falcon-Mamba: RMS norm on dt, B and C

    attends: ClassVar[bool] = False  # no KV cache: its cache settings change no node
    poolings: ClassVar[tuple[str | None, ...]] = (None, "none")

    def graph(self, r: Reserve) -> Graph:
        """Of ``r`` only the batch, the sequences, the outputs and the rollback snapshots matter."""
        return MambaLayers(self, r, r.samplers).graph()

    def first_layer(self) -> Recipe | None:
        return replace(self, n_layer=1)

    def rotations(self, rot: tuple[int, int], quantized: bool) -> tuple[int, int] | None:
        return 0, 0


class MambaLayers:
    """One reserve graph: the trunk's inputs, build_rs, and the layers of either Mamba generation (``g``: a
    hybrid's graph its Mamba-2 layers are built into, ``llamafit.memory.graph.layered``)."""

    def __init__(
        self,
        sh: MambaShape,
        r: Reserve,
        samplers: Samplers | None = None,
        g: Graph | None = None,
    ) -> None:
        """Of ``r`` only the batch, the sequences, the outputs, the rollback snapshots and the build's input
        and state-gathering rules matter."""
        self.sh, self.samplers, self.mixed, self.proj_2d = sh, samplers, r.mixed_batch, r.mamba2_2d
        self.g = Graph() if g is None else g
        self.n_seqs = max(1, r.n_seqs)
        self.T = -(-r.n_tokens // self.n_seqs) * self.n_seqs  # graph_reserve: a multiple of n_seqs
        self.nst = self.T // self.n_seqs
        self.K = r.n_rs_seq + 1 if r.n_rs_seq > 0 and sh.version == 2 else 1
        self.n_out = max(1, min(r.n_outputs, self.T))
        self.n_head = sh.dt_rank if sh.version == 2 else sh.d_inner
        self.head_dim = sh.d_inner // self.n_head
        self.conv_ch = sh.d_inner + (2 * sh.n_group * sh.d_state if sh.version == 2 else 0)
        self.n_embd_r = (sh.d_conv - 1) * self.conv_ch
        self.n_embd_s = sh.d_state * sh.d_inner
        self.rs = RecurrentStates(self.g, self.n_seqs, r.rs_one_gather)

    def graph(self) -> Graph:
        sh, g = self.sh, self.g
        inp_l = input_embeddings(g, sh.n_embd, sh.n_vocab, self.T, mixed=self.mixed)
        out_ids = Graph.input((self.n_out,), I32)
        for il in range(sh.n_layer):
            with in_layer(il):
                cur = rms_norm(inp_l)
                cur = self.mamba2(cur) if sh.version == 2 else self.mamba1(cur)
                if il == sh.n_layer - 1:
                    cur = Graph.get_rows(cur, out_ids)
                    inp_l = Graph.get_rows(inp_l, out_ids)
                inp_l = Graph.like("add", cur, inp_l)
        output_head(g, inp_l, sh.n_vocab, n_seqs=self.n_seqs, samplers=self.samplers)
        return g

    def scan(self, ssm_all: Tensor, x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        """The SSM states read by ggml_ssm_scan itself (build_rs with get_state_rows): its output is the
        new tokens' y followed by K state snapshots per sequence."""
        size = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3] + self.K * self.n_embd_s * self.n_seqs

        def getter(states: Tensor, ids: Tensor) -> Tensor:
            ssm = Graph.reshape(states, (self.sh.d_state, self.head_dim, self.n_head, states.ne[1]))
            return Graph.op("ssm_scan", (size,), ssm, x, dt, a, b, c, ids)

        return self.rs.gather(ssm_all, self.n_embd_s, getter)

    def conv(self, conv_all: Tensor, x: Tensor) -> Tensor:
        """The conv window: the gathered states before the new tokens, its tail saved, the conv, bias, SiLU."""
        sh, n_seqs, nst = self.sh, self.n_seqs, self.nst
        conv = self.rs.gather(conv_all, self.n_embd_r)
        conv = Graph.reshape(conv, (sh.d_conv - 1, self.conv_ch, n_seqs))
        conv_x = Graph.op("concat", (sh.d_conv - 1 + nst, self.conv_ch, n_seqs), conv, Graph.transpose(x))
        for _slot in range(min(nst, self.K)):
            last = Graph.view(conv_x, (sh.d_conv - 1, self.conv_ch, n_seqs), (conv_x.nb[1], conv_x.nb[2]))
            self.rs.cpy(last, Graph.view(conv_all, (self.n_embd_r, n_seqs)))
        out = Graph.op(
            "ssm_conv", (self.conv_ch, nst, n_seqs), conv_x, Graph.weight((sh.d_conv, self.conv_ch), "ssm_conv1d")
        )
        return Graph.like("unary", Graph.like("add", out, Graph.weight((self.conv_ch,), "ssm_conv1d.bias")))

    def save_states(self, ssm_all: Tensor, y_ssm: Tensor) -> None:
        n_written = min(self.nst, self.K)
        shape = (self.n_embd_s, self.n_seqs, n_written)
        self.rs.cpy(Graph.view(y_ssm, shape), Graph.view(ssm_all, shape))

    def states(self) -> tuple[Tensor, Tensor]:
        rows = self.rs.n_rs * self.K
        return Graph.cache((self.n_embd_r, rows)), Graph.cache((self.n_embd_s, rows))

    def mamba1(self, cur: Tensor) -> Tensor:
        """mamba-base.cpp:9-150."""
        sh, n_seqs, nst, E = self.sh, self.n_seqs, self.nst, self.sh.n_embd
        W = Graph.weight
        conv_all, ssm_all = self.states()
        cur = Graph.reshape(cur, (E, nst, n_seqs))
        xz = Graph.mul_mat(W((E, 2 * sh.d_inner), "ssm_in"), cur)
        x = Graph.view(xz, (sh.d_inner, nst, n_seqs), (xz.nb[1], xz.nb[2]))
        z = Graph.view(xz, (sh.d_inner, nst, n_seqs), (xz.nb[1], xz.nb[2]))
        x = self.conv(conv_all, x)
        x_db = Graph.mul_mat(W((sh.d_inner, sh.dt_rank + 2 * sh.d_state), "ssm_x"), x)
        dt = Graph.view(x_db, (sh.dt_rank, nst, n_seqs), (x_db.nb[1], x_db.nb[2]))
        bc = (sh.d_state, 1, nst, n_seqs)
        b = Graph.view(x_db, bc, (sh.d_state * F32, x_db.nb[1], x_db.nb[2]))
        c = Graph.view(x_db, bc, (sh.d_state * F32, x_db.nb[1], x_db.nb[2]))
        if sh.dt_b_c_rms:  # Falcon-Mamba: build_norm without weights
            dt, b, c = (Graph.like("rms_norm", t) for t in (dt, b, c))
        else:
            dt = Graph.like("cont", dt)
        dt = Graph.like(
            "add", Graph.mul_mat(W((sh.dt_rank, sh.d_inner), "ssm_dt"), dt), W((sh.d_inner,), "ssm_dt.bias")
        )
        x4 = Graph.reshape(x, (1, sh.d_inner, nst, n_seqs))
        y_ssm = self.scan(ssm_all, x4, dt, W((sh.d_state, sh.d_inner), "ssm_a"), b, c)
        self.save_states(ssm_all, y_ssm)
        y = Graph.view(y_ssm, (sh.d_inner, nst, n_seqs))
        y = Graph.like("add", y, Graph.like("mul", x, W((sh.d_inner,), "ssm_d")))
        zc = Graph.like("cont", z)
        y = Graph.op("glu", zc.ne, zc, y)  # ggml_swiglu_split: the shape of its first source
        return Graph.reshape(Graph.mul_mat(W((sh.d_inner, E), "ssm_out"), y), (E, self.T))

    def mamba2(self, cur: Tensor) -> Tensor:
        """mamba-base.cpp:153-300."""
        sh, n_seqs, nst, E = self.sh, self.n_seqs, self.nst, self.sh.n_embd
        n_head, head_dim, conv_ch = self.n_head, self.head_dim, self.conv_ch
        W = Graph.weight
        conv_all, ssm_all = self.states()
        d_in_proj = 2 * sh.d_inner + 2 * sh.n_group * sh.d_state + n_head
        if self.proj_2d:  # 189-194
            zx = Graph.reshape(Graph.mul_mat(W((E, d_in_proj), "ssm_in"), cur), (d_in_proj, nst, n_seqs))
        else:  # before MAMBA2_PROJ_2D_SINCE: the batch made 3-D first
            zx = Graph.mul_mat(W((E, d_in_proj), "ssm_in"), Graph.reshape(cur, (E, nst, n_seqs)))
        z = Graph.view(zx, (head_dim, n_head, nst, n_seqs), (head_dim * F32, zx.nb[1], zx.nb[2]))
        xbc = Graph.view(zx, (conv_ch, nst, n_seqs), (zx.nb[1], zx.nb[2]))
        dt = Graph.view(zx, (n_head, nst, n_seqs), (zx.nb[1], zx.nb[2]))
        xbc = self.conv(conv_all, xbc)
        x = Graph.view(xbc, (head_dim, n_head, nst, n_seqs), (head_dim * F32, xbc.nb[1], xbc.nb[2]))
        bc = (sh.d_state, sh.n_group, nst, n_seqs)
        b = Graph.view(xbc, bc, (sh.d_state * F32, xbc.nb[1], xbc.nb[2]))
        c = Graph.view(xbc, bc, (sh.d_state * F32, xbc.nb[1], xbc.nb[2]))
        dt = Graph.like("add", Graph.like("cont", dt), W((n_head,), "ssm_dt.bias"))
        y_ssm = self.scan(ssm_all, x, dt, W((1, n_head), "ssm_a"), b, c)
        self.save_states(ssm_all, y_ssm)
        y = Graph.view(y_ssm, (head_dim, n_head, nst, n_seqs))
        y = Graph.like("add", y, Graph.like("mul", x, W((1, n_head), "ssm_d")))
        zc = Graph.like("cont", z)
        y = Graph.op("glu", zc.ne, zc, y)  # ggml_swiglu_split: the shape of its first source
        y = Graph.reshape(y, (sh.d_inner // sh.n_group, sh.n_group, nst, n_seqs))
        y = Graph.like("mul", Graph.like("rms_norm", y), W((sh.d_inner // sh.n_group, sh.n_group), "ssm_norm"))
        if self.proj_2d:  # 296-299
            return Graph.mul_mat(W((sh.d_inner, E), "ssm_out"), Graph.reshape(y, (sh.d_inner, self.T)))
        out = Graph.mul_mat(W((sh.d_inner, E), "ssm_out"), Graph.reshape(y, (sh.d_inner, nst, n_seqs)))
        return Graph.reshape(out, (E, self.T))

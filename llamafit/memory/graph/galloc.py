"""A small replica of ggml's graph building and graph allocator, for the compute buffer.

The compute buffer a backend logs (``sched_reserve: ... compute buffer size``) is the high-water mark
ggml-alloc reaches while it lays out the reserve graph's intermediate tensors in one buffer. Where the
per-phase terms of ``llamafit.memory.phases`` are not exact (graphs whose working set fragments the
buffer), a model's graph is built here node by node, as its ``src/models/*.cpp`` builds it, and
allocated as ggml does:

* graph order: ``ggml_build_forward_expand`` visits sources left to right, depth first, and appends
  a tensor after its sources; an op tensor is a node, an op-less one a leaf (ggml.c:7244-7311);
* ``ggml_gallocr_alloc_graph_impl`` (ggml-alloc.c:718-823): leafs first, then each node after its
  parents; a node whose op may work in place takes over a parent used only by it, with the same
  layout, not an output and not a view (ggml-alloc.c:623-689, the op list at ggml-alloc.c:22-49);
  a tensor is freed when its last child ran and no view of it is left;
* ``ggml_dyn_tallocr_alloc`` (ggml-alloc.c:202-310): the best fitting free block other than the last,
  else the last block (which grows the buffer); freed bytes merge with their neighbours.

Only sizes matter: a tensor is its shape, strides and element size. Views and tensors with external
memory (weights, caches) take no space.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

F32 = 4
I32 = 4
I64 = 8

# ggml_op_can_inplace (ggml-alloc.c:22-49), by the names this module gives ops
INPLACE_OPS = frozenset(
    {
        "fill",
        "scale",
        "diag_mask_zero",
        "diag_mask_inf",
        "add",
        "add_id",
        "add1",
        "sub",
        "mul",
        "div",
        "sqr",
        "sqrt",
        "log",
        "unary",
        "rope",
        "rope_back",
        "silu_back",
        "rms_norm",
        "rms_norm_back",
        "clamp",
        "soft_max",
        "soft_max_back",
    }
)


@dataclass(frozen=True)
class Where:
    """Where a graph's own memory sits when it spans several backends (``llamafit.memory.graph.sched``):
    ``device(layer, name)`` for a weight (``name``: its GGUF name in the layer without ``.weight``:
    ``attn_q``, ``ffn_up_exps``, ``ssm_dt.bias``, ``token_embd``, ``output``), a layer's KV cache or
    recurrent state (``cache``) and a layer's pinned norm (``norm``); ``pin_norms``: llama.cpp puts each
    layer's norms on the layer's device (a full offload, llama-context.cpp:2646-2661)."""

    device: Callable[[int | None, str], str]
    pin_norms: bool = False
    # a weight's bytes in its own type, and with rows padded (ggml-cuda's allocation): what a copy of it
    # takes in another backend's buffer (op offload); None: unknown
    size: Callable[[int | None, str], tuple[int, int] | None] | None = None


T = TypeVar("T")
_WHERE: ContextVar[Where | None] = ContextVar("llamafit_galloc_where", default=None)
_LAYER: ContextVar[int | None] = ContextVar("llamafit_galloc_layer", default=None)
_TAGGED: ContextVar[list[Tensor] | None] = ContextVar("llamafit_galloc_tagged", default=None)


@contextmanager
def _setting(var: ContextVar[T], value: T) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


@contextmanager
def placed(where: Where | None, tagged: list[Tensor] | None = None) -> Iterator[None]:
    """Tensors made inside are tagged with their backends (builders made outside are untagged: one backend); each
    one tagged is added to ``tagged`` as it is (what ``retag`` places again, without walking the graph for them)."""
    with _setting(_WHERE, where), _setting(_TAGGED, tagged):
        yield


def in_layer(il: int | None) -> AbstractContextManager[None]:
    """The layer the weights, caches and norms made inside belong to."""
    return _setting(_LAYER, il)


def _placed_as(t: Tensor, name: str) -> None:
    """``t`` (a weight or a cache called ``name``) on its backend under ``placed``, and what it is kept on it,
    so that ``retag`` can place the same graph again."""
    where = _WHERE.get()
    if where is not None:
        t.tag = (_LAYER.get(), name)
        t.backend = where.device(*t.tag)
        if (kept := _TAGGED.get()) is not None:
            kept.append(t)


def of_layer(t: Tensor) -> Tensor:
    """``t`` (a node) marked with its layer's device, where the layer's own cache is (offload_kqv): for the probe
    that compares a fused node's device with its layer's (resolve_fused_ops); the scheduler does not read it."""
    _placed_as(t, "cache")
    return t


def pin_norm(t: Tensor) -> Tensor:
    """A layer's norm (build_norm's ``norm-il``) on the layer's device where llama.cpp pins it."""
    where = _WHERE.get()
    il = _LAYER.get()
    if where is not None and il is not None:
        t.tag = (il, "norm")
        t.pinned = where.device(il, "norm") if where.pin_norms else None
        if (kept := _TAGGED.get()) is not None:
            kept.append(t)
    return t


def retag(tensors: Sequence[Tensor], where: Where) -> None:
    """The tensors of a graph built under ``placed`` put where ``where`` says, as a build under it would have
    put them: a graph's nodes do not depend on where its weights are, so one build serves every placement."""
    for t in tensors:
        assert t.tag is not None
        il, name = t.tag
        if name == "norm":
            t.pinned = where.device(il, name) if where.pin_norms else None
        else:
            t.backend = where.device(il, name)


@dataclass(eq=False, slots=True)
class Tensor:
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    esize: int
    op: str = "none"  # "none": a leaf
    src: tuple[Tensor, ...] = ()
    view_src: Tensor | None = None
    external: bool = False  # memory of its own outside the compute buffer (weights, caches)
    is_input: bool = False
    is_output: bool = False
    backend: str | None = None  # the backend whose buffer holds an external tensor (under ``placed``)
    weight: bool = False  # a model weight (GGML_BACKEND_BUFFER_USAGE_WEIGHTS), not a cache
    pinned: str | None = None  # the backend llama.cpp assigns a node to (ggml_backend_sched_set_tensor_backend)
    size: int | None = None  # bytes when the type is not what ``esize`` describes (a quantized weight)
    padded: int | None = None  # ``size`` with rows padded, as ggml-cuda allocates a copy of it
    tag: tuple[int | None, str] | None = None  # (layer, name) of a weight, cache or norm ``Where`` places

    @property
    def nbytes(self) -> int:
        if self.size is not None:
            return self.size
        # ggml_nbytes, spelled out: the allocator asks it of every tensor of every replay
        (n0, n1, n2, n3), (b0, b1, b2, b3) = self.ne, self.nb
        if n0 <= 0 or n1 <= 0 or n2 <= 0 or n3 <= 0:
            return 0
        return self.esize + (n0 - 1) * b0 + (n1 - 1) * b1 + (n2 - 1) * b2 + (n3 - 1) * b3

    def same_layout(self, other: Tensor) -> bool:
        return self.esize == other.esize and self.ne == other.ne and self.nb == other.nb


def _ne(shape: Sequence[int]) -> tuple[int, int, int, int]:
    n = len(shape)  # the builders make every tensor of the graph through here: spelled out for each length
    if n >= 4:
        return (shape[0], shape[1], shape[2], shape[3])
    if n == 3:
        return (shape[0], shape[1], shape[2], 1)
    if n == 2:
        return (shape[0], shape[1], 1, 1)
    return (shape[0], 1, 1, 1) if n == 1 else (1, 1, 1, 1)


def _strides(ne: tuple[int, int, int, int], esize: int) -> tuple[int, int, int, int]:
    nb0 = esize
    nb1 = nb0 * ne[0]
    nb2 = nb1 * ne[1]
    return (nb0, nb1, nb2, nb2 * ne[2])


def _view_strides(ne: tuple[int, int, int, int], esize: int, nb: Sequence[int]) -> tuple[int, int, int, int]:
    """ggml_view_{2,3,4}d: the given strides, the rest follow the last (ggml.c ggml_view_2d/3d)."""
    out = [esize, *nb]
    while len(out) < 4:
        out.append(out[-1] * ne[len(out) - 1])
    return (out[0], out[1], out[2], out[3])


@dataclass
class Graph:
    """Tensors as a builder makes them, and the node/leaf order its expansions give."""

    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    _seen: set[int] = field(default_factory=set)

    # --- tensors -----------------------------------------------------------------------------------------
    @staticmethod
    def new(shape: Sequence[int], esize: int = F32, *, op: str = "none", src: Sequence[Tensor] = ()) -> Tensor:
        ne = _ne(shape)
        return Tensor(ne, _strides(ne, esize), esize, op, tuple(src))

    @staticmethod
    def weight(shape: Sequence[int], name: str = "") -> Tensor:
        """A model weight; ``name`` (its GGUF name in the layer) tells ``Where`` which tensor it is."""
        t = Graph.new(shape)
        t.external = t.weight = True
        _placed_as(t, name)
        where = _WHERE.get()
        sizes = where.size(_LAYER.get(), name) if where is not None and where.size is not None else None
        if sizes is not None:
            t.size, t.padded = sizes
        return t

    @staticmethod
    def cache(shape: Sequence[int], esize: int = F32, name: str = "cache") -> Tensor:
        """A layer's K or V cache (sized elsewhere; ``name``: where ``Where`` finds it, a layer's own "cache")."""
        t = Graph.new(shape, esize)
        t.external = True
        _placed_as(t, name)
        return t

    @staticmethod
    def input(shape: Sequence[int], esize: int = F32) -> Tensor:
        t = Graph.new(shape, esize)
        t.is_input = True
        return t

    @staticmethod
    def op(op: str, shape: Sequence[int], *src: Tensor, esize: int = F32) -> Tensor:
        return Graph.new(shape, esize, op=op, src=src)

    @staticmethod
    def like(op: str, a: Tensor, *src: Tensor) -> Tensor:
        """``ggml_dup_tensor(a)`` as the result of ``op``: a's shape, contiguous."""
        return Graph.new(a.ne, a.esize, op=op, src=(a, *src))

    @staticmethod
    def view(
        a: Tensor,
        shape: Sequence[int],
        nb: Sequence[int] | None = None,
        *,
        op: str = "view",
        src: Sequence[Tensor] | None = None,
    ) -> Tensor:
        """A view of ``a`` (strides ``nb[1:]``, contiguous when not given); ``op``/``src`` for the ops
        whose result is a view of a source (``ggml_cpy``, ``ggml_set_rows``, ``*_inplace``)."""
        ne = _ne(shape)
        strides = _strides(ne, a.esize) if nb is None else _view_strides(ne, a.esize, nb)
        base = a.view_src or a
        srcs = (a,) if src is None else tuple(src)
        return Tensor(ne, strides, a.esize, op, srcs, view_src=base, external=base.external)

    @staticmethod
    def set_rows(dst: Tensor, rows: Tensor, ids: Tensor) -> Tensor:
        """``ggml_set_rows``: a view of ``dst`` whose sources are (rows, ids, dst) (ggml.c:4030-4032)."""
        return Graph.view(dst, dst.ne, op="set_rows", src=(rows, ids, dst))

    @staticmethod
    def reshape(a: Tensor, shape: Sequence[int]) -> Tensor:
        return Graph.view(a, shape, op="reshape")

    @staticmethod
    def transpose(a: Tensor) -> Tensor:
        ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
        nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
        base = a.view_src or a
        return Tensor(ne, nb, a.esize, "transpose", (a,), view_src=base, external=base.external)

    @staticmethod
    def mul_mat(w: Tensor, x: Tensor) -> Tensor:
        return Graph.op("mul_mat", (w.ne[1], x.ne[1], x.ne[2], x.ne[3]), w, x)

    @staticmethod
    def get_rows(a: Tensor, ids: Tensor) -> Tensor:
        return Graph.op("get_rows", (a.ne[0], ids.ne[0], ids.ne[1], ids.ne[2]), a, ids)

    # --- order -------------------------------------------------------------------------------------------
    def expand(self, t: Tensor) -> None:
        """``ggml_build_forward_expand``: depth first, sources left to right, a tensor after its sources."""
        seen = self._seen
        if id(t) in seen:
            return
        seen.add(id(t))
        for s in t.src:
            if id(s) not in seen:  # a source met before: no call to return from at once (most are)
                self.expand(s)
        (self.leafs if t.op == "none" else self.nodes).append(t)


class _Blocks:
    """One chunk of ``ggml_dyn_tallocr``: free blocks sorted by offset, the last one endless."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.free: list[list[int]] = []  # [offset, size]
        self.max_size = 0
        self.started = False

    def _align(self, size: int) -> int:
        a = self.alignment
        return (size + a - 1) // a * a

    def alloc(self, size: int) -> int:
        size = self._align(size)
        if not self.started:  # ggml_dyn_tallocr_new_chunk: one block as large as the buffer may be
            self.started = True
            self.free = [[0, 1 << 62]]
        free = self.free
        best = last = len(free) - 1
        best_size = -1
        for i in range(last):  # the best fit among the blocks before the endless last one
            bsize = free[i][1]
            if bsize >= size and (best_size < 0 or bsize <= best_size):
                best, best_size = i, bsize
        block = free[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del free[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def release(self, offset: int, size: int) -> None:
        size = self._align(size)
        free = self.free
        for i, block in enumerate(free):
            if block[0] + block[1] == offset:
                block[1] += size
                if i < len(free) - 1 and block[0] + block[1] == free[i + 1][0]:
                    block[1] += free[i + 1][1]
                    del free[i + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and free[i - 1][0] + free[i - 1][1] == block[0]:
                    free[i - 1][1] += block[1]
                    del free[i]
                return
        pos = 0
        while pos < len(free) and free[pos][0] < offset:
            pos += 1
        free.insert(pos, [offset, size])


@dataclass(slots=True)
class _State:
    children: int = 0
    views: int = 0
    allocated: bool = False
    offset: int = 0
    buffer: str = ""
    size: int = -1  # nbytes, once asked


def buffer_size(graph: Graph, alignment: int = 32) -> int:
    """The buffer ``ggml_gallocr_reserve`` sizes for ``graph`` on one backend (alignment: the buffer
    type's; 32 for the CPU, TENSOR_ALIGNMENT)."""
    return allocate(graph.leafs, graph.nodes, {"": alignment}).get("", 0)


def allocate(
    leafs: Sequence[Tensor],
    nodes: Sequence[Tensor],
    alignments: dict[str, int],
    *,
    leaf_buffers: Sequence[str] | None = None,
    node_buffers: Sequence[str] | None = None,
    srcs: dict[Tensor, tuple[Tensor, ...]] | None = None,
) -> dict[str, int]:
    """``ggml_gallocr_alloc_graph_impl`` over one buffer per backend (ggml-alloc.c:718-823): each leaf
    and node in its buffer (``*_buffers``, by position; the only buffer when not given), a source
    allocated with the buffer of the node that reads it. ``srcs``: sources that replace a node's own
    (the scheduler's copies). Returns each buffer's high-water mark."""
    only = next(iter(alignments))
    blocks = {name: _Blocks(a) for name, a in alignments.items()}
    node_srcs = [srcs.get(n, n.src) for n in nodes] if srcs else [n.src for n in nodes]
    state: dict[Tensor, _State] = {}  # tensors hash by identity (eq=False)
    for t in (*leafs, *nodes):
        state[t] = _State()
    for ss in node_srcs:
        for t in ss:
            if t not in state:
                state[t] = _State()

    def nbytes(t: Tensor, hn: _State) -> int:
        if hn.size < 0:
            hn.size = t.nbytes
        return hn.size

    def alloc(t: Tensor, buffer: str, srcs_t: Sequence[Tensor]) -> None:
        hn = state[t]
        if t.external or hn.allocated or t.view_src is not None:
            return
        hn.allocated = True
        if t.op in INPLACE_OPS:
            for parent in srcs_t:
                p = state[parent]
                # a view is never "own" (views are not allocated), so only plain parents are reused
                if not p.allocated or parent.is_output or not t.same_layout(parent):
                    continue
                if p.children == 1 and p.views == 0:
                    hn.offset, hn.buffer = p.offset, p.buffer
                    p.allocated = False
                    b = blocks[p.buffer]
                    extra = b._align(nbytes(parent, p)) - b._align(nbytes(t, hn))
                    if extra > 0:  # ggml_gallocr_free_extra_space
                        b.release(p.offset + b._align(nbytes(t, hn)), extra)
                    return
        hn.buffer = buffer
        hn.offset = blocks[buffer].alloc(nbytes(t, hn))

    def free(t: Tensor, hn: _State) -> None:
        if t.is_output:
            return
        blocks[hn.buffer].release(hn.offset, nbytes(t, hn))
        hn.allocated = False

    no_srcs: tuple[Tensor, ...] = ()
    for i, leaf in enumerate(leafs):
        if not (leaf.external or leaf.view_src is not None):  # alloc's early return, inlined (most are weights)
            alloc(leaf, leaf_buffers[i] if leaf_buffers else only, leaf.src)
    for i, node in enumerate(nodes):
        buffer = node_buffers[i] if node_buffers else only
        if node.view_src is not None and node.op != "none":
            state[node.view_src].views += 1
        if node.is_input:
            alloc(node, buffer, node_srcs[i])
        for s in node_srcs[i]:
            state[s].children += 1
            if s.is_input:
                alloc(s, buffer, no_srcs)
    for i, node in enumerate(nodes):
        buffer = node_buffers[i] if node_buffers else only
        ss = node_srcs[i]
        for parent in ss:
            # alloc's own early return, inlined: most sources are weights, caches or allocated already
            if not (parent.external or parent.view_src is not None or state[parent].allocated):
                alloc(parent, buffer, no_srcs)
        if not (node.external or node.view_src is not None):
            alloc(node, buffer, ss)
        for parent in ss:
            p = state[parent]
            p.children -= 1
            if p.children == 0 and p.views == 0:
                if parent.view_src is not None:
                    v = state[parent.view_src]
                    v.views -= 1
                    if v.views == 0 and v.children == 0 and v.allocated:
                        free(parent.view_src, v)
                elif p.allocated:
                    free(parent, p)
    return {name: b.max_size for name, b in blocks.items()}

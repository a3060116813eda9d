"""A replica of ggml_backend_sched for a graph over several backends, for the compute buffers.

When a model's layers (or some of their weights) sit on several backends, each backend logs its own
compute buffer: what ggml-alloc lays out in it for the nodes the scheduler gives that backend, plus the
copies of the inputs those nodes read from another backend. This module assigns the nodes of a graph
built by a replay builder (under ``galloc.placed``, which tags each weight and cache with its backend)
as ``ggml_backend_sched_split_graph`` does (ggml-backend.cpp:1206-1700), without pipeline parallelism:

1. a node goes where its memory is (a view of a cache: the cache's backend), a graph input to the CPU,
   a node reading a weight (not RoPE, not flash attention) to the weight's backend, or where llama.cpp
   pinned it (``Tensor.pinned``); with op offload a host weight's op may go to a GPU (``offload``);
2. the GPUs' assignments expand down and up over unassigned nodes (the CPU's do not), then every
   backend's down and up;
3. (no upgrades: no two backends here share a buffer type); 4. views follow their source, unassigned
   sources their node;
5. consecutive nodes of one backend form a split; a source on another backend is copied into the
   split's backend once per backend (``ggml_dup_tensor_layout``), the first split that reads it lists it
   as an input; a split also ends where a weight of another backend would be copied in.

The graph ggml-alloc then allocates (ggml-backend.cpp:1655-1700) is, per split, each input's
dependency (a view of it, so its source lives until the copy) and its copy, then the split's nodes; each
tensor in its backend's buffer (``galloc.allocate``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llamafit.memory.graph.galloc import Graph, Tensor, allocate

VIEW_OPS = frozenset({"view", "reshape", "transpose", "permute"})  # ggml_is_view_op
NO_WEIGHT_CHOICE = frozenset({"rope", "flash_attn_ext"})  # their small weights do not choose (1.wgt)


@dataclass
class _Split:
    backend: str
    start: int
    end: int = 0
    inputs: list[Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class Backends:
    """The backends a split graph is scheduled over: their names in the scheduler's order (the CPU last), each one's
    buffer alignment, the graph copies pipeline parallelism keeps (``n_copies``), and op offload (``offload(node,
    weight_backend)``: the GPU an op on a host weight goes to, or None)."""

    order: tuple[str, ...]
    alignments: Mapping[str, int]
    n_copies: int = 1
    offload: Callable[[Tensor, str], str | None] | None = None


def split_buffers(
    g: Graph,
    backends: Sequence[str],
    alignments: Mapping[str, int],
    offload: Callable[[Tensor, str], str | None] | None = None,
    n_copies: int = 1,
    pads_rows: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Each backend's compute buffer for ``g`` (its weights and caches tagged with ``backends``' names; the
    last is the CPU). ``offload(node, weight_backend)``: the GPU an op on a host weight goes to, or None.
    ``n_copies``: GGML_SCHED_MAX_COPIES with pipeline parallelism (every graph input and every split
    input then has that many copies, never freed: ggml-backend.cpp:1519-1525, 1551-1580, 1703-1730).
    ``pads_rows``: backends whose copy of a quantized weight takes its padded size (ggml-cuda)."""
    cpu = backends[-1]
    where = assign(g, backends, offload)

    # pass 5: splits and the copies of their inputs
    first = next((n for n in g.nodes if n.op not in VIEW_OPS), None)
    if first is None:
        return {}
    split = _Split(where[first], 0)
    splits = [split]
    copies: dict[tuple[Tensor, str], list[Tensor]] = {}  # (source, backend) -> its copies; [0] is read
    srcs: dict[Tensor, tuple[Tensor, ...]] = {}
    for i, n in enumerate(g.nodes):
        if n.op in VIEW_OPS:
            continue
        b = where[n]
        src = n.src
        if b != split.backend or (
            split.inputs and any(s.weight and s.view_src is None and where.get(s, b) != b for s in src)
        ):
            split.end = i
            split = _Split(b, i)
            splits.append(split)
        new: list[Tensor] | None = None  # the sources, with copies for those on another backend
        for j, s in enumerate(src):
            if where.get(s, b) == b:
                continue
            if (s, b) not in copies:
                # ggml_dup_tensor_layout: op none, memory of its own; with several copies, inputs and
                # outputs (allocated first, never freed); the current copy (0) is the one the node reads
                kept = n_copies > 1
                size = s.padded if b in pads_rows and s.padded is not None else s.size
                copies[s, b] = [
                    Tensor(s.ne, s.nb, s.esize, is_input=kept, is_output=kept, size=size) for _ in range(n_copies)
                ]
                split.inputs.append(s)
            if new is None:
                new = list(src)
            new[j] = copies[s, b][0]
        if new is not None:
            srcs[n] = tuple(new)
    split.end = len(g.nodes)

    # the graph copy ggml-alloc sees
    nodes: list[Tensor] = []
    buffers: list[str] = []
    for sp in splits:
        for inp in sp.inputs:
            dep = Tensor(inp.ne, inp.nb, inp.esize, src=(inp,), view_src=inp.view_src or inp)  # a view, op none
            nodes += [dep, copies[inp, sp.backend][0]]
            buffers += [where[inp], sp.backend]
        for n in g.nodes[sp.start : sp.end]:
            nodes.append(n)
            buffers.append(where[n])
    leafs: list[Tensor] = []
    leaf_buffers: list[str] = []
    marked: list[Tensor] = []  # inputs made outputs for this replay: the graph is shared by other replays
    if n_copies > 1:
        # pass 6: every graph input in n_copies copies (the current one is the input itself), then every
        # split input's copies, all allocated first as leafs
        for t in g.leafs:
            if t.is_input:
                if not t.is_output:
                    marked.append(t)
                t.is_output = True
                b = where.get(t, cpu)
                leafs += [t, *(Tensor(t.ne, t.nb, t.esize, is_input=True, is_output=True) for _ in range(n_copies - 1))]
                leaf_buffers += [b] * n_copies
        for sp in splits:
            for inp in sp.inputs:
                leafs += copies[inp, sp.backend]
                leaf_buffers += [sp.backend] * n_copies
    leafs += g.leafs
    leaf_buffers += [where.get(t, cpu) for t in g.leafs]
    aligns = {b: alignments.get(b, 32) for b in backends}
    try:
        return allocate(leafs, nodes, aligns, leaf_buffers=leaf_buffers, node_buffers=buffers, srcs=srcs)
    finally:
        for t in marked:
            t.is_output = False


def assign(
    g: Graph, backends: Sequence[str], offload: Callable[[Tensor, str], str | None] | None = None
) -> dict[Tensor, str]:
    """Passes 1-4 of ggml_backend_sched_split_graph: the backend of every node, view and source of ``g``."""
    cpu = backends[-1]
    where: dict[Tensor, str] = {}  # tensors hash by identity (eq=False)

    def from_cur(t: Tensor) -> str | None:
        base = t.view_src or t
        if base.external and base.backend is not None:
            return base.backend  # 1.dst / 1.vsrc: pre-allocated memory
        if t.is_input:
            return cpu  # 1.inp
        if t.op in NO_WEIGHT_CHOICE:
            return None
        for s in t.src:
            if s.weight and s.view_src is None and s.backend is not None:
                if offload is not None and s.backend == cpu:
                    off = offload(t, s.backend)
                    if off is not None:
                        return off  # 1.off
                return s.backend  # 1.wgt
        return None

    # pass 1
    for t in (*g.leafs, *g.nodes):
        b = t.pinned or from_cur(t)
        if b is not None:
            where[t] = b
    # pass 2: expand the GPUs down and up (the CPU's assignments stop an expansion), then every backend
    ops = [n for n in g.nodes if n.op not in VIEW_OPS]
    for order, skip_cpu in ((ops, True), (ops[::-1], True), (ops, False), (ops[::-1], False)):
        cur: str | None = None
        for n in order:
            b = where.get(n)
            if b is not None:
                cur = None if skip_cpu and b == cpu else b
            elif cur is not None:
                where[n] = cur
    # pass 3: the unassigned (none here once a graph has one assigned node): the backend most sources are on
    for n in ops:
        if n not in where:
            counts = {b: sum(1 for s in n.src if (where.get(s) or where.get(s.view_src or s)) == b) for b in backends}
            where[n] = max(backends, key=lambda b: counts[b])  # the first of the best, like the C loop
    # pass 4: views follow their source, sources their node
    for n in g.nodes:
        if n.view_src is not None and n not in where:
            b = where.get(n.view_src)
            if b is not None:
                where[n] = b
        for s in n.src:
            if s not in where:
                b = where.get(s.view_src) if s.view_src is not None else where.get(n)
                if b is not None:
                    where[s] = b
        if n not in where:
            where[n] = backends[0]

    return where


def attention_stays(
    g: Graph, backends: Sequence[str], offload: Callable[[Tensor, str], str | None] | None = None
) -> bool:
    """resolve_fused_ops' flash-attention probe (llama-context.cpp:509-562) on its one-token-per-sequence
    graph ``g``: flash attention stays on when the scheduler puts every layer's attention on the layer's
    device (``galloc.of_layer``'s mark; unmarked, the device of the cache it reads: a layer reading an earlier
    layer's cache on another device keeps it, Gemma 4). A layer on the host whose attention is followed in the
    graph by a node of a device (Nemotron-H's or LFM2's next recurrent layer gathering its states there) has its
    attention expanded up onto that device: "auto" is then resolved off."""
    where = assign(g, backends, offload)
    for n in g.nodes:
        if n.op == "flash_attn_ext":
            cache = n.src[1].view_src or n.src[1]
            layer = n.backend if n.tag is not None else cache.backend
            if layer is not None and where.get(n) != layer:
                return False
    return True

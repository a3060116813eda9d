"""The ggml-alloc replica (llamafit.memory.graph.galloc) on small graphs whose layout can be worked by hand."""

from __future__ import annotations

from llamafit.memory.graph.galloc import F32, Graph, Tensor, Where, buffer_size, placed
from llamafit.memory.graph.sched import split_buffers

MiB = 1 << 20


def _f32(n_mib: int) -> tuple[int]:
    return (n_mib * MiB // F32,)


def test_a_chain_of_in_place_ops_takes_one_tensor() -> None:
    """add, mul and the unary ops reuse a parent used by nobody else (ggml-alloc.c:633-680)."""
    g = Graph()
    x = Graph.op("mul_mat", _f32(4), Graph.weight((8, 8)), Graph.input((8,)))
    y = Graph.like("unary", Graph.like("mul", Graph.like("add", x, Graph.weight(_f32(4))), Graph.weight(_f32(4))))
    g.expand(y)
    assert buffer_size(g) == 4 * MiB + 32  # the 8-float input stays below


def test_a_parent_with_another_child_is_not_overwritten() -> None:
    g = Graph()
    x = Graph.op("mul_mat", _f32(4), Graph.weight((8, 8)), Graph.weight((8,)))
    a = Graph.like("unary", x)  # x still has a child: no reuse
    b = Graph.like("add", a, x)  # a is reused; x freed after
    g.expand(b)
    assert buffer_size(g) == 8 * MiB


def test_a_view_keeps_its_source_alive_and_is_never_reused() -> None:
    g = Graph()
    x = Graph.op("mul_mat", _f32(4), Graph.weight((8, 8)), Graph.weight((8,)))
    v = Graph.view(x, _f32(2))
    y = Graph.like("unary", v)  # a view parent is not "own": a new tensor [4, 6) (ggml-alloc.c:640-644)
    z = Graph.op("mul_mat", _f32(1), Graph.weight((8, 8)), y)  # x freed with its last view: z takes [0, 1)
    g.expand(z)
    assert buffer_size(g) == (4 + 2) * MiB


def test_best_fit_takes_the_smallest_hole_and_the_end_grows() -> None:
    """Free blocks other than the last are searched for the best fit; without one the tensor goes to the
    end of the buffer, which grows; freed bytes merge with their neighbours (ggml-alloc.c:202-350)."""
    w = Graph.weight((8, 8))
    g = Graph()
    a = Graph.op("mul_mat", _f32(3), w, Graph.weight((8,)))  # [0, 3)
    keep = Graph.op("mul_mat", _f32(1), w, a)  # [3, 4); a freed: hole [0, 3)
    b = Graph.op("mul_mat", _f32(2), w, keep)  # into the hole: [0, 2); keep freed: [2, end) is one block
    c = Graph.op("mul_mat", _f32(5), w, b)  # nothing but the end: [2, 7)
    g.expand(c)
    assert buffer_size(g) == 7 * MiB


def test_the_smallest_fitting_hole_wins_over_a_larger_one() -> None:
    w = Graph.weight((8, 8))
    x = Graph.weight((8,))

    def out(n: int) -> Tensor:
        t = Graph.op("mul_mat", _f32(n), w, x)
        t.is_output = True  # never freed: a wall between holes
        return t

    p = Graph.op("mul_mat", _f32(2), w, x)  # [0, 2)
    o1 = out(1)  # [2, 3)
    q = Graph.op("mul_mat", _f32(3), w, x)  # [3, 6)
    o2 = out(1)  # [6, 7)
    r = Graph.op("concat", _f32(1), p, o1, q, o2)  # [7, 8); then p and q freed: holes of 2 and 3 MiB
    t = Graph.op("mul_mat", _f32(2), w, r)  # the 2 MiB hole, not the first large enough
    u = Graph.op("mul_mat", _f32(3), w, t)  # the 3 MiB hole is still there
    g = Graph()
    g.expand(u)
    assert buffer_size(g) == 8 * MiB


def test_outputs_are_neither_freed_nor_reused() -> None:
    w = Graph.weight((8, 8))
    g = Graph()
    a = Graph.op("mul_mat", _f32(2), w, Graph.weight((8,)))
    a.is_output = True
    b = Graph.like("unary", a)  # may not take an output's memory
    c = Graph.op("mul_mat", _f32(2), w, b)  # a is not freed: b's hole only
    g.expand(c)
    assert buffer_size(g) == 6 * MiB


def _placed_graph(w_dev: dict[str, str]) -> Graph:
    """input -> mul_mat(w1) -> unary -> mul_mat(w2) -> add(residual): the weights on the backends given."""
    g = Graph()
    with placed(Where(lambda layer, name: w_dev[name])):
        x = Graph.input(_f32(1))
        a = Graph.op("mul_mat", _f32(2), Graph.weight((8, 8), "w1"), x)
        b = Graph.like("unary", a)
        c = Graph.op("mul_mat", _f32(4), Graph.weight((8, 8), "w2"), b)
        g.expand(Graph.op("add", _f32(4), c, Graph.op("mul_mat", _f32(4), Graph.weight((8, 8), "w3"), x)))
    return g


def test_the_scheduler_copies_what_a_split_reads_from_another_backend() -> None:
    """w1 and w3 on GPU0, w2 on GPU1. Pass 2 expands GPU0 down over the unary and GPU0 (after w3's matmul)
    over the add: three splits, GPU0 [mul_mat, unary] reading a copy of the CPU's input, GPU1 [mul_mat]
    reading a copy of the unary's result, GPU0 [mul_mat, add] reading a copy of GPU1's result (the input's
    copy on GPU0 is made once). GPU0: input copy [0,1), mul_mat [1,3) (the unary in place), freed once
    copied; GPU1's result's copy [1,5), w3's matmul [5,9), the add in place (ggml-backend.cpp:1206-1700)."""
    g = _placed_graph({"w1": "GPU0", "w2": "GPU1", "w3": "GPU0"})
    sizes = split_buffers(g, ["GPU0", "GPU1", "CPU"], {})
    assert sizes == {"GPU0": 9 * MiB, "GPU1": (2 + 4) * MiB, "CPU": MiB}


def test_with_pipeline_parallelism_every_copy_is_kept_four_times() -> None:
    """Four copies of every graph input and every split input, allocated first and never freed (nor
    reused in place): GPU0 holds 4 x 1 + 4 x 4 MiB of copies, then the matmuls (the add in place of w3's,
    not of the copy it reads)."""
    g = _placed_graph({"w1": "GPU0", "w2": "GPU1", "w3": "GPU0"})
    sizes = split_buffers(g, ["GPU0", "GPU1", "CPU"], {}, n_copies=4)
    assert sizes == {"GPU0": (4 + 16 + 4) * MiB, "GPU1": (4 * 2 + 4) * MiB, "CPU": 4 * MiB}


def test_the_cpu_does_not_pull_gpu_work_and_op_offload_moves_host_weight_ops() -> None:
    """w1 on the CPU: its matmul is the CPU's, the unary after it goes to GPU1 (expanded up from w2's
    matmul, a CPU node stops the expansion down); with op offload the matmul moves to the first GPU and
    the weight is copied there in its own size."""
    g = _placed_graph({"w1": "CPU", "w2": "GPU1", "w3": "GPU1"})
    plain = split_buffers(g, ["GPU0", "GPU1", "CPU"], {})
    assert "GPU0" not in plain or plain["GPU0"] == 0
    assert plain["CPU"] == (1 + 2) * MiB  # the input and the matmul's result
    g = _placed_graph({"w1": "CPU", "w2": "GPU1", "w3": "GPU1"})
    w1 = next(s for n in g.nodes for s in n.src if s.weight and s.backend == "CPU")
    w1.size = 3 * MiB
    off = split_buffers(g, ["GPU0", "GPU1", "CPU"], {}, offload=lambda node, wb: "GPU0")
    assert off["GPU0"] == (1 + 3 + 2) * MiB  # the input's copy, the weight's copy, the result

"""The ggml-alloc replica (llamafit.memory.galloc) on small graphs whose layout can be worked by hand."""

from __future__ import annotations

from llamafit.memory.galloc import F32, Graph, Tensor, buffer_size

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

"""Layer counts per GPU for a run of layers, back to front (the order llama.cpp assigns them)."""

from __future__ import annotations

from collections.abc import Sequence


def split_greedy(cost: Sequence[int], budgets: Sequence[int]) -> list[int] | None:
    """Layers back to front, each card filled to its budget before the previous one gets any (the
    order llama.cpp's fit uses, common/fit.cpp:647-729): the most that fits, when room is tight."""
    counts = [0] * len(budgets)
    il = len(cost) - 1
    for d in range(len(budgets) - 1, -1, -1):
        used = 0
        while il >= 0 and (d == 0 or used + cost[il] <= budgets[d]):
            used += cost[il]
            counts[d] += 1
            il -= 1
        if d == 0 and used > budgets[d]:
            return None
    return counts if il < 0 else None


def split_balanced(cost: Sequence[int], budgets: Sequence[int]) -> list[int] | None:
    """Layers in proportion to each card's budget, so every card keeps the same share of headroom
    (and a card is not filled to the brim while another idles); None when that does not fit."""
    room = [max(b, 0) for b in budgets]
    total_room, total_cost = sum(room), sum(cost)
    if total_room <= 0 or total_cost > total_room:
        return None
    counts = [0] * len(budgets)
    il = len(cost) - 1
    for d in range(len(budgets) - 1, -1, -1):
        share = total_cost * room[d] / total_room
        used = 0
        while il >= 0 and (d == 0 or used + cost[il] / 2 <= share):
            used += cost[il]
            counts[d] += 1
            il -= 1
        if used > 0 and used > budgets[d]:
            return None
    return counts


def split_fastest(cost: Sequence[int], budgets: Sequence[int], order: Sequence[int]) -> list[int] | None:
    """As many layers as each card holds, the fastest card (``order``: card indices, fastest first) filled
    first: generation streams each card's layers at that card's speed, so the fastest should hold the most.
    The cards take their counts in device order (llama.cpp gives each a contiguous run); None when the
    layers do not fit."""
    per = max(cost) if cost else 0
    counts = [0] * len(budgets)
    left = len(cost)
    for d in order:
        n = min(left, max(0, budgets[d]) // per) if per else left
        counts[d] = int(n)
        left -= int(n)
    if left:
        return None
    # the split must hold the layers it really gets (layer costs differ): check in device order, back to front
    il = len(cost)
    for d in range(len(budgets) - 1, -1, -1):
        used = sum(cost[il - counts[d] : il])
        il -= counts[d]
        if used > budgets[d]:
            return None
    return counts

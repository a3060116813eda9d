"""-sm tensor and -sm row in the speed model (llamafit.speed.parallel): the cards work at once and exchange
activations, where -sm layer runs them one after another."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llamafit.devices.described import described_gpus
from llamafit.devices.machine import Host, Machine
from llamafit.devices.rates import Rates
from llamafit.fit import make_plan
from llamafit.fit.plan import Plan
from llamafit.fit.request import build_request
from llamafit.fit.speed import priced
from llamafit.gguf.model import ModelInfo
from llamafit.memory.placement import CPU
from llamafit.server.args import parse_server_args
from llamafit.speed import priors
from llamafit.speed.known import host_rates, known_rates
from llamafit.speed.parallel import reduce_steps
from llamafit.speed.prediction import Speed
from llamafit.units import GiB


def test_the_butterfly_takes_a_step_per_halving_and_two_for_the_excess() -> None:
    # ggml-backend-meta.cpp:2386-2440: fold the excess over the largest power of two in, reduce, copy it back
    assert [reduce_steps(n) for n in range(1, 10)] == [0, 1, 3, 2, 4, 4, 4, 3, 5]


def _plan(model: ModelInfo, cards: list[str], mode: str) -> tuple[Plan, dict[str, Rates]]:
    machine = Machine(tuple(described_gpus(cards)), Host(total=256 * GiB, available=240 * GiB))
    plan = make_plan(model, machine, build_request(parse_server_args(["-c", "4096", "-sm", mode])))
    rates: dict[str, Rates] = {g.id: r for g in machine.gpus if (r := known_rates(g)) is not None}
    rates[CPU] = host_rates(80e9)
    return plan, rates


def _speed(model: ModelInfo, cards: list[str], mode: str, **change: float) -> Speed:
    plan, rates = _plan(model, cards, mode)
    return priced(plan, {d: replace(r, **change) if d != CPU else r for d, r in rates.items()}).speed  # type: ignore[arg-type,return-value]


def test_tensor_parallel_cards_stream_their_slice_at_once(l8b: ModelInfo) -> None:
    layer = _speed(l8b, ["rtx-4090", "rtx-4090"], "layer")
    tensor = _speed(l8b, ["rtx-4090", "rtx-4090"], "tensor")
    free = _speed(l8b, ["rtx-4090", "rtx-4090"], "tensor", reduce=0.0, split=0.0, link=1e15)
    assert layer.tg and tensor.tg and free.tg
    # without the exchanges' cost the two cards stream half the weights each: close to twice the layer split's
    assert 1.6 < free.tg / layer.tg < 2.05
    # each card's slice is half the bytes the layer split gave each card on average, with every node
    by = {d.device: d for d in tensor.devices}
    assert by["CUDA0"].bytes_per_token == pytest.approx(by["CUDA1"].bytes_per_token, rel=0.1)
    # two reductions a layer at one step each: the exchanges cost what the prior says
    unsynced = _speed(l8b, ["rtx-4090", "rtx-4090"], "tensor", reduce=0.0, split=0.0)
    assert unsynced.tg
    assert 1 / tensor.tg - 1 / unsynced.tg == pytest.approx(2 * l8b.hparams.n_layer * priors.REDUCE, rel=0.05)
    assert tensor.splits <= layer.splits


def test_more_cards_cost_more_exchange_steps(l8b: ModelInfo) -> None:
    two = _speed(l8b, ["rtx-4090"] * 2, "tensor", read=1e18, node=0.0)
    three = _speed(l8b, ["rtx-4090"] * 3, "tensor", read=1e18, node=0.0)
    four = _speed(l8b, ["rtx-4090"] * 4, "tensor", read=1e18, node=0.0)
    assert two.tg and three.tg and four.tg
    # with free streaming the exchanges are all that is left: 1, 3 and 2 steps
    assert two.tg > four.tg > three.tg


def test_an_moe_with_little_to_stream_loses_to_the_exchanges(moe: ModelInfo, l8b: ModelInfo) -> None:
    # a tensor split pays per layer what it saves per byte: on cards slow to stream (P40-like, 300 GB/s) a dense
    # 8B's decode gets faster, an MoE that streams a small share of its weights slower
    for model, faster in ((l8b, True), (moe, False)):
        layer = _speed(model, ["rtx-4090", "rtx-4090"], "layer", read=3e11)
        tensor = _speed(model, ["rtx-4090", "rtx-4090"], "tensor", read=3e11)
        assert layer.tg and tensor.tg
        assert (tensor.tg > layer.tg) == faster, (model.path, layer.tg, tensor.tg)


def test_a_row_split_synchronises_every_matmul(l8b: ModelInfo) -> None:
    layer = _speed(l8b, ["rtx-4090", "rtx-4090"], "layer")
    row = _speed(l8b, ["rtx-4090", "rtx-4090"], "row")
    free = _speed(l8b, ["rtx-4090", "rtx-4090"], "row", reduce=0.0, split=0.0, link=1e15)
    assert layer.tg and row.tg and free.tg
    # the matmuls stream at once: faster than a layer split without the synchronisations, slower with them
    assert free.tg > layer.tg > row.tg


def test_one_card_is_the_same_in_every_mode(l8b: ModelInfo) -> None:
    speeds = {m: _speed(l8b, ["rtx-4090"], m) for m in ("layer", "tensor", "row")}
    assert speeds["tensor"].tg == speeds["layer"].tg == speeds["row"].tg


def test_a_measured_card_takes_the_reduction_prior() -> None:
    measured = Rates(read=900e9, source="measured")
    prior = known_rates(described_gpus(["rtx-4090"])[0])
    assert prior is not None and prior.reduce == priors.REDUCE
    assert priors.fill(measured, prior).reduce == priors.REDUCE
    assert priors.fill(replace(measured, reduce=1e-5), prior).reduce == 1e-5


def test_a_row_split_says_its_memory_is_a_layer_splits(l8b: ModelInfo) -> None:
    # a tensor split of a model whose split rules are modelled has its own memory (tests/test_tensor_split.py)
    for cards, mode, warned in ((2, "tensor", False), (2, "row", True), (1, "row", False), (2, "layer", False)):
        plan, _ = _plan(l8b, ["rtx-4090"] * cards, mode)
        said = [w for w in plan.warnings if w.startswith(f"-sm {mode}: memory is planned as a layer split")]
        assert bool(said) == warned, (cards, mode, plan.warnings)

"""Fit decisions on described device sets: one card, two unequal cards, a busy card, no GPU."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llamafit.devices.machine import Device, Host, Machine
from llamafit.errors import DoesNotFitError, UsageError
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.memory.placement import PARTIAL_EXPS_REGEX, Override, experts_on_cpu, whole_expert_layers
from llamafit.server.args import compose, parse_server_args
from llamafit.speculative import SpecOptions
from llamafit.units import GiB, MiB
from tests import factory


@pytest.fixture(scope="module")
def l8b(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    return load_model(factory.llama31_8b().write(tmp_path_factory.mktemp("m") / "llama31-8b.gguf"))


@pytest.fixture(scope="module")
def moe30(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    """Qwen3-30B-A3B's published shape: 48 layers, 128 experts (8 used) of 768, 2048 embd, Q4_K."""
    shape = factory.moe(name="Qwen3-30B-A3B (shape)", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4,
                        head_dim=128, n_expert=128, n_expert_used=8, n_ff_exp=768, n_vocab=151936,
                        ctx=40960, w="q4_K")  # fmt: skip
    return load_model(shape.write(tmp_path_factory.mktemp("m") / "qwen3-30b-a3b.gguf"))


gpu = factory.gpu


HOST = Host(total=128 * GiB, available=120 * GiB)


def plan(model: ModelInfo, gpus: list[Device], args: list[str] = (), prefer: str = "balanced", **kw: object):  # type: ignore[no-untyped-def,assignment]
    req = build_request(parse_server_args(list(args)), **kw)  # type: ignore[arg-type]
    return make_plan(model, Machine(tuple(gpus), HOST), req, SpecOptions(mode="off", prefer=prefer))


def past_the_margin(model: ModelInfo, gpus: list[Device], args: list[str], device: str | None = None) -> bool:
    """A user's placement and context past what the plan allows: refused when it does not fit the memory
    itself, else planned with the warning that it leaves less than the margin (on ``device``)."""
    try:
        p = plan(model, gpus, args)
    except DoesNotFitError as e:
        return device is None or f"{device} needs" in e.message
    said = [w for w in p.warnings if "not the margins" in w]
    return bool(said) and (device is None or f"{device} keeps" in said[0])


def test_one_big_card_gets_the_training_context(l8b: ModelInfo) -> None:
    p = plan(l8b, [gpu(0, 24)])
    assert p.fits and p.n_ctx == 131072
    assert p.decision("context.train") and p.decision("placement.all_gpu")
    assert p.devices[0].layers == 33
    argv = compose("llama-server", p.planned, parse_server_args([]))
    assert argv == ["llama-server", "-m", l8b.path, "-c", "131072", "-ngl", "all", "-fit", "off"]


def test_a_smaller_card_cuts_the_context_to_what_fits(l8b: ModelInfo) -> None:
    p = plan(l8b, [gpu(0, 12)])
    assert p.fits and 4096 <= p.n_ctx < 131072 and p.n_ctx % 256 == 0
    assert p.decision("context.reduced")
    dev = p.devices[0]
    assert dev.use.total <= dev.usable
    # the next context step would not fit with every layer on the card: the search found the largest
    bigger = plan(l8b, [gpu(0, 12)], ["-c", str(p.n_ctx + 256)], margin=1024 * MiB)
    assert bigger.decision("placement.partial") and not bigger.decision("placement.all_gpu")
    assert bigger.settings.n_gpu_layers < l8b.hparams.n_layer_all + 1


def test_the_margin_is_left_free(l8b: ModelInfo) -> None:
    a = plan(l8b, [gpu(0, 12)], margin=512 * MiB)
    b = plan(l8b, [gpu(0, 12)], margin=2048 * MiB)
    assert a.n_ctx > b.n_ctx
    assert b.devices[0].use.total <= 10 * GiB


def test_a_busy_card_is_planned_on_its_free_memory(l8b: ModelInfo) -> None:
    idle = plan(l8b, [gpu(0, 24)])
    busy = plan(l8b, [gpu(0, 24, free_gib=10)])
    assert busy.n_ctx < idle.n_ctx
    assert busy.devices[0].usable == 9 * GiB


def test_two_unequal_cards_are_checked_card_by_card(l8b: ModelInfo) -> None:
    p = plan(l8b, [gpu(0, 16), gpu(1, 6)], prefer="speed")  # every layer on the cards, the context cut
    assert p.fits
    for d in p.devices:
        assert d.use.total <= d.usable, d.device.id
    assert p.devices[0].layers > p.devices[1].layers
    assert sum(d.layers for d in p.devices) == 33
    argv = compose("llama-server", p.planned, parse_server_args([]))
    ts = argv[argv.index("-ts") + 1].split(",")
    assert [int(x) for x in ts] == [d.layers for d in p.devices]


def test_the_pooled_sum_is_not_enough(l8b: ModelInfo) -> None:
    """Two 5 GiB cards pool to 10 GiB, but each must hold its share plus its own overhead."""
    pair = plan(l8b, [gpu(0, 5), gpu(1, 5)], prefer="speed")
    single = plan(l8b, [gpu(0, 10)], prefer="speed")
    assert pair.fits
    assert all(d.use.overhead > 0 for d in pair.devices)  # each card pays its runtime overhead
    assert pair.decision("placement.all_gpu") and single.decision("placement.all_gpu")
    assert pair.n_ctx < single.n_ctx  # the second card's overhead and compute buffer cost context


def test_no_gpu_plans_for_host_memory(l8b: ModelInfo) -> None:
    p = plan(l8b, [])
    assert p.fits and p.devices == ()
    assert p.decision("placement.cpu")
    assert p.host.use.model > 4 * GiB
    argv = compose("llama-server", p.planned, parse_server_args([]))
    assert "-ngl" not in argv


def test_cpu_only_on_a_gpu_machine_says_dev_none(l8b: ModelInfo) -> None:
    m = Machine((gpu(0, 24),), HOST)
    p = make_plan(l8b, m, build_request(parse_server_args([]), cpu_only=True))
    argv = compose("llama-server", p.planned, parse_server_args([]))
    assert argv[argv.index("-dev") + 1] == "none"


def test_weights_too_big_moe_experts_go_to_cpu_first(moe30: ModelInfo) -> None:
    p = plan(moe30, [gpu(0, 12)], prefer="speed")  # the fewest experts on the CPU, the context they leave
    assert p.fits
    d = p.decision("placement.cpu_moe")
    assert d is not None
    argv = compose("llama-server", p.planned, parse_server_args([]))
    k = int(argv[argv.index("--n-cpu-moe") + 1])
    assert 0 < k <= 48
    assert p.n_ctx >= 4096  # the slack left by a whole expert layer goes to the context
    # one expert layer fewer on the CPU would not fit the margin: pinned by the user, it is refused when it does
    # not fit the card at all, else planned with a warning of what is left (llama-server would load it)
    try:
        tighter = plan(moe30, [gpu(0, 12)], ["-c", "4096", "--n-cpu-moe", str(k - 1)])
    except DoesNotFitError:
        return
    assert any("not the margins" in w for w in tighter.warnings)


def test_dense_too_big_goes_partial(l8b: ModelInfo) -> None:
    p = plan(l8b, [gpu(0, 4)])
    assert p.fits and p.decision("placement.partial")
    ngl = p.settings.n_gpu_layers
    assert 0 < ngl < 33
    assert p.devices[0].layers == ngl


def test_user_context_is_a_hard_requirement(l8b: ModelInfo) -> None:
    p = plan(l8b, [gpu(0, 12)], ["-c", "65536"])
    assert p.n_ctx == 65536
    assert p.decision("context.user")
    assert p.decision("placement.partial")  # layers move to the CPU, the context stays
    full = plan(l8b, [gpu(0, 24)], ["-c", "0"])
    assert full.n_ctx == 131072


def test_user_pinned_ngl_is_kept(l8b: ModelInfo) -> None:
    p = plan(l8b, [gpu(0, 24)], ["-ngl", "20"])
    assert p.settings.n_gpu_layers == 20 and p.devices[0].layers == 20
    assert p.decision("placement.user")
    argv = compose("llama-server", p.planned, parse_server_args(["-ngl", "20"]))
    assert argv.count("-ngl") == 1 and argv[argv.index("-ngl") + 1] == "20"


def test_user_flags_change_the_prediction(l8b: ModelInfo) -> None:
    f16 = plan(l8b, [gpu(0, 12)])
    q8 = plan(l8b, [gpu(0, 12)], ["-ctk", "q8_0", "-ctv", "q8_0"])
    assert q8.n_ctx > f16.n_ctx
    one = plan(l8b, [gpu(0, 12)], ["-np", "1"])
    assert one.footprint.context.n_seq_max == 1


def test_refuses_with_the_numbers(l8b: ModelInfo) -> None:
    small_host = Machine((gpu(0, 2),), Host(total=4 * GiB, available=3 * GiB))
    with pytest.raises(DoesNotFitError, match=r"GPU CUDA0 needs .* usable; offloaded to the CPU it needs .* host RAM"):
        make_plan(l8b, small_host, build_request(parse_server_args([])))


def test_unknown_device_is_a_usage_error(l8b: ModelInfo) -> None:
    with pytest.raises(UsageError, match="CUDA7"):
        plan(l8b, [gpu(0, 24)], ["-dev", "CUDA7"])


def test_dev_subset_plans_on_the_named_card_only(l8b: ModelInfo, tmp_path: Path) -> None:
    p = plan(l8b, [gpu(0, 24), gpu(1, 24)], ["-dev", "CUDA1"])
    assert [d.device.id for d in p.devices] == ["CUDA1"]


def test_split_mode_none_plans_on_the_main_gpu_as_llama_cpp_picks_it(l8b: ModelInfo) -> None:
    # src/llama.cpp:288-300: -mg's device alone; below 0 no device at all; past the last one the load fails
    two = [gpu(0, 24), gpu(1, 24)]
    assert [d.device.id for d in plan(l8b, two, ["-sm", "none", "-mg", "1"]).devices] == ["CUDA1"]
    assert plan(l8b, two, ["-sm", "none", "-mg", "-1"]).devices == ()
    with pytest.raises(UsageError, match="refuse -mg 2 with -sm none: there are 2 devices"):
        plan(l8b, two, ["-sm", "none", "-mg", "2"])
    with pytest.raises(UsageError, match="AUTO"):
        plan(l8b, two, ["-ngl", "AUTO"])  # llama-server's std::stoi would stop on it


def test_margins_per_device(l8b: ModelInfo) -> None:
    from llamafit.fit.request import parse_margins

    assert parse_margins("2048") == (2048 * MiB, {})
    default, per = parse_margins("cuda1=4GiB,host=512")
    assert default == 1024 * MiB and per == {"CUDA1": 4 * GiB, "host": 512 * MiB}
    req = build_request(parse_server_args([]), margin=default, margins=per)
    p = make_plan(l8b, Machine((gpu(0, 24), gpu(1, 24)), HOST), req)
    usable = {d.device.id: d.usable for d in p.devices}
    assert usable == {"CUDA0": 23 * GiB, "CUDA1": 20 * GiB}
    assert p.host.usable == HOST.available - 512 * MiB


@pytest.mark.parametrize("min_ctx", [4096, 131072])
def test_several_small_cards_never_do_worse_than_one(l8b: ModelInfo, min_ctx: int) -> None:
    """One policy whatever the number of cards: the context first (never below what the host alone holds),
    then the most layers on the GPUs that context leaves room for; more cards of the same size never give
    less of either."""
    alone = plan(l8b, [], min_ctx=min_ctx, prefer="context")
    one = plan(l8b, [gpu(0, 2)], min_ctx=min_ctx, prefer="context")
    assert one.n_ctx >= alone.n_ctx
    for n in (2, 4, 8):
        many = plan(l8b, [gpu(i, 2) for i in range(n)], min_ctx=min_ctx, prefer="context")
        assert many.fits and many.n_ctx >= one.n_ctx
        if many.n_ctx == one.n_ctx:
            assert sum(d.layers for d in many.devices) >= sum(d.layers for d in one.devices)


def test_layers_on_small_cards_never_cut_the_context_the_host_holds(l8b: ModelInfo) -> None:
    """A 2 GiB card holds a layer only at a shorter context: the load runs without it, and says why."""
    for cards in ([gpu(0, 2)], [gpu(0, 2), gpu(1, 2)]):
        p = plan(l8b, cards, prefer="context")
        assert p.n_ctx == plan(l8b, []).n_ctx
        d = p.decision("placement.cpu") or p.decision("placement.context_first")
        assert d is not None and "The context is chosen first" in d.message


def test_more_devices_than_llama_cpp_splits_over(l8b: ModelInfo) -> None:
    p = plan(l8b, [gpu(i, 2) for i in range(20)])
    argv = compose("llama-server", p.planned, parse_server_args([]))
    assert len(argv[argv.index("-ts") + 1].split(",")) == 15
    assert argv[argv.index("-dev") + 1] == ",".join(f"CUDA{i}" for i in range(15))
    assert any("at most 15" in w for w in p.warnings)
    with pytest.raises(UsageError, match="at most 15"):
        plan(l8b, [gpu(i, 2) for i in range(20)], ["-dev", ",".join(f"CUDA{i}" for i in range(16))])


def test_a_partial_split_over_two_cards_is_as_full_as_the_estimate_allows(l8b: ModelInfo) -> None:
    """Two small cards that cannot hold the model: after packing, layers are added one at a time while
    the full estimate fits, so no card could take the next layer down (issue #14 part 3: never more
    weights left on the CPU than llama.cpp's fit, which measures each card's own compute)."""
    cards = [gpu(0, 3.0), gpu(1, 2.5)]
    p = plan(l8b, cards, ["-c", "8192", "-np", "1"])
    assert p.fits and p.decision("placement.partial")
    ngl = p.settings.n_gpu_layers
    split = [int(x) for x in p.settings.tensor_split]
    assert sum(split) == ngl and all(d.use.total <= d.usable for d in p.devices)
    for i in range(2):
        more = [c + (1 if j == i else 0) for j, c in enumerate(split)]
        ts = ",".join(str(c) for c in more)
        # card {i} could not take one more layer
        assert past_the_margin(l8b, cards, ["-c", "8192", "-np", "1", "-ngl", str(ngl + 1), "-ts", ts], f"CUDA{i}")


def test_expert_layers_come_back_to_the_gpus_while_the_estimate_fits(tmp_path: Path) -> None:
    """GLM-4.5-Air's layer dimensions on 10 + 4 GiB cards: after packing, one layer's experts at a time
    come back from the CPU (the split as packed or one layer moved between the cards) while the plan
    fits; packing alone kept the experts of 4 layers on the CPU (4.8 GiB), now 3 (3.3 GiB)."""
    shape = factory.glm4moe(name="GLM-4.5-Air layers, 8 deep (shape)", n_layer=8, n_nextn=1, n_embd=4096, n_head=96,
                            n_head_kv=8, head_dim=128, n_ff=10944, n_dense_lead=1, n_expert=128, n_expert_used=8,
                            n_ff_exp=1408, n_vocab=151552, ctx=131072, w="q4_K")  # fmt: skip
    air = load_model(shape.write(tmp_path / "air.gguf"))
    cards = [gpu(0, 10), gpu(1, 4)]
    p = plan(air, cards, ["-c", "8192", "-np", "1"])
    k, _ = whole_expert_layers(p.settings.overrides)
    assert p.fits and p.decision("placement.cpu_moe") and 0 < k < 4
    split = [int(x) for x in p.settings.tensor_split]
    tries = [split] + [
        [c + (1 if x == i else -1 if x == j else 0) for x, c in enumerate(split)]
        for i in range(2)
        for j in range(2)
        if i != j
    ]
    for ts in tries:
        # one more layer's experts on the GPUs does not fit
        assert past_the_margin(
            air,
            cards,
            ["-c", "8192", "-np", "1", "-ngl", "all", "-ts", ",".join(map(str, ts)), "--n-cpu-moe", str(k - 1)],
        )


def test_a_trial_refused_by_its_quick_price_does_not_fit_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Search.fits`` skips the split graph's replay where the buffers besides the compute already overflow a
    device: every trial it refuses so, and every one it prices, is what the exact price says (GLM-4.5-Air's
    layers over 10 + 4 GiB cards, whose expert search weighs trials on both sides of the budget)."""
    from llamafit.fit.search import Search, floor

    air = _air_layers(tmp_path)
    fits, seen = Search.fits, []

    def checked(self: Search, s, spec, like=None):  # type: ignore[no-untyped-def]
        got = fits(self, s, spec, like)
        exact = self.run(s, spec)
        quick = self.estimate(self.model, s, self.ids, exact_compute=False)
        for dev in self.ids:  # the floor is a floor on every device, whatever the compute's replay gives
            assert floor(quick.gpus[dev]) <= exact.fp.gpus[dev].total, (dev, quick.gpus[dev], exact.fp.gpus[dev])
        assert floor(quick.host) <= exact.fp.host.total
        seen.append((got is not None, exact.ok))
        return got

    monkeypatch.setattr(Search, "fits", checked)
    p = plan(air, [gpu(0, 10), gpu(1, 4)], ["-c", "8192", "-np", "1"])
    assert p.fits and seen
    assert all(quick == exact for quick, exact in seen), seen
    assert any(not quick for quick, _ in seen) and any(quick for quick, _ in seen)


def _air_layers(tmp_path: Path) -> ModelInfo:
    shape = factory.glm4moe(name="GLM-4.5-Air layers, 8 deep (shape)", n_layer=8, n_nextn=1, n_embd=4096, n_head=96,
                            n_head_kv=8, head_dim=128, n_ff=10944, n_dense_lead=1, n_expert=128, n_expert_used=8,
                            n_ff_exp=1408, n_vocab=151552, ctx=131072, w="q4_K")  # fmt: skip
    return load_model(shape.write(tmp_path / "air.gguf"))


def _replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the split graphs replayed through the scheduler (each once per model and placement)."""
    from llamafit.memory.graph import replay

    split, n = replay.split_buffers, [0]

    def counted(*a, **kw):  # type: ignore[no-untyped-def]
        n[0] += 1
        return split(*a, **kw)

    monkeypatch.setattr(replay, "split_buffers", counted)
    return n


@pytest.mark.parametrize(
    ("name", "cards", "args"),
    [
        ("air", (10, 4), ["-c", "8192", "-np", "1"]),
        ("air", (8, 8), ["-c", "8192"]),
        ("qwen3-8b", (4, 2), ["-c", "8192"]),
    ],
)
def test_a_walk_priced_by_its_gap_places_what_the_exact_walk_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, cards: tuple[int, int], args: list[str]
) -> None:
    """The walks that make a chosen placement fuller (experts back to the cards one layer, then one projection, at a
    time; one more layer on a card) price their steps quickly plus the gap the exact price showed at their start,
    and confirm the end: the placement the exact walk makes, with fewer split-graph replays where it walks."""
    from llamafit.fit.search import Search

    model = _air_layers(tmp_path) if name == "air" else load_model(factory.qwen3_8b().write(tmp_path / "q.gguf"))
    gpus = [gpu(0, cards[0]), gpu(1, cards[1])]
    n = _replays(monkeypatch)
    by_gap = compose("s", plan(model, gpus, args).planned, parse_server_args(args))
    replays = n[0]
    monkeypatch.setattr(Search, "with_gap", lambda self, t, spec: t)  # no gap: every step priced exactly
    model, n[0] = load_model(model.path), 0  # a model keeps its replays: a new one
    exact = compose("s", plan(model, gpus, args).planned, parse_server_args(args))
    assert by_gap == exact
    if "-ot" in exact:  # the walk went to parts of layers: each step of it was a replay
        assert replays < n[0], (replays, n[0])
    assert replays <= n[0], (replays, n[0])


def test_a_walk_whose_end_the_exact_price_refuses_is_walked_again_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gap that promises room the exact price does not give: the walk's end is refused when confirmed, and the
    walk is made again on exact prices (the plan fits, and is the exact walk's)."""
    from llamafit.fit.search import Search

    air = _air_layers(tmp_path)
    gpus, args = [gpu(0, 10), gpu(1, 4)], ["-c", "8192", "-np", "1"]
    exact_gap = Search.with_gap
    monkeypatch.setattr(Search, "with_gap", lambda self, t, spec: t)
    exact = plan(air, gpus, args)

    def promising(self: Search, t, spec):  # type: ignore[no-untyped-def]
        got = exact_gap(self, t, spec)
        return replace(got, gap={d: v - 4 * GiB for d, v in (got.gap or {}).items()})

    monkeypatch.setattr(Search, "with_gap", promising)
    confirmed, refused = Search.confirmed, []

    def seen(self: Search, t, spec):  # type: ignore[no-untyped-def]
        got = confirmed(self, t, spec)
        refused.append(got is None)
        return got

    monkeypatch.setattr(Search, "confirmed", seen)
    p = plan(air, gpus, args)
    assert any(refused) and p.fits and all(d.fits for d in p.devices)
    assert compose("s", p.planned, parse_server_args(args)) == compose("s", exact.planned, parse_server_args(args))


def _as_flags(overrides: tuple[Override, ...]) -> list[str]:
    whole, rest = whole_expert_layers(overrides)
    return ["--n-cpu-moe", str(whole)] + (["-ot", ",".join(f"{o.pattern}={o.buft}" for o in rest)] if rest else [])


def test_a_layer_whose_experts_do_not_fit_whole_goes_in_part(moe30: ModelInfo) -> None:
    """One card: after whole expert layers, the next layer's up projection (then up and gate) comes to
    the GPU where the layer does not fit whole, as llama.cpp's fit does (issue #14 part 3). The argv
    says so (``--n-cpu-moe`` plus ``-ot``), and the next step, priced as the user's flags, does not fit."""
    args = ["-c", "4096", "-np", "1"]
    p = plan(moe30, [gpu(0, 12)], args)
    assert p.fits
    argv = compose("llama-server", p.planned, parse_server_args([]))
    whole, rest = whole_expert_layers(p.settings.overrides)
    assert len(rest) == 1 and rest[0].buft == "CPU"
    part = PARTIAL_EXPS_REGEX.index(rest[0].pattern.removeprefix(rf"blk\.{whole}")) + 1
    assert argv[argv.index("--n-cpu-moe") + 1] == str(whole)
    assert argv[argv.index("-ot") + 1] == f"{rest[0].pattern}=CPU"
    d = p.decision("placement.cpu_moe")
    assert d is not None and f"layer {whole}'s" in d.message and "(-ot" in d.message
    # the flags as given by a user price the same load
    again = plan(moe30, [gpu(0, 12)], [*args, "-ngl", "all", *_as_flags(p.settings.overrides)])
    assert again.devices[0].use == p.devices[0].use
    # one projection more on the GPU does not fit
    nxt = experts_on_cpu(whole + 1, part + 1) if part < len(PARTIAL_EXPS_REGEX) else experts_on_cpu(whole)
    assert past_the_margin(moe30, [gpu(0, 12)], [*args, "-ngl", "all", *_as_flags(nxt)])
    # and it is more on the GPU than whole layers alone
    fewer = plan(moe30, [gpu(0, 12)], [*args, "-ngl", "all", *_as_flags(experts_on_cpu(whole + 1))])
    assert p.devices[0].use.model > fewer.devices[0].use.model


def test_a_cards_last_expert_layer_spills_to_the_next_card(moe30: ModelInfo) -> None:
    """Several cards: where a card has room a whole layer does not take, the previous card's last expert
    layer puts part of its experts there (``-ot ...=CUDA1``), which lets more experts off the CPU."""
    cards = [gpu(0, 8), gpu(1, 8), gpu(2, 4)]
    args = ["-c", "4096", "-np", "1"]
    p = plan(moe30, cards, args)
    assert p.fits and all(d.use.total <= d.usable for d in p.devices)
    spilled = [o for o in p.settings.overrides if o.buft != "CPU"]
    assert spilled, p.settings.overrides
    for o in spilled:
        layer = int(o.pattern.split("\\.")[1])
        # the layer is the last expert layer of the card before the one it spills to
        on = p.footprint.layer_device[layer]
        assert [g.id for g in cards].index(o.buft) == [g.id for g in cards].index(on) + 1
        assert p.footprint.layer_device[layer + 1] == o.buft
        assert any(
            t.device == o.buft
            for t in p.footprint.placement.tensors
            if t.tensor.name.startswith(f"blk.{layer}.ffn_down_exps")
        )
    argv = compose("llama-server", p.planned, parse_server_args([]))
    assert any(f"={o.buft}" in argv[argv.index("-ot") + 1] for o in spilled)
    d = p.decision("placement.cpu_moe")
    assert d is not None and f"on {spilled[0].buft}" in d.message
    # the same flags from the user price the same load on every card
    ts = ",".join(str(int(x)) for x in p.settings.tensor_split)
    again = plan(moe30, cards, [*args, "-ngl", "all", "-ts", ts, *_as_flags(p.settings.overrides)])
    assert [d.use for d in again.devices] == [d.use for d in p.devices]
    # without the spill (same split, whole layers and the CPU part only) fewer experts are on the GPUs
    whole, rest = whole_expert_layers(p.settings.overrides)
    cpu_part = tuple(o for o in p.settings.overrides if o.buft == "CPU")
    # the card the layer spills from cannot hold it whole
    assert past_the_margin(moe30, cards, [*args, "-ngl", "all", "-ts", ts, *_as_flags(cpu_part)])
    assert len(rest) > len(spilled) or whole == len(cpu_part)  # spilled parts are not CPU layers


def test_an_rpc_devices_buffer_type_in_ot_is_priced_on_that_device(moe30: ModelInfo) -> None:
    """llama-server names an RPC device's buffer type ``RPC<k>[host:port]`` (what ``-ot`` takes and what
    llama-fit-params prints); such an override is priced on that device, and the fit's own spill to an
    RPC device is composed under that name."""
    rpc = [
        Device("RPC0", "rpc a", 8 * GiB, 8 * GiB, kind="rpc", source="rpc", endpoint="127.0.0.1:5001", backend="RPC"),
        Device("RPC1", "rpc b", 6 * GiB, 6 * GiB, kind="rpc", source="rpc", endpoint="127.0.0.1:5002", backend="RPC"),
    ]
    m = Machine(tuple(rpc), HOST)
    args = ["-c", "4096", "-np", "1", "-ngl", "all", "-ts", "40,9", "--n-cpu-moe", "30"]
    base = make_plan(moe30, m, build_request(parse_server_args(args)))
    moved = make_plan(
        moe30, m, build_request(parse_server_args([*args, "-ot", r"blk\.39\.ffn_down_exps=RPC0[127.0.0.1:5002]"]))
    )
    down = next(t.alloc for t in base.footprint.placement.tensors if t.tensor.name == "blk.39.ffn_down_exps.weight")
    assert moved.devices[1].use.model == base.devices[1].use.model + down
    assert moved.devices[0].use.model == base.devices[0].use.model - down
    rpc = [
        replace(rpc[0], total=int(9 * GiB), free=int(9 * GiB)),
        replace(rpc[1], total=int(4.5 * GiB), free=int(4.5 * GiB)),
    ]
    p = make_plan(moe30, Machine(tuple(rpc), HOST), build_request(parse_server_args(["-c", "4096", "-np", "1"])))
    argv = compose("llama-server", p.planned, parse_server_args([]))
    assert any(o.buft == "RPC1" for o in p.settings.overrides)  # the fit spilled to the second RPC device
    assert "=RPC0[127.0.0.1:5002]" in argv[argv.index("-ot") + 1]
    assert "=RPC1" not in " ".join(argv)


def test_part_of_a_layer_never_costs_context(moe30: ModelInfo) -> None:
    """Parts of expert layers only take the room left at the context whole layers allow: the context is
    the largest the whole-layer placement holds (a speed option never cuts the context)."""
    for cards in ([gpu(0, 12)], [gpu(0, 9), gpu(1, 4.5)]):
        p = plan(moe30, cards, prefer="speed")  # the whole-layer placement first, then the largest context it holds
        assert p.fits and p.n_ctx < 40960
        whole, rest = whole_expert_layers(p.settings.overrides)
        k = whole + (1 if any(o.buft == "CPU" for o in rest) else 0)
        ts = ["-ts", ",".join(str(int(x)) for x in p.settings.tensor_split)] if len(cards) > 1 else []
        assert past_the_margin(moe30, cards, ["-c", str(p.n_ctx + 256), "-ngl", "all", *ts, "--n-cpu-moe", str(k)])


@pytest.mark.parametrize("shape", ["qwen3_8b", "llama31_8b", "gemma3_4b", "qwen3_0_6b"])
def test_several_small_cards_of_every_shape_never_do_worse_than_one(shape: str, tmp_path: Path) -> None:
    """What one small card holds, two or three of them hold too (tied and untied outputs, large vocabularies,
    sliding windows); and a card too small for even its own buffers never makes the machine worse than none."""
    model = load_model(getattr(factory, shape)().write(tmp_path / f"{shape}.gguf"))
    for size in (2, 3, 4):
        fits = [plan(model, [gpu(i, size) for i in range(n)]).fits for n in (1, 2, 3)]
        assert fits == [True, True, True], (size, fits)
    tiny = plan(model, [gpu(0, 1.5), gpu(1, 1.5)])
    assert tiny.fits and tiny.decision("placement.cpu") is not None
    assert "-dev none" in tiny.decision("placement.cpu").message  # type: ignore[union-attr]
    assert ("-dev", "none") in [p.tokens for p in tiny.planned]

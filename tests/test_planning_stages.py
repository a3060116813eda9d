"""The planner's stages, each called alone (docs/architecture.md, "Planning"): composed by hand they make the
plan ``Planner.plan`` makes; measuring is asked for the cards the fit may split over before it and for what
the plan puts work on after it; the fit and the speed only read the rates they are given."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.fit.faster import split_devices
from llamafit.fit.speed import priced, used_devices
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.memory.placement import CPU
from llamafit.options import Options
from llamafit.planning.asked import read
from llamafit.planning.discover import machine_for
from llamafit.planning.fitting import fit
from llamafit.planning.measure import after_fit, before_fit, rate_source
from llamafit.planning.planner import Planner
from llamafit.planning.resolve import resolve
from llamafit.server.capabilities import ASSUMED
from llamafit.speed.known import host_rates
from llamafit.speed.rate_source import Measured


@pytest.fixture
def demo(tmp_path: Path) -> str:
    return str(ensure_demo_model(tmp_path))


def planner(o: Options) -> Planner:
    return Planner.for_options(o, server=(None, ASSUMED))  # no binary: nothing is probed or bounded


def test_the_stages_by_hand_make_the_planners_plan(demo: str) -> None:
    o = Options(gpu=("1GiB@448GB/s", "2GiB@1008GB/s"), host_bandwidth="80GB/s", server_args=("-c", "4096"))
    p = planner(o)
    whole = p.plan(demo, tuned=False)
    asked = read(o, p.caps, p.hub)
    mach, asked = machine_for(p.machine, asked, p.server, o)
    res = resolve(demo, o, asked, p.hub)
    source = rate_source(mach, res, p.server, o, budget=0)
    before = before_fit(source, mach, res)
    plan, argv = fit(res, mach, p.server, p.caps, o, hub=p.hub, rates=before.rates)
    after = after_fit(source, plan)
    plan = priced(plan, after.rates)
    assert argv == whole.argv
    assert plan.speed == whole.plan.speed and plan.speed is not None and plan.speed.tg
    assert plan.decisions == whole.plan.decisions and whole.measured == after


def test_the_cards_measured_before_the_fit_are_the_ones_it_may_split_over(demo: str) -> None:
    two = Options(gpu=("1GiB@448GB/s", "2GiB@1008GB/s"), server_args=("-c", "4096"))
    for args, want in (((), ["CUDA0", "CUDA1"]), (("-ts", "1,1"), []), (("-ngl", "4"), []), (("-dev", "CUDA1"), [])):
        o = Options(gpu=two.gpu, server_args=(*two.server_args, *args))
        p = planner(o)
        asked = read(o, p.caps, p.hub)
        assert split_devices(p.machine, asked.req) == want, args


def test_what_the_plan_uses_is_measured_after_the_fit(demo: str) -> None:
    on_host = planner(Options(cpu_only=True, server_args=("-c", "4096"))).plan(demo, speed=False, tuned=False)
    assert used_devices(on_host.plan) == [CPU]
    on_card = planner(Options(gpu=("8GiB",), server_args=("-c", "4096"))).plan(demo, speed=False, tuned=False)
    assert "CUDA0" in used_devices(on_card.plan)
    half = planner(Options(gpu=("8GiB",), server_args=("-c", "4096", "-ngl", "2"))).plan(demo, speed=False)
    assert set(used_devices(half.plan)) == {CPU, "CUDA0"}


def test_a_plan_given_rates_reads_them_and_measures_nothing(demo: str) -> None:
    """tune's candidates read the first plan's rates: no measuring stage runs, the plan keeps what it read."""
    given = Measured({CPU: host_rates(80e9)}, key="given", notes=("read, not measured",))
    prep = planner(Options(cpu_only=True, server_args=("-c", "4096"))).plan(demo, measured=given, tuned=False)
    assert prep.measured is given and "read, not measured" in prep.notes
    assert prep.plan.speed is not None and prep.plan.speed.tg
    slower = Measured({CPU: host_rates(40e9)}, key="given")
    again = planner(Options(cpu_only=True, server_args=("-c", "4096"))).plan(demo, measured=slower, tuned=False)
    assert again.plan.speed is not None and again.plan.speed.tg and again.plan.speed.tg < prep.plan.speed.tg


def test_tune_never_measures_the_servers_own_thread_count_twice(demo: str) -> None:
    """``tune``'s thread counts leave out the one llama-server takes without ``-t`` (its physical cores): "the plan
    as it is" measures that already (on a machine without SMT, a Mac's or a VM's, "N threads" was a second run of
    the same configuration)."""
    from llamafit.tune import _variations

    base = planner(Options(cpu_only=True, host_bandwidth="40GB/s", host_cores=2)).plan(demo, tuned=False)

    def threads(cores: int, default: int) -> list[tuple[tuple[str, ...], str]]:
        return [(f, why) for f, why in _variations(base, cores, default) if f[:1] == ("-t",)]

    assert threads(2, 2) == [(("-t", "1"), "1 thread")]
    assert threads(16, 8) == [(("-t", "16"), "16 threads"), (("-t", "15"), "15 threads")]
    assert [f for f, _ in threads(8, 8)] == [("-t", "7"), ("-t", "4")]

"""A plan the memory model is not sure of is held to the binary's own no-alloc measurement (llama-fit-params).

Two cases need it: a graph no replay builds (its compute is the per-phase estimate: DeepSeek-V4 on a build older
than the graph its replay builds), and a server of another build, or one that does not say its build. The real
llama-fit-params beside the real server measures; the real server's load is what the bounded plan must never be
under.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.memory.footprint import PredictedBuffer
from llamafit.options import Options
from llamafit.planning.bound import SLACK
from llamafit.planning.planner import prepare
from llamafit.server.binary import ServerBinary
from llamafit.server.fitprint import NAME, NoAllocFailed, beside, measure, parse_compute, parse_table
from llamafit.units import MiB
from tests import factory
from tests.realserver import load_log, run_argv, wrapped

BROKEN = """#!/bin/sh
case "$1" in
  --completion-bash) echo 'opts="-m -c -np -fitp -v"' ;;
  --version) echo 'version: 1 (build 11434, commit deadbee)' >&2 ;;
  *) echo 'error: this binary is broken' >&2; exit 1 ;;
esac
"""


def _compute(buffers: Sequence[PredictedBuffer], context: str = "target") -> dict[str, int]:
    return {b.buft: b.nbytes for b in buffers if b.kind == "compute" and b.context == context}


# older than DSV4_GRAPH_SINCE: there DeepSeek-V4's compute is the per-phase estimate (14-36 % under)
OLD_V4 = "version: 10500 (abcdef0)"


def _estimated(
    tmp_path: Path, server_bin: ServerBinary, version: str = OLD_V4, fitparams: bool = True
) -> tuple[str, Path]:
    """DeepSeek-V4 and the real server saying it is ``version`` (with the real llama-fit-params beside it)."""
    srv = wrapped(tmp_path, "llama-server", server_bin.path, server_bin.lib_dir, version=version)
    if fitparams:
        wrapped(tmp_path, NAME, _fitparams(server_bin), server_bin.lib_dir)
    return srv, factory.deepseek4().write(tmp_path / "dsv4.gguf")


def _fitparams(server_bin: ServerBinary) -> str:
    fp = beside(server_bin.path)
    assert fp is not None, f"no {NAME} beside {server_bin.path}"
    return fp


def test_the_compute_lines_of_a_log_last_reserve_wins() -> None:
    log = (
        "0.00.011.906 D sched_reserve: reserving ...\n"
        "0.00.022.225 D sched_reserve:      CUDA0 compute buffer size =   300.00 MiB\n"
        "0.00.022.225 D sched_reserve: reserving ...\n"
        "0.00.022.225 D sched_reserve:      CUDA0 compute buffer size =   156.02 MiB\n"
        "0.00.022.226 D sched_reserve:  CUDA_Host compute buffer size =    18.17 MiB\n"
    )
    assert parse_compute(log) == {"CUDA0": round(156.02 * MiB), "CUDA_Host": round(18.17 * MiB)}
    assert parse_compute("nothing here\n") == {}


def test_llama_fit_params_is_given_what_it_takes_of_the_servers_argv() -> None:
    """The placement, batch and cache flags it accepts pass; the context and slots are llamafit's (a unified
    cache as one stream of it, or as S whole-context streams for a graph with per-sequence parts); what would
    hide or reshape its log, and what it does not take (a port, a projector), stay out."""
    from llamafit.memory.footprint import LoadSettings
    from llamafit.planning.bound import noalloc_args, noalloc_context

    server = ["-m", "x.gguf", "-c", "4096", "-lv", "1", "--log-jsonl", "-ngl", "3", "--port", "8", "--mmproj", "p"]
    takes = {"-m", "-c", "-lv", "--log-jsonl", "-ngl", "-fa"}.__contains__
    assert noalloc_args("m.gguf", [*server, "-fa", "on"], takes) == ["-m", "m.gguf", "-ngl", "3", "-fa", "on"]
    unified, per_slot = LoadSettings(n_seq=4, kv_unified=True), LoadSettings(n_seq=2, kv_unified=False)
    assert noalloc_context(unified, 8192, per_seq=False) == (1, 8192)  # one stream spans the unified cells
    assert noalloc_context(unified, 8192, per_seq=True) == (4, 32768)  # a per-sequence graph keeps its S
    assert noalloc_context(per_slot, 8192, per_seq=False) == (2, 8192)  # what the server is given


@pytest.mark.server
def test_the_no_alloc_measurement_is_the_servers_compute(server_bin: ServerBinary, tmp_path: Path) -> None:
    """At settings it can be given, llama-fit-params' compute is the buffer the real server allocates."""
    model = factory.deepseek4().write(tmp_path / "dsv4.gguf")
    got = measure(_fitparams(server_bin), ["-m", str(model), "-c", "8192", "-np", "2"], server_bin.env())
    log = load_log(server_bin, model, ["-c", "8192", "-np", "2"])
    real = log.context("target")
    assert real is not None
    assert {b: round(v / MiB, 2) for b, v in got.compute.items()} == real.compute


@pytest.mark.server
@pytest.mark.parametrize(
    ("args", "spec"),
    [(["-c", "4096"], "off"), (["-c", "8192", "-np", "2"], "off"), (["-c", "4096"], "draft-dspark")],
    ids=["unified-auto", "np2", "dspark"],
)
def test_an_estimated_compute_is_bounded_never_under(
    server_bin: ServerBinary, tmp_path: Path, args: list[str], spec: str
) -> None:
    """DeepSeek-V4's compute on a build before its replayed graph is the per-phase estimate (14-36 % under): the
    plan is raised to the binary's no-alloc measurement and is then never under the real load, with the
    server's default unified cache and with a DSpark drafter reading the target's layers too (llama-fit-params
    loads no drafter: the drafter's estimated context takes the target's factor)."""
    srv, model = _estimated(tmp_path, server_bin)
    draft = str(factory.dspark_dsv4().write(tmp_path / "dspark.gguf")) if spec != "off" else None
    o = Options(server=srv, server_args=tuple(args), cpu_only=True, spec=spec, draft=draft)
    prep = prepare(str(model), o, speed=False)
    plan = prep.plan
    assert not plan.footprint.compute_replayed
    assert plan.memory_bound is not None and plan.memory_bound.binary == str(tmp_path / NAME)
    assert plan.memory_bound.scale, "the estimate is under the measurement: the plan is raised"
    assert plan.decision("memory.bound") is not None
    log = run_argv(server_bin, prep.argv[1:])
    for label, fp in (("target", plan.footprint), ("draft", plan.draft_footprint)):
        real = log.context(label)
        if fp is None or real is None:
            assert label == "draft" and spec == "off"
            continue
        planned = _compute(fp.buffers, label)
        for buft, mib in real.compute.items():
            assert planned[buft] >= mib * MiB - SLACK, (label, buft, planned[buft] / MiB, mib)
    doc = prep.to_json()["memory_model"]["bound"]
    assert doc["by"] == plan.memory_bound.binary and doc["measured_mib"]["CPU"] > doc["predicted_mib"]["CPU"]


@pytest.mark.server
def test_a_replayed_plan_on_its_own_build_is_not_measured(server_bin: ServerBinary, tmp_path: Path) -> None:
    model = factory.qwen3_0_6b().write(tmp_path / "q.gguf")
    prep = prepare(str(model), Options(server_args=("-c", "4096"), cpu_only=True), speed=False)
    assert prep.plan.memory_build is not None and prep.plan.memory_build.sure == "exact"
    assert prep.plan.memory_bound is None and prep.to_json()["memory_model"]["bound"] is None


@pytest.mark.server
def test_a_server_that_does_not_say_its_build_is_bounded_by_its_fitparams(
    server_bin: ServerBinary, tmp_path: Path
) -> None:
    """A build that prints ``build 0`` and is not in a package cannot be placed: its own llama-fit-params
    bounds the plan, an upper bound (it reserves a whole ubatch of outputs; the server, one per slot)."""
    zero = "version: 0.6.0-dev (build 0, commit unknown)"
    srv = wrapped(tmp_path, "llama-server", server_bin.path, server_bin.lib_dir, version=zero)
    wrapped(tmp_path, NAME, _fitparams(server_bin), server_bin.lib_dir)
    model = factory.qwen3_0_6b().write(tmp_path / "q.gguf")
    prep = prepare(str(model), Options(server=srv, server_args=("-c", "4096"), cpu_only=True), speed=False)
    plan = prep.plan
    assert plan.memory_build is not None and plan.memory_build.sure == "unknown"
    b = plan.memory_bound
    assert b is not None and b.binary == str(tmp_path / NAME) and b.kind == "upper"
    assert any("does not say" in r for r in b.reasons)
    assert b.scale["CPU"] > 2  # a whole ubatch of logits rows (151936-token vocabulary) above one per slot
    real = run_argv(server_bin, prep.argv[1:]).context("target")
    assert real is not None
    planned = _compute(plan.footprint.buffers)
    assert all(planned[buft] >= mib * MiB - SLACK for buft, mib in real.compute.items())


@pytest.mark.server
def test_no_fitparams_or_a_failing_one_leaves_the_plan_and_says_why(server_bin: ServerBinary, tmp_path: Path) -> None:
    srv, model = _estimated(tmp_path, server_bin, fitparams=False)
    runner = CliRunner()
    r = runner.invoke(app, ["plan", str(model), "--cpu-only", "--server", srv, "--json", "--", "-c", "4096"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["memory_model"]["bound"]["by"] is None
    assert f"there is no {NAME} beside" in doc["memory_model"]["bound"]["note"]
    assert "deepseek4's compute is estimated" in doc["memory_model"]["bound"]["reasons"][0]

    broken = tmp_path / NAME
    broken.write_text(BROKEN)
    broken.chmod(0o755)
    r = runner.invoke(app, ["plan", str(model), "--cpu-only", "--server", srv, "--json", "--", "-c", "4096"])
    assert r.exit_code == 0, r.output
    note = json.loads(r.stdout)["memory_model"]["bound"]["note"]
    assert "exited 1 without a compute buffer" in note and "this binary is broken" in note
    with pytest.raises(NoAllocFailed):
        measure(str(broken), ["-m", str(model)], dict(os.environ))


@pytest.mark.server
def test_a_replayed_graph_on_a_build_read_from_source_is_priced_by_its_rules(
    server_bin: ServerBinary, tmp_path: Path
) -> None:
    """A build whose source the rules were read from prices a replayed graph by that build's rules, with no
    no-alloc bound (it reserved a whole ubatch of logits for llama-fit-params' settings, not the server's: +89 %
    at the median on b10985); a build outside them is held to its llama-fit-params, an upper bound from b9464."""
    model = factory.qwen3_0_6b().write(tmp_path / "q.gguf")
    wrapped(tmp_path, NAME, _fitparams(server_bin), server_bin.lib_dir)
    compute = {}
    for build in (11000, 9400, 12000):
        srv = wrapped(tmp_path, "llama-server", server_bin.path, server_bin.lib_dir, version=f"version: {build} (ab)")
        o = Options(server=srv, server_args=("-c", "4096", "-np", "2"), cpu_only=True)
        plan = prepare(str(model), o, speed=False).plan
        assert plan.memory_build is not None and plan.memory_build.server == build
        compute[build] = _compute(plan.footprint.buffers)["CPU"]
        b = plan.memory_bound
        if build == 12000:
            assert b is not None and b.kind == "upper" and b.binary is not None and b.scale["CPU"] > 2
            assert "outside the builds the rules were read from" in b.reasons[0]
        else:
            assert b is None and plan.memory_build.priced == build
    assert compute[9400] > compute[11000]  # before b9464 every ubatch token's logits were reserved


@pytest.mark.server
@pytest.mark.parametrize(("version", "kind"), [(OLD_V4, "upper"), ("version: 9400 (abcdef0)", "own")])
def test_an_estimated_graph_is_held_by_what_the_build_reserves(
    server_bin: ServerBinary, tmp_path: Path, version: str, kind: str
) -> None:
    """An estimated graph (DeepSeek-V4 before its replayed graph) is held to llama-fit-params on every build. From
    b9464 the server reserves one output per slot: llama-fit-params' whole ubatch of outputs makes its
    measurement an upper bound, and the plan is raised to it where it is above. An older server reserved a whole
    ubatch itself: the measurement is its own, and the plan takes it, down too."""
    srv, model = _estimated(tmp_path, server_bin, version)
    prep = prepare(str(model), Options(server=srv, server_args=("-c", "4096", "-np", "1"), cpu_only=True), speed=False)
    b = prep.plan.memory_bound
    assert b is not None and b.kind == kind and b.binary is not None
    compute = _compute(prep.plan.footprint.buffers)["CPU"]
    if kind == "upper":
        assert compute >= b.floor["CPU"] - SLACK
    else:
        assert abs(compute - b.floor["CPU"]) < 64 << 10
    held = prep.plan.decision("memory.bound")
    assert held is not None and ("its own reservation" in held.message) == (kind == "own")


TABLE_ONLY = """#!/bin/sh
case "$1" in
  --completion-bash) echo 'opts="-m -c -np -fit -fitp -v"' ;;
  --version) echo 'version: 11434 (deadbee)' >&2 ;;
  *) echo 'Host 24 3 30' ;;
esac
"""


@pytest.mark.server
def test_a_log_cut_short_falls_back_to_the_table(server_bin: ServerBinary, tmp_path: Path) -> None:
    """llama-fit-params' log is written by a thread its exit can cut short; its stdout table is always
    written, in whole MiB (floored): each row is taken one MiB up, so it stays above what it measured."""
    assert parse_table("CUDA0 4000 512 300\nHost 24 3 30\n") == {"CUDA0": 300, "Host": 30}
    srv, model = _estimated(tmp_path, server_bin, fitparams=False)
    fake = tmp_path / NAME
    fake.write_text(TABLE_ONLY)
    fake.chmod(0o755)
    plan = prepare(str(model), Options(server=srv, server_args=("-c", "4096"), cpu_only=True), speed=False).plan
    b = plan.memory_bound
    assert b is not None and b.binary == str(fake) and "its log lost the compute lines" in b.note
    assert b.measured == {"CPU": 31 * MiB} and _compute(plan.footprint.buffers)["CPU"] >= 31 * MiB - SLACK


@pytest.mark.server
def test_a_launch_calibrates_past_the_bound(server_bin: ServerBinary, tmp_path: Path) -> None:
    """The bound is for a first plan: once a launch on this machine logged the compute buffers, the next plan
    takes them (the record keeps the model's own number, not the bound's, so the correction is not compounded)
    and is not bounded again."""
    from llamafit.memory.calibration import record

    zero = "version: 0.6.0-dev (build 0, commit unknown)"
    srv = wrapped(tmp_path, "llama-server", server_bin.path, server_bin.lib_dir, version=zero)
    wrapped(tmp_path, NAME, _fitparams(server_bin), server_bin.lib_dir)
    model = factory.qwen3_0_6b().write(tmp_path / "q.gguf")
    o = Options(server=srv, server_args=("-c", "4096", "-np", "2"), cpu_only=True)
    first = prepare(str(model), o, speed=False)
    assert first.plan.memory_bound is not None and first.plan.memory_bound.scale
    real = run_argv(server_bin, first.argv[1:]).context("target")
    assert real is not None
    devices = tuple(d.device.id for d in first.plan.devices)
    record(first.plan.model, first.plan.settings, devices, first.plan.footprint, {"compute": dict(real.compute)}, {})
    again = prepare(str(model), o, speed=False)
    assert again.plan.memory_bound is None and again.plan.decision("calibration.applied") is not None
    planned = _compute(again.plan.footprint.buffers)
    assert {b: round(v / MiB, 2) for b, v in planned.items()} == real.compute


@pytest.mark.server
def test_a_plan_the_measurement_pushes_past_the_budget_says_so(server_bin: ServerBinary, tmp_path: Path) -> None:
    """On host RAM that holds DeepSeek-V4's load as the estimate prices it (on a build before its replayed
    graph) but not as llama-fit-params measures it, the plan does not fit, and says that the measurement is why."""
    from llamafit.devices.machine import Host, Machine
    from llamafit.errors import DoesNotFitError

    srv, model = _estimated(tmp_path, server_bin)
    o = Options(server=srv, server_args=("-c", "4096"), cpu_only=True, margin="0")
    roomy = prepare(str(model), o, speed=False, machine=Machine((), Host(total=64 << 30, available=32 << 30)))
    held = roomy.plan.memory_bound
    assert held is not None and held.scale
    # what the plan needs without the bound, with a little room: less than the measurement adds
    extra = sum(held.floor.values()) - sum(held.predicted.values())
    need = roomy.plan.host.use.total - extra
    tight = Machine((), Host(total=64 << 30, available=need + extra // 2))
    with pytest.raises(DoesNotFitError) as e:
        prepare(str(model), o, speed=False, machine=tight)
    # what llama-fit-params measured on this machine (its CPU compute differs by the CPU's features: 20.18 MiB on
    # one host of this project, 21.00 on another), as the roomy plan was held to it
    assert f"with its compute raised to what llama-fit-params measured: CPU {held.floor['CPU'] / MiB:.2f} MiB" in (
        e.value.message
    )

"""A plan the memory model is not sure of is held to the binary's own no-alloc measurement (llama-fit-params).

Two cases need it: a graph no replay builds (its compute is the per-phase estimate: DeepSeek-V4), and a
server of another build, or one that does not say its build. The real llama-fit-params beside the real
server measures; the real server's load is what the bounded plan must never be under.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.bound import SLACK
from llamafit.cli.app import app
from llamafit.options import Options
from llamafit.prepare import prepare
from llamafit.server.binary import ServerBinary
from llamafit.server.fitprint import NAME, NoAllocFailed, beside, measure, parse_compute
from llamafit.units import MiB
from tests import factory
from tests.realserver import load_log, run_argv

BROKEN = """#!/bin/sh
case "$1" in
  --completion-bash) echo 'opts="-m -c -np -fitp -v"' ;;
  --version) echo 'version: 1 (build 11434, commit deadbee)' >&2 ;;
  *) echo 'error: this binary is broken' >&2; exit 1 ;;
esac
"""


def _compute(plan_buffers: object) -> dict[str, int]:
    return {b.buft: b.nbytes for b in plan_buffers if b.kind == "compute" and b.context == "target"}  # type: ignore[attr-defined]


def _fitparams(server_bin: ServerBinary) -> str:
    fp = beside(server_bin.path)
    assert fp is not None, f"no {NAME} beside {server_bin.path}"
    return fp


def _wrapper(tmp_path: Path, name: str, real: str, lib_dir: str | None, *, version: str | None = None) -> str:
    """``real`` under another folder (so nothing is found beside it), saying ``version`` when asked."""
    exe = tmp_path / name
    ld = f'export LD_LIBRARY_PATH="{lib_dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n' if lib_dir else ""
    say = f'if [ "$1" = --version ]; then echo "{version}" >&2; exit 0; fi\n' if version else ""
    exe.write_text(f'#!/bin/sh\n{ld}{say}exec "{real}" "$@"\n')
    exe.chmod(0o755)
    return str(exe)


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
@pytest.mark.parametrize("args", [["-c", "4096"], ["-c", "8192", "-np", "2"]], ids=["unified-auto", "np2"])
def test_an_estimated_compute_is_bounded_never_under(server_bin: ServerBinary, tmp_path: Path, args: list[str]) -> None:
    """DeepSeek-V4's compute is the per-phase estimate (14-36 % under): the plan is raised to the binary's
    no-alloc measurement and is then never under the real load, with the server's default unified cache too."""
    model = factory.deepseek4().write(tmp_path / "dsv4.gguf")
    prep = prepare(str(model), Options(server_args=tuple(args), cpu_only=True), speed=False)
    plan = prep.plan
    assert plan.memory_bound is not None and plan.memory_bound.binary == _fitparams(server_bin)
    assert plan.memory_bound.scale, "the estimate is under the measurement: the plan is raised"
    assert plan.decision("memory.bound") is not None
    assert not any("is estimated, not replayed" in w for w in plan.warnings)
    real = run_argv(server_bin, prep.argv[1:]).context("target")
    assert real is not None
    planned = _compute(plan.footprint.buffers)
    for buft, mib in real.compute.items():
        assert planned[buft] >= mib * MiB - SLACK, (buft, planned[buft] / MiB, mib)
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
    bounds the plan (here it reserves n_batch outputs where the server reserves one per slot: above the model)."""
    srv = _wrapper(
        tmp_path,
        "llama-server",
        server_bin.path,
        server_bin.lib_dir,
        version="version: 0.6.0-dev (build 0, commit unknown)",
    )
    _wrapper(tmp_path, NAME, _fitparams(server_bin), server_bin.lib_dir)
    model = factory.qwen3_0_6b().write(tmp_path / "q.gguf")
    prep = prepare(str(model), Options(server=srv, server_args=("-c", "4096"), cpu_only=True), speed=False)
    plan = prep.plan
    assert plan.memory_build is not None and plan.memory_build.sure == "unknown"
    b = plan.memory_bound
    assert b is not None and b.binary == str(tmp_path / NAME)
    assert any("does not say" in r for r in b.reasons)
    real = run_argv(server_bin, prep.argv[1:]).context("target")
    assert real is not None
    planned = _compute(plan.footprint.buffers)
    assert all(planned[buft] >= mib * MiB - SLACK for buft, mib in real.compute.items())


@pytest.mark.server
def test_no_fitparams_or_a_failing_one_leaves_the_plan_and_says_why(server_bin: ServerBinary, tmp_path: Path) -> None:
    model = factory.deepseek4().write(tmp_path / "dsv4.gguf")
    srv = _wrapper(tmp_path, "llama-server", server_bin.path, server_bin.lib_dir)
    runner = CliRunner()
    r = runner.invoke(app, ["plan", str(model), "--cpu-only", "--server", srv, "--json", "--", "-c", "4096"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["memory_model"]["bound"]["by"] is None
    assert f"there is no {NAME} beside" in doc["memory_model"]["bound"]["note"]
    assert any("is estimated, not replayed" in w for w in doc["warnings"])  # the margin's cover is still said

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
@pytest.mark.parametrize(
    ("version", "kind"), [("version: 11000 (abcdef0)", "transferred"), ("version: 9400 (abcdef0)", "upper")]
)
def test_a_numbered_build_is_held_by_what_it_reserves(
    server_bin: ServerBinary, tmp_path: Path, version: str, kind: str
) -> None:
    """From b9464 the server reserves one output per slot: llama-fit-params' extra outputs are priced by the
    replay and taken off (the replayed model is then within the measurement); an older server reserved a
    whole ubatch of outputs as llama-fit-params does, so its measurement is taken as it is."""
    srv = _wrapper(tmp_path, "llama-server", server_bin.path, server_bin.lib_dir, version=version)
    _wrapper(tmp_path, NAME, _fitparams(server_bin), server_bin.lib_dir)
    model = factory.qwen3_0_6b().write(tmp_path / "q.gguf")
    prep = prepare(str(model), Options(server=srv, server_args=("-c", "4096", "-np", "2"), cpu_only=True), speed=False)
    b = prep.plan.memory_bound
    assert b is not None and b.kind == kind and b.binary is not None
    if kind == "transferred":  # this binary is b11434 in truth: the replay's difference is exact
        assert not b.scale and abs(b.floor["CPU"] - b.predicted["CPU"]) <= SLACK
    else:  # the logits of a whole ubatch (151936-token vocabulary) above the model's one row per slot
        assert b.scale["CPU"] > 2 and b.floor == b.measured

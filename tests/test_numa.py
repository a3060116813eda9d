"""A host of several NUMA nodes: counted as ggml-cpu counts them, and the note a plan carries where llama-server's
--numa would speed generation (llamafit.devices.numa, llamafit.planning.numa)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llamafit.devices.machine import Host, Machine, host_memory
from llamafit.devices.numa import MAX_NODES, NODES, numa_nodes
from llamafit.fit import make_plan
from llamafit.fit.plan import Plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.options import Options
from llamafit.planning.numa import numa_note
from llamafit.server.args import ServerArgs, parse_server_args
from llamafit.speculative import SpecOptions
from llamafit.units import GiB
from tests import factory


def _nodes(root: Path, *ids: int) -> Path:
    for i in ids:
        (root / f"node{i}").mkdir(parents=True)
    return root


def test_nodes_are_counted_up_to_the_first_one_missing(tmp_path: Path) -> None:
    assert numa_nodes(_nodes(tmp_path / "two", 0, 1)) == 2
    assert numa_nodes(_nodes(tmp_path / "gap", 0, 2)) == 1  # ggml-cpu stops at node1
    assert numa_nodes(_nodes(tmp_path / "many", *range(12))) == MAX_NODES
    assert numa_nodes(tmp_path / "absent") == 1  # not Linux: one node


def test_this_host_is_counted_from_its_sysfs() -> None:
    assert host_memory().numa_nodes == numa_nodes(NODES) >= 1


@pytest.fixture(scope="module")
def l8b(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    return load_model(factory.llama31_8b().write(tmp_path_factory.mktemp("m") / "llama31-8b.gguf"))


def _plan(model: ModelInfo, nodes: int, gpus: tuple[int, ...] = ()) -> Plan:
    host = Host(total=128 * GiB, available=120 * GiB, numa_nodes=nodes)
    machine = Machine(tuple(factory.gpu(i, size) for i, size in enumerate(gpus)), host)
    return make_plan(model, machine, build_request(parse_server_args([])), SpecOptions(mode="off"))


def test_a_host_of_two_nodes_reading_weights_is_told_of_numa_distribute(l8b: ModelInfo) -> None:
    note = numa_note(_plan(l8b, 2), ServerArgs(), {}, Options())
    assert note is not None
    assert "2 NUMA nodes" in note and "--numa distribute" in note and "drop_caches" in note
    # every weight of the 8B is on the host: the note says how much a token reads
    assert "GiB of weights" in note


def test_no_note_where_numa_does_not_apply(l8b: ModelInfo) -> None:
    assert numa_note(_plan(l8b, 1), ServerArgs(), {}, Options()) is None  # one node
    on_host = _plan(l8b, 2)
    assert numa_note(on_host, parse_server_args(["--numa", "distribute"]), {}, Options()) is None  # given
    assert numa_note(on_host, ServerArgs(), {"LLAMA_ARG_NUMA": "isolate"}, Options()) is None  # in the env
    assert numa_note(on_host, ServerArgs(), {}, Options(host_bandwidth="400GB/s")) is None  # another host
    all_gpu = _plan(l8b, 2, gpus=(48,))  # every layer on the card: the host reads no weights a token
    assert all_gpu.decision("placement.all_gpu") is not None
    assert numa_note(all_gpu, ServerArgs(), {}, Options()) is None


def test_the_planner_carries_the_note_of_its_machine(l8b: ModelInfo) -> None:
    from llamafit.planning.planner import Planner

    o = Options(cpu_only=True)
    two = Machine((), Host(total=128 * GiB, available=120 * GiB, numa_nodes=2))
    planner = Planner.for_options(o, machine=two)
    prep = planner.plan(l8b.path, speed=False)
    assert any("2 NUMA nodes" in n for n in prep.notes)
    one = planner.plan(l8b.path, machine=replace(two, host=replace(two.host, numa_nodes=1)), speed=False)
    assert not any("NUMA" in n for n in one.notes)

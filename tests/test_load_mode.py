"""How llama.cpp loads the weights: the tied output of the architectures that make it before token_embd."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.devices.machine import Host, Machine
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import load_model
from llamafit.memory.placement import Loading, place_weights
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.serving.compare import compare
from llamafit.units import GiB, pad
from tests import factory
from tests.realserver import load_log


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.gemma4().write(tmp_path_factory.mktemp("gemma4") / "gemma4.gguf")


def test_gemma4_keeps_its_tied_output_twice_where_the_buffer_is_not_the_file(small: Path) -> None:
    """gemma4 makes the tied output before token_embd, so the copy finds nothing to share (models/gemma4.cpp:50-56):
    without mmap two tensors take their bytes in the CPU buffer; mapped, both are the file's."""
    m = load_model(small)
    padded = [pad(t.info.nbytes, 32) for t in m.tensors if t.name == "token_embd.weight"]
    unmapped = dict(place_weights(m, Loading(0, use_mmap=False), gpus=[], splits=[]).buffers)
    assert unmapped["CPU"] == sum(pad(t.info.nbytes, 32) for t in m.tensors) + padded[0]
    mapped = place_weights(m, Loading(0), gpus=[], splits=[]).buffers
    assert len(mapped) == 1 and mapped[0][1] < unmapped["CPU"]


@pytest.mark.server
@pytest.mark.parametrize("args", [["-lm", "none"], []], ids=["no-mmap", "defaults"])
def test_the_model_buffers_match_the_server(server_bin: ServerBinary, small: Path, args: list[str]) -> None:
    argv = ["-c", "4096", *args]
    machine = Machine((), Host(total=64 * GiB, available=64 * GiB))
    plan = make_plan(load_model(small), machine, build_request(parse_server_args(argv)))
    rows = [r for r in compare(plan.footprint, load_log(server_bin, small, argv)) if r.kind == "model"]
    assert rows and all(r.actual_mib is not None for r in rows)
    for r in rows:
        assert abs(r.predicted / 2**20 - (r.actual_mib or 0.0)) <= 0.006, (r.buft, r.predicted / 2**20, r.actual_mib)

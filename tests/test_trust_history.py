"""Calibration never plans from poisoned data: one model per plan, history records validated, whole lines.

The history file is input like any other: a hand edit, a torn write, another model launched under this
one's name, a FIFO in its place must not move a plan, and say so when something was ignored.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.devices.machine import Host, Machine
from llamafit.errors import ExitCode
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.memory.calibration import HistoryNotWritten, history_file, read_history, record
from llamafit.server.args import parse_server_args
from llamafit.units import GiB, MiB
from tests import factory

GPU = "12GiB"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.llama31_8b().write(tmp_path_factory.mktemp("m") / "llama31-8b.gguf")


def plan_json(model: Path, *args: str) -> dict[str, Any]:
    r = CliRunner().invoke(app, ["plan", str(model), "--gpu", GPU, "--json", *args])
    assert r.exit_code == 0, r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def write_launch(model: ModelInfo, compute_scale: float, tamper: dict[str, Any] | None = None) -> dict[str, Any]:
    """A launch record as `run` writes it (through calibration.record), for the plan --gpu 12GiB makes,
    with the compute buffers measured at ``compute_scale`` times the prediction."""
    from llamafit.devices.machine import Device

    machine = Machine((Device("CUDA0", "--gpu", 12 * GiB, 12 * GiB, source="override"),), Host(64 * GiB, 60 * GiB))
    p = make_plan(model, machine, build_request(parse_server_args([])))
    compute = {b.buft: b.nbytes * compute_scale / MiB for b in p.footprint.buffers if b.kind == "compute"}
    entry = record(model, p.settings, ("CUDA0",), p.footprint, {"compute": compute}, {"CUDA0": {"unacc": 384}},
                   {"argv": ["llama-server", "-m", model.path]})  # fmt: skip
    if tamper:
        for k, v in tamper.items():
            node = entry
            *path, last = k.split("__")
            for part in path:
                node = node[part]
            node[last] = v
        history_file().write_text(json.dumps(entry) + "\n")
    return entry


def test_a_second_model_among_the_server_flags_is_refused(model_path: Path, tmp_path: Path) -> None:
    other = factory.qwen3_0_6b().write(tmp_path / "other.gguf")
    for flag in ("-m", "--model", "-mu"):
        for cmd in ("plan", "run"):
            r = CliRunner().invoke(app, [cmd, str(model_path), "--gpu", GPU, "--dry-run" if cmd == "run" else "--json",
                                         "--", flag, str(other)])  # fmt: skip
            assert r.exit_code == ExitCode.USAGE, r.output
            assert "second model" in r.stderr and "Traceback" not in r.output


def test_a_sane_record_calibrates_the_next_plan(model_path: Path) -> None:
    model = load_model(model_path)
    base = plan_json(model_path)
    write_launch(model, 1.25)
    doc = plan_json(model_path)
    assert any(d["code"] == "calibration.applied" for d in doc["decisions"])
    assert doc["context"]["n_ctx"] < base["context"]["n_ctx"]  # larger compute buffers, less context


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        ({"scale": -1.0}, "not positive numbers"),
        ({"scale": 0.0}, "not positive numbers"),
        ({"scale": math.nan}, "not positive numbers"),
        ({"scale": math.inf}, "not positive numbers"),
        ({"actual_mib__compute": "lots"}, "not positive numbers"),
        ({"model": "oops"}, None),  # not even a record of this model
        ({"scale": 3.1}, "outside 0.5-2.0x"),
        ({"argv": ["llama-server", "-m", "/elsewhere/B.gguf"]}, "another model"),
        ({"breakdown_mib": {"CUDA0": {"unacc": -5000}}}, "breakdown"),
    ],
)
def test_a_record_that_would_poison_the_plan_is_ignored(model_path: Path, tamper: dict[str, Any], why: str) -> None:
    model = load_model(model_path)
    base = plan_json(model_path)
    scale = tamper.pop("scale", 1.25)
    if isinstance(scale, float) and (scale <= 0 or not math.isfinite(scale)):
        entry = write_launch(model, 1.0)
        entry["actual_mib"]["compute"] = {k: scale for k in entry["actual_mib"]["compute"]}
        history_file().write_text(json.dumps(entry) + "\n")
    else:
        write_launch(model, scale, tamper)
    doc = plan_json(model_path)
    assert doc["context"]["n_ctx"] == base["context"]["n_ctx"]  # the plan did not move
    if why is None:
        assert not any(d["code"] == "calibration.applied" for d in doc["decisions"])
    else:
        assert any(why in w for w in doc["warnings"]), doc["warnings"]


def test_a_torn_line_does_not_swallow_the_next_record(model_path: Path) -> None:
    model = load_model(model_path)
    history_file().parent.mkdir(parents=True, exist_ok=True)
    history_file().write_text('{"schema": "llamafit.history/1", "model": {"id": "x"')  # killed mid-write
    write_launch(model, 1.1)
    text = history_file().read_text()
    assert text.count("\n") == 2 and text.splitlines()[1].startswith("{")
    (rec,) = read_history()
    assert rec["model"]["name"] == model.name


def test_a_history_that_is_not_a_regular_file(model_path: Path) -> None:
    history_file().parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(history_file())
    assert read_history() == []  # never blocks on a FIFO
    plan_json(model_path)
    with pytest.raises(HistoryNotWritten, match="not a regular file"):
        write_launch(load_model(model_path), 1.1)


def test_a_data_directory_that_cannot_be_written(model_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:  # fmt: skip
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LLAMAFIT_DATA", str(blocker / "data"))
    with pytest.raises(HistoryNotWritten):
        write_launch(load_model(model_path), 1.1)

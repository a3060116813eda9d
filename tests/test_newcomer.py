"""A newcomer's first hour and the scripts that rely on every output: JSON when nothing fits, the URL on
stdout, output that a pipe gets whole, no footguns in --gpu/--min-ctx/-c, help that reads like a manual."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.cli.render import memory_tables, plan_view
from llamafit.errors import ExitCode
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.binary import ServerBinary
from llamafit.serving.compare import Row
from llamafit.units import MiB
from tests import factory

LLAMAFIT = [sys.executable, "-m", "llamafit"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.qwen3_8b().write(tmp_path_factory.mktemp("m") / "qwen3-8b.gguf")


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args))


# -- scripts ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", [["plan", "--json"], ["run", "--dry-run", "--json"]])
def test_json_when_nothing_fits(model: Path, cmd: list[str]) -> None:
    r = invoke(cmd[0], str(model), "--gpu", "2GiB", *cmd[1:], "--", "-c", "40960", "-ngl", "all")
    assert r.exit_code == ExitCode.DOES_NOT_FIT, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "llamafit.plan/1" and doc["fits"] is False
    dev = doc["devices"][0]
    assert dev["fits"] is False and dev["need"] > dev["usable"]
    assert doc["shortfall"]["CUDA0"] == dev["need"] - dev["usable"]
    assert doc["decisions"][0]["code"] == "fit.none" and "does not fit" in r.stderr
    assert doc["argv"][0].endswith("llama-server") and "-m" in doc["argv"]


def test_run_dry_run_json_is_the_plan(model: Path) -> None:
    r = invoke("run", str(model), "--gpu", "24GiB", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["fits"] is True and doc["shortfall"] == {} and "-c" in doc["argv"]


@pytest.mark.server
def test_the_url_is_data_on_stdout_even_quiet(server_bin: ServerBinary, tmp_path: Path) -> None:
    demo = ensure_demo_model(tmp_path)
    p = subprocess.Popen([*LLAMAFIT, "run", str(demo), "-q", "--server", server_bin.path, "--", "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # blocks until ready (bounded by the test timeout)
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert line.startswith("http://127.0.0.1:") and not line.strip().endswith(":0"), (line, err)
    assert rest == "" and p.returncode == 0


def test_a_pipe_gets_whole_lines(tmp_path: Path) -> None:
    long_name = "A model with a very long name " * 6
    path = factory.dense(name=long_name.strip()).write(tmp_path / "m.gguf")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # a plain pipe, no width set
    r = subprocess.run([*LLAMAFIT, "plan", str(path), "--gpu", "8GiB", "--min-ctx", "100000"], capture_output=True,
                       text=True, timeout=60, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert long_name.strip() in r.stdout.splitlines()  # not wrapped at 80 columns
    warning = next(line for line in r.stdout.splitlines() if "--min-ctx 100000" in line)
    assert len(warning) > 100  # one line, not broken mid-sentence


# -- footguns ----------------------------------------------------------------------------------------------


def test_gpu_needs_a_unit(model: Path) -> None:
    r = invoke("plan", str(model), "--gpu", "24")
    assert r.exit_code == ExitCode.USAGE and "give a unit" in r.stderr and "24GiB" in r.stderr


def test_run_refuses_hardware_that_is_not_here(model: Path) -> None:
    r = invoke("run", str(model), "--gpu", "24GiB")
    assert r.exit_code == ExitCode.USAGE and "--dry-run" in r.stderr


def test_cpu_only_and_gpu_together_are_refused(model: Path) -> None:
    r = invoke("plan", str(model), "--cpu-only", "--gpu", "24GiB")
    assert r.exit_code == ExitCode.USAGE and "choose one" in r.stderr


def test_context_words_match_the_argv(model: Path) -> None:
    r = invoke("plan", str(model), "--gpu", "24GiB", "--json", "--", "-c", "10000")
    doc = json.loads(r.stdout)
    msg = next(d["message"] for d in doc["decisions"] if d["code"] == "context.user")
    assert "Context 10000 as requested with -c (llama-server pads it to 10240)" in msg
    assert doc["argv"][doc["argv"].index("-c") + 1] == "10000"


def test_min_ctx_above_training_is_said_and_absurd_is_refused(model: Path) -> None:
    r = invoke("plan", str(model), "--gpu", "24GiB", "--json", "--min-ctx", "100000")
    doc = json.loads(r.stdout)
    assert any("above the model's training context 40960" in w for w in doc["warnings"])
    r = invoke("plan", str(model), "--gpu", "24GiB", "--min-ctx", "99999999999")
    assert r.exit_code == ExitCode.USAGE


def test_a_launch_on_other_devices_is_not_calibration(tmp_path: Path) -> None:
    """A server that used a device the plan was not made for is not recorded in the history."""
    from tests.test_trust_processes import READY, stand_in

    demo = ensure_demo_model(tmp_path / "m")
    using = 'print("0.00.000.000 I llama_prepare_model_devices: using device CUDA0 (gpu) (id) - 8000 MiB free", ' \
            "file=sys.stderr, flush=True)\n"  # fmt: skip
    srv = stand_in(tmp_path, using + READY + "time.sleep(1)\nsys.exit(0)\n")
    r = subprocess.run([*LLAMAFIT, "run", str(demo), "--server", srv], capture_output=True, text=True, timeout=60)
    assert "not recorded for calibration" in r.stderr and "CUDA0" in r.stderr
    h = subprocess.run([*LLAMAFIT, "history", "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(h.stdout)["launches"] == []


# -- reading ------------------------------------------------------------------------------------------------


def test_help_reads_like_a_manual() -> None:
    top = invoke("--help").stdout
    assert "..." not in top.split("Commands:")[1]  # summaries whole
    h = invoke("plan", "--help").stdout
    assert "MODEL" in h and "SERVER_ARGS" in h and "{model}" not in h and "server_args" not in h
    assert "Default: 1024 MiB" in h and "[default: 1024]" not in h
    assert "{shell}" not in invoke("completion", "--help").stdout


def test_the_human_plan_says_what_discovery_saw(model: Path) -> None:
    r = invoke("plan", str(model), "--cpu-only")
    assert r.exit_code == 0 and "--cpu-only: planning for host memory only" in r.stderr


def test_no_empty_decisions_heading_and_no_negative_zero(model: Path) -> None:
    from llamafit.devices.machine import Host, Machine
    from llamafit.fit import make_plan
    from llamafit.fit.request import build_request
    from llamafit.gguf.model import load_model

    p = make_plan(load_model(model), Machine((), Host(64 << 30, 60 << 30)), build_request(__import__(
        "llamafit.server.args", fromlist=["parse_server_args"]).parse_server_args([])))  # fmt: skip
    lines = [t.plain for t in plan_view(dataclasses.replace(p, decisions=()))]
    assert "Decisions" not in lines
    tables = memory_tables([Row("target", "kv", "CPU", int(4 * MiB), 4.001)])
    from rich.console import Console

    con = Console(width=200, record=True)
    for t in tables:
        con.print(t)
    text = con.export_text()
    assert "-0.00" not in text and "+0.00" in text

"""The commands that start the real llama-server: demo, run (pass-through, Ctrl-C, exit code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.args import OPTIONS
from llamafit.server.binary import ServerBinary, free_port
from tests.realserver import run_until_ready_then_interrupt

pytestmark = pytest.mark.server

LLAMAFIT = [sys.executable, "-m", "llamafit"]


def test_demo_runs_the_whole_pipeline(server_bin: ServerBinary) -> None:
    r = subprocess.run([*LLAMAFIT, "demo", "--json", "--server", server_bin.path], capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "llamafit.gguf.demo_model/1"
    assert doc["server"]["exit_code"] == 0
    assert doc["completion"]["tokens"] == 8
    rows = {(m["kind"], m["buffer"]): m for m in doc["memory"]}
    assert rows[("kv", "CPU")]["within_tolerance"] and rows[("kv", "CPU")]["actual_mib"] == 4.0
    assert all(m["within_tolerance"] for m in doc["memory"]), doc["memory"]
    assert "ready" in r.stderr


def test_demo_human_output(server_bin: ServerBinary) -> None:
    r = subprocess.run([*LLAMAFIT, "demo", "--server", server_bin.path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "completion of" in r.stdout
    # the predicted-vs-actual tables go where `run` puts them: stderr, beside the server's progress
    assert "Predicted vs actual" in r.stderr and "Predicted vs actual" not in r.stdout
    # the demo goes through run's pipeline, so its launch is in the history
    h = subprocess.run([*LLAMAFIT, "history", "--json"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and json.loads(h.stdout)["launches"], h.stderr


def test_run_passes_through_and_forwards_ctrl_c(server_bin: ServerBinary, tmp_path: Path) -> None:
    model = ensure_demo_model(tmp_path)
    port = free_port()
    rc, _out, err = run_until_ready_then_interrupt(
        [*LLAMAFIT, "run", str(model), "--", "--port", str(port)],
        port,
        timeout=120,
        env=dict(os.environ, LLAMAFIT_SERVER=server_bin.path),
    )
    assert rc == 0, err
    assert "llamafit:" in err and "-fit off" in err  # the decisions and the argv, then the server's own log
    assert "model loaded" in err or "listening" in err


def test_a_flag_the_server_refuses_is_explained(server_bin: ServerBinary, tmp_path: Path) -> None:
    model = ensure_demo_model(tmp_path)
    # a flag this binary does not list (its --completion-bash): refused before anything starts
    r = subprocess.run([*LLAMAFIT, "run", str(model), "--server", server_bin.path, "--", "--frobnicate"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "does not accept --frobnicate" in r.stderr
    # a flag it lists with a value it cannot use: the server refuses at start, and that is explained
    missing = tmp_path / "missing.jinja"
    r = subprocess.run([*LLAMAFIT, "run", str(model), "--server", server_bin.path, "--", "--chat-template-file",
                        str(missing)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 5, r.stderr  # a load failure, explained
    assert "missing.jinja" in r.stderr


def test_option_table_covers_the_real_binary(server_bin: ServerBinary) -> None:
    """Every flag this llama-server accepts (its --completion-bash list) is in the generated table."""
    r = subprocess.run([server_bin.path, "--completion-bash"], capture_output=True, text=True, env=server_bin.env(),
                       timeout=60)  # fmt: skip
    assert r.returncode == 0
    line = next(x for x in r.stdout.splitlines() if 'opts="' in x)
    accepted = set(line.split('opts="', 1)[1].split('"', 1)[0].split())
    known = {a for o in OPTIONS.values() for a in o.aliases}
    assert accepted, "no flags parsed from --completion-bash"
    assert accepted <= known, sorted(accepted - known)

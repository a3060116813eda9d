"""The serving life against hostile and faulty cases: secrets kept out of what others read, a metrics port that
cannot stop the server, readiness for every way the server listens, options that are not numbers, signals
during a restart's wait. Stand-in servers for the faults, the real llama-server where its own behaviour is
the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.args import REDACTED, redacted
from tests.realserver import CRASHES_AT_ONCE, READY, stand_in

LLAMAFIT = [sys.executable, "-m", "llamafit"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return ensure_demo_model(tmp_path / "m")


def run(args: list[str], timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLAMAFIT, "run", *args], capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


# -- secrets ----------------------------------------------------------------------------------------------


def test_a_secret_options_value_is_redacted_by_any_alias() -> None:
    argv = ["llama-server", "-m", "m.gguf", "--api-key", "k1", "-hft", "hf_x", "--hf-token", "hf_y", "--alias", "k1"]
    assert redacted(argv) == [*argv[:4], REDACTED, "-hft", REDACTED, "--hf-token", REDACTED, "--alias", "k1"]


def test_the_events_file_and_the_history_hold_no_key(tmp_path: Path, model: Path) -> None:
    events = tmp_path / "events.jsonl"
    srv = stand_in(tmp_path, READY + CRASHES_AT_ONCE)
    r = run([str(model), "--server", srv, "--restart", "no", "--liveness", "0", "--events", str(events), "--",
             "--api-key", "s3cret-key"])  # fmt: skip
    assert r.returncode == 137, r.stderr
    assert "s3cret-key" not in events.read_text() and "s3cret-key" not in r.stderr
    assert any(REDACTED in json.loads(line).get("text", "") for line in events.read_text().splitlines())
    assert events.stat().st_mode & 0o777 == 0o600  # created readable by its owner alone
    data = Path(os.environ["LLAMAFIT_DATA"])
    assert all("s3cret-key" not in p.read_text(errors="replace") for p in data.rglob("*") if p.is_file())

"""The router's instances kept alive while it serves, against the real router: a hung instance is unloaded,
killed and loaded again, a killed resident one is loaded again, each under its own metrics labels; with
``--restart no`` a dead instance is said and left unloaded."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from llamafit.options import Options
from llamafit.planning.planner import prepare
from llamafit.server.binary import ServerBinary, free_port
from llamafit.server.logparse import parse
from llamafit.serving.metrics import Metrics
from llamafit.serving.serve import KeepSettings
from llamafit.several.keeper import Keeper
from llamafit.several.router_log import Instance
from tests import factory
from tests.realserver import router_models, wait_for

pytestmark = pytest.mark.server


class Run:
    """``llamafit run`` with two models under the real router, its stderr in a file (it serves a while)."""

    def __init__(self, server: ServerBinary, tmp: Path, *args: str) -> None:
        one = factory.qwen3_0_6b().write(tmp / "one.gguf")
        two = factory.dense(name="two").write(tmp / "two.gguf")
        self.events, self.err = tmp / "events.jsonl", tmp / "stderr"
        self.port = free_port()
        cmd = [sys.executable, "-m", "llamafit", "run", str(one), str(two), "--cpu-only", "--events", str(self.events),
               *args, "--", "-c", "2048", "--no-warmup", "--port", str(self.port)]  # fmt: skip
        env = dict(os.environ, LLAMAFIT_SERVER=server.path)
        with self.err.open("w") as err:
            self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env)

    def said(self) -> str:
        return self.err.read_text()

    def ready(self) -> list[dict[str, object]]:
        """The instances llamafit saw ready, in order (whole lines only)."""
        whole = (self.events.read_text() if self.events.exists() else "").split("\n")[:-1]
        return [e for e in map(json.loads, whole) if e.get("event") == "instance_ready"]

    def instance(self, name: str) -> psutil.Process:
        """The router's child serving ``name`` now."""
        port = next(e["port"] for e in reversed(self.ready()) if e["model"] == name)
        kids = psutil.Process(self.p.pid).children(recursive=True)
        return next(c for c in kids if f"--port {port}" in " ".join(c.cmdline()))

    def models(self) -> dict[str, str]:
        return router_models(f"http://127.0.0.1:{self.port}")

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def _metrics(port: int) -> str:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/metrics")
    return c.getresponse().read().decode()


def test_a_hung_instance_is_reloaded_and_a_killed_one_loaded_again(server_bin: ServerBinary, tmp_path: Path) -> None:
    mport = free_port()
    run = Run(server_bin, tmp_path, "--liveness", "1", "--metrics", str(mport))
    try:
        assert wait_for(lambda: len(run.ready()) >= 2, 120), run.said()[-3000:]
        hung, killed = run.instance("one"), run.instance("two")
        os.kill(hung.pid, signal.SIGSTOP)
        killed.kill()
        # each loaded again on a port of its own: the hung one after 2 failed probes, the router's stop timeout
        # (10 s) and a second of backoff; the killed one after the backoff
        assert wait_for(lambda: len(run.ready()) >= 4, 90), run.said()[-3000:]
        assert {e["model"] for e in run.ready()[2:]} == {"one", "two"}
        assert wait_for(lambda: not hung.is_running() or hung.status() == psutil.STATUS_ZOMBIE, 10)
        said = run.said()
        assert "one stopped serving: its task loop did not answer /slots within 1 s (2 probes in a row)" in said, said
        assert "two stopped after it was ready:" in said and "loading it again in 1 s" in said
        assert run.models() == {"one": "loaded", "two": "loaded"}
        text = _metrics(mport)
        for name in ("one", "two"):
            assert f'llamafit_restarts_total{{model="{name}"}} 1.0' in text
            assert f'llamafit_server_up{{model="{name}"}} 1.0' in text
            assert f'llamafit_host_memory_bytes{{model="{name}"}}' in text
    finally:
        assert run.stop() == 0, run.said()[-3000:]
    # every instance's launch recorded as it stopped, with its host memory's high-water marks: four launches
    h = subprocess.run([sys.executable, "-m", "llamafit", "history", "--json"], capture_output=True, text=True)
    launches = json.loads(h.stdout)["launches"]
    assert len(launches) == 4, [e["model"]["name"] for e in launches]
    assert all(e["host_memory"]["peak_mib"] >= e["host_memory"]["at_ready_mib"] > 0 for e in launches)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--restart", "no"), "not loaded again (--restart no)"),
        (("--max-restarts", "0"), "not loaded again: restarted 0 times within 600 s (--max-restarts 0)"),
    ],
)
def test_a_dead_instance_past_its_restarts_is_said_and_left(
    server_bin: ServerBinary, tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    run = Run(server_bin, tmp_path, *args, "--liveness", "0")
    try:
        assert wait_for(lambda: len(run.ready()) >= 2, 120), run.said()[-3000:]
        run.instance("two").kill()
        assert wait_for(lambda: said in run.said(), 30), run.said()[-3000:]
        assert run.models() == {"one": "loaded", "two": "unloaded"}
        assert run.p.poll() is None  # the router serves on with the other model
    finally:
        run.stop()


def test_an_instance_seen_exiting_after_its_successor_is_ready_leaves_the_successor(
    server_bin: ServerBinary, tmp_path: Path
) -> None:
    """The router may report a killed hung instance's exit after the one loaded in its place is ready: that exit
    is the old port's, and the new instance keeps its probes and its `up` series."""
    model = factory.dense(name="one").write(tmp_path / "one.gguf")
    prep = prepare(str(model), Options(server=server_bin.path, server_args=("-c", "2048"), cpu_only=True), speed=False)
    metrics, said = Metrics("one"), []
    keeper = Keeper({"one": prep}, frozenset({"one"}), KeepSettings(metrics=metrics), said.append)
    keeper.ready(Instance("one", 40001, ready=True), parse([]), ())
    keeper.exited(Instance("one", 40000, ready=True, exit_code=-9))
    up = metrics.registry.get_sample_value("llamafit_server_up", {"model": "one"})
    assert up == 1.0 and keeper._kept["one"].port == 40001 and not said, said
    keeper.exited(Instance("one", 40001, ready=True, exit_code=-9))
    assert metrics.registry.get_sample_value("llamafit_server_up", {"model": "one"}) == 0.0
    keeper.stop()

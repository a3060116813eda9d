"""Several models kept by memory (issue #53): the budget that says which fit together, and the real router behind
llamafit's front: a model asked for is loaded once the least recently used ones that keep it from fitting are
unloaded, two that fit together stay together, a load that fails is said to the request that waits for it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from llamafit.server.binary import ServerBinary, free_port
from llamafit.server.endpoint import Endpoint
from llamafit.several import front
from llamafit.several.budget import Budget
from llamafit.several.front import Front
from tests import factory
from tests.realserver import wait_for

LLAMAFIT = [sys.executable, "-m", "llamafit"]
# no prompt cache: the footprints are the loads alone, so the budgets below are plain sums of the plans
SERVE = ("-c", "4096", "--no-warmup", "--cache-ram", "0")
GiB = 1 << 30


def test_room_is_made_least_recently_used_first_and_what_fits_stays() -> None:
    b = Budget({"host": 10 * GiB}, {"small": {"host": 1 * GiB}, "a": {"host": 6 * GiB}, "b": {"host": 6 * GiB}})
    assert b.room_for("a", ["small"]) == []  # fits beside it
    # b does not fit beside a: a goes; small, least recently used, is kept again (b fits beside it)
    assert b.room_for("b", ["small", "a"]) == ["a"]
    assert b.room_for("b", ["a", "small"]) == ["a"]
    assert b.room_for("huge", []) == []  # not in the budget: nothing of it is known, it uses nothing
    too = Budget({"host": 5 * GiB}, {"a": {"host": 6 * GiB}})
    assert too.room_for("a", []) is None
    assert b.resident_sets(["small", "a", "b"]) == [("small", "a"), ("small", "b")]


def test_every_device_is_held_to_its_own_budget() -> None:
    b = Budget({"CUDA0": 8 * GiB, "host": 32 * GiB},
               {"x": {"CUDA0": 5 * GiB, "host": 1 * GiB}, "y": {"CUDA0": 5 * GiB, "host": 1 * GiB},
                "z": {"CUDA0": 1 * GiB, "host": 20 * GiB}})  # fmt: skip
    assert not b.fits(["x", "y"]) and b.fits(["x", "z"])
    assert b.room_for("y", ["z", "x"]) == ["x"]


# -- the real router ----------------------------------------------------------------------------------


def _chat(port: int, model: str, timeout: float = 300) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"{}")


def _status(port: int) -> dict[str, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/models")
    doc = json.loads(c.getresponse().read())
    return {m["id"]: m["status"]["value"] for m in doc["data"]}


@pytest.fixture
def three(tmp_path: Path) -> dict[str, Path]:
    """A small model and two of the same larger size: the budget below holds the small one beside either larger
    one, never the two larger ones."""
    small = factory.dense(name="small", n_layer=4, n_embd=256, n_ff=512, n_vocab=512, w="q8_0")
    return {
        "small": small.write(tmp_path / "small.gguf"),
        "big-a": _larger("big-a", tmp_path / "big-a.gguf"),
        "big-b": _larger("big-b", tmp_path / "big-b.gguf"),
    }


def _larger(name: str, path: Path) -> Path:
    """A model of about 0.7 GiB planned at ``SERVE``: large enough that what the host has free moving between two
    plans does not move a budget set between two of them."""
    return factory.dense(name=name, n_layer=16, n_embd=1024, n_head=8, n_head_kv=8, n_ff=4096, n_vocab=32000,
                         w="q8_0").write(path)  # fmt: skip


def _plan_set(models: list[Path], server: str, margin: str) -> dict[str, Any]:
    argv = [*LLAMAFIT, "plan", *map(str, models), "--cpu-only", "--server", server, "--margin", margin, "--json",
            "--", *SERVE]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_three_models_share_the_machine_by_memory(three: dict[str, Path], server_bin: ServerBinary) -> None:
    models = [three["small"], three["big-a"], three["big-b"]]
    # a host budget that holds the small model beside one larger one, not the two larger ones: midway between the
    # two, so that what the host has free may move by half a larger model between the plans
    probe = _plan_set(models, server_bin.path, "1024")
    feet = {m["name"]: m["host"]["need"] for m in probe["models"]}
    room = (feet["small"] + 3 * feet["big-a"]) // 2
    margin = f"host={max(0, probe['host']['usable'] + 1024 * (1 << 20) - room) >> 20}MiB"
    doc = _plan_set(models, server_bin.path, margin)
    assert doc["policy"]["kind"] == "budget", doc["policy"]
    assert sorted(map(sorted, doc["policy"]["resident_sets"])) == [["big-a", "small"], ["big-b", "small"]]
    port = free_port()
    p = subprocess.Popen(
        [*LLAMAFIT, "run", *map(str, models), "--cpu-only", "--server", server_bin.path, "--margin", margin,
         "--liveness", "0", "--", *SERVE, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert p.stdout is not None
        url = p.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}", p.stderr.read() if p.stderr else ""
        names = sorted(_status(port))
        assert names == ["big-a", "big-b", "small"]
        seen: list[dict[str, str]] = []
        for name in ("small", "big-a", "big-b", "big-a", "small"):
            status, answer = _chat(port, name)
            assert status == 200, answer
            st = _status(port)
            seen.append(st)
            assert st[name] == "loaded"
            assert not (st["big-a"] == "loaded" and st["big-b"] == "loaded"), st  # never both larger ones
        assert seen[1]["small"] == "loaded"  # after the larger one answered, the small one is still there
        assert seen[2]["small"] == "loaded" and seen[2]["big-a"] != "loaded"
        # a cold model costs its load; a warm one answers at once
        t0 = time.monotonic()
        assert _chat(port, "small")[0] == 200
        assert time.monotonic() - t0 < 30
    finally:
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
    assert "unloaded to make room" in err, err
    assert not [q for q in psutil.process_iter(["cmdline"]) if str(three["big-a"]) in " ".join(q.info["cmdline"] or [])]


@pytest.mark.slow
def test_a_load_that_fails_is_said_to_the_request_that_waits(tmp_path: Path, server_bin: ServerBinary) -> None:
    good, bad = _larger("good", tmp_path / "g.gguf"), _larger("bad", tmp_path / "b.gguf")
    probe = _plan_set([good, bad], server_bin.path, "1024")
    feet = {m["name"]: m["host"]["need"] for m in probe["models"]}
    room = int(1.5 * feet["g"])
    margin = f"host={max(0, probe['host']['usable'] + 1024 * (1 << 20) - room) >> 20}MiB"
    assert _plan_set([good, bad], server_bin.path, margin)["policy"]["kind"] == "budget"
    port = free_port()
    p = subprocess.Popen(
        [*LLAMAFIT, "run", str(good), str(bad), "--cpu-only", "--server", server_bin.path, "--margin", margin,
         "--liveness", "0", "--", *SERVE, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == f"http://127.0.0.1:{port}"
        bad.write_bytes(b"GGUF" + b"\0" * 64)  # broken after it was planned: its load fails
        status, answer = _chat(port, "b", timeout=120)
        assert status == 503 and "b failed to load" in answer["error"]["message"], answer
        assert wait_for(lambda: _chat(port, "g")[0] == 200, 60)  # the others serve on
    finally:
        os.killpg(p.pid, signal.SIGINT)
        p.communicate(timeout=120)


def test_slow_clients_cannot_exhaust_the_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half-sent requests beyond the front's bound are closed as they are accepted (each would hold a descriptor and a
    thread for as long as the client likes): the front serves the ones within it, and answers again once they go."""
    monkeypatch.setattr(front, "MAX_CLIENTS", 4)
    f = Front(("127.0.0.1", 0), Endpoint("http://127.0.0.1:9"), Budget({"host": GiB}, {}), lambda _e: None).start()
    host, port = f.address
    held: list[socket.socket] = []
    try:
        for _ in range(4):
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x")  # half a request, never finished
            held.append(s)
        time.sleep(0.3)
        over = socket.create_connection((host, port), timeout=5)
        assert over.recv(1) == b""  # over the bound: closed at once
        over.close()
        for s in held:
            s.close()
        held.clear()
        time.sleep(0.3)
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", "/health")
        assert c.getresponse().status == 502  # served again: passed on to a router that is not there
    finally:
        for s in held:
            s.close()
        f.stop()


def test_a_load_asked_again_while_it_is_made_starts_no_second_one() -> None:
    """``POST /models/load`` for a model whose room is being made answers at once and adds no second background
    load: a client asking in a loop cannot pile up threads that each wait for the room."""
    import threading

    f = Front(("127.0.0.1", 0), Endpoint("http://127.0.0.1:9"), Budget({"host": GiB}, {}), lambda _e: None)
    try:
        with f._room:  # the room is being made for another model: the background load waits for it
            assert all(f._load_asked("a") for _ in range(5))
            assert sum(1 for t in threading.enumerate() if t.name == "load a") == 1
        assert wait_for(lambda: not any(t.name == "load a" for t in threading.enumerate()), 10)
        assert f._load_asked("a") and wait_for(lambda: "a" not in f._asked, 10)  # asked again once it ended
    finally:
        f.stop()

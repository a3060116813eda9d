#!/usr/bin/env python3
"""What llamafit's front (several models kept by memory, ``llamafit.several.front``) adds to a served request: the
same streamed completion asked of the real router directly and through the front before it, in alternating rounds,
its time to the first token and between tokens on each side; and a request's answer for a model that is loaded
(the front's bookkeeping only) against one that must be loaded first (the wait for room).

Usage: python bench/front.py [--rounds 5] [--tokens 64]

Writes bench/results/front.json and prints the table. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llamafit.server.binary import find_server, free_port  # noqa: E402
from llamafit.server.endpoint import Endpoint  # noqa: E402
from llamafit.server.supervisor import Supervisor  # noqa: E402
from llamafit.several.budget import Budget  # noqa: E402
from llamafit.several.front import Front  # noqa: E402
from tests import factory  # noqa: E402


def stream(port: int, model: str, tokens: int) -> tuple[float, list[float]]:
    """Time to the first streamed chunk and the intervals between the chunks of one completion; fails unless
    every piece came back with HTTP 200."""
    body = json.dumps({"model": model, "prompt": "hello", "n_predict": tokens, "stream": True, "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = time.perf_counter()
    c.request("POST", "/completion", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()[:300]
    stamps = []
    while line := r.readline():
        if line.startswith(b"data: "):
            stamps.append(time.perf_counter())
    c.close()
    assert len(stamps) >= tokens, f"{len(stamps)} chunks for {tokens} tokens"
    return stamps[0] - t0, [b - a for a, b in itertools.pairwise(stamps)]


def loaded_by(port: int, model: str, seconds: float) -> None:
    """Wait until the router says ``model`` (loaded on startup) is loaded."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/models")
        doc = json.loads(c.getresponse().read())
        c.close()
        if any(m["id"] == model and m["status"]["value"] == "loaded" for m in doc["data"]):
            return
        time.sleep(0.1)
    raise SystemExit(f"{model} was not loaded within {seconds:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    srv = find_server()
    with tempfile.TemporaryDirectory() as d:
        # a token in tens of milliseconds on a CPU, as a served one takes: each streamed on its own (a model
        # generating thousands a second sends several in one read, and the gaps between them say nothing)
        shape = {"n_layer": 8, "n_embd": 1024, "n_head": 8, "n_head_kv": 8, "n_ff": 4096, "n_vocab": 32000,
                 "w": "q8_0"}  # fmt: skip
        models = {n: factory.dense(name=n, **shape).write(Path(d) / f"{n}.gguf") for n in ("warm", "cold")}  # type: ignore[arg-type]
        preset = Path(d) / "preset.ini"
        preset.write_text("version = 1\n" + "".join(f"\n[{n}]\nmodel = {p}\nc = 512\nwarmup = false\n"
                                                    f"load-on-startup = {'true' if n == 'warm' else 'false'}\n"
                                                    for n, p in models.items()))  # fmt: skip
        router_port = free_port()
        argv = [srv.path, "--models-preset", str(preset), "--models-max", str(len(models)), "--no-models-autoload",
                "--host", "127.0.0.1", "--port", str(router_port)]  # fmt: skip
        sup = Supervisor(argv, srv.env(), probe="/models")
        sup.start()
        try:
            sup.wait_ready(120)
            budget = Budget({"host": 1 << 40}, {n: {"host": 1} for n in models})
            front = Front(("127.0.0.1", 0), Endpoint(f"http://127.0.0.1:{router_port}"), budget, lambda _e: None)
            front.start()
            front_port = front.address[1]
            loaded_by(router_port, "warm", 120)
            stream(router_port, "warm", 4)  # the instance warm
            sides: dict[str, dict[str, list[float]]] = {s: {"first": [], "gap": []} for s in ("router", "front")}
            for _ in range(a.rounds):
                for side, port in (("router", router_port), ("front", front_port)):
                    first, gaps = stream(port, "warm", a.tokens)
                    sides[side]["first"].append(first)
                    sides[side]["gap"].append(statistics.fmean(gaps))  # the stream's pace, however it is read
            t0 = time.perf_counter()
            stream(front_port, "cold", 4)  # loaded by the front first
            cold = time.perf_counter() - t0
            front.stop()
        finally:
            sup.stop()
    out: dict[str, dict[str, float]] = {
        side: {
            "first_token_ms": 1000 * statistics.median(v["first"]),
            "per_token_ms": 1000 * statistics.median(v["gap"]),
        }
        for side, v in sides.items()
    }
    out["added"] = {k: out["front"][k] - out["router"][k] for k in ("first_token_ms", "per_token_ms")}
    out["cold_load_s"] = {"front": cold}
    print("| path | first token ms | between tokens ms |\n|---|---:|---:|")
    for side in ("router", "front", "added"):
        print(f"| {side} | {out[side]['first_token_ms']:.2f} | {out[side]['per_token_ms']:.3f} |")
    print(f"a request for a model not loaded: {cold:.2f} s through the front (its load included)")
    (HERE / "results" / "front.json").write_text(json.dumps({"rounds": a.rounds, "tokens": a.tokens, **out}, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A served llama-server kept alive and watched: faults recovered, memory held to the plan, the cost.

* Faults, each on a real ``llamafit run`` (the real llama-server and the demo model; stand-ins where a
  fault cannot be staged on the real one), timed from the fault to llamafit saying the server is ready again
  (its ``--events`` file), or to llamafit stopping with the reason: SIGKILL of the server, SIGSTOP (a hang),
  a server that answers its task loop but fails every generation, a restart loop (a server that dies at once
  after ready, again and again). After each: no process of it left, the history file still parses.
* A soak (``--minutes``, default 3): distinct prompts of varied length against the real server while
  llamafit watches it; the watch's peak of RssAnon + VmSwap against an independent reading of
  /proc/PID/smaps_rollup (Anonymous + Swap) taken by this script, and against what the plan allowed.
* The watch's own CPU time per sample, from the launch's history record.

Usage: python bench/keep_alive.py [--minutes M] [--server PATH]

Writes bench/results/keep_alive.json and prints the numbers. Not a test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import psutil  # noqa: E402

from llamafit.gguf.demo_model import ensure_demo_model  # noqa: E402
from llamafit.server.binary import find_server, free_port  # noqa: E402
from llamafit.server.liveness import probe  # noqa: E402
from tests.realserver import CRASHES_AT_ONCE, FAILS_GENERATIONS, READY, stand_in  # noqa: E402

LLAMAFIT = [sys.executable, "-m", "llamafit"]


def servers_of(p: subprocess.Popen[str], port: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(p.pid).children(recursive=True)
        return [c for c in kids if c.name() == "llama-server" and f"--port {port}" in " ".join(c.cmdline())]
    except psutil.Error:
        return []


def alive(c: psutil.Process) -> bool:
    try:
        return c.is_running() and c.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def until(pred: Callable[[], object], timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def serves(port: int) -> bool:
    return probe(f"http://127.0.0.1:{port}", 5) is None


def launch(model: Path, server: str, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    argv = [*LLAMAFIT, "run", str(model), "--server", server, *extra, "--", "--port", str(port)]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    return p, port


def ended(p: subprocess.Popen[str]) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
    try:
        return p.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()[1]


def events_of(path: Path) -> list[dict[str, object]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def real_fault(tmp: Path, model: Path, server: str, env: dict[str, str], sig: signal.Signals) -> dict[str, object]:
    """The fault is sent once llamafit itself said the server is ready (its --events file), and timed to its
    next "ready": the server serving again under llamafit."""
    events = tmp / f"events-{sig.name}.jsonl"
    p, port = launch(model, server, env, "--liveness", "2", "--max-restarts", "2", "--events", str(events))
    row: dict[str, object] = {"fault": f"{sig.name} of the server", "liveness_s": 2}
    first: psutil.Process | None = None
    later: list[psutil.Process] = []

    def readies() -> int:
        return sum(e.get("event") == "ready" for e in events_of(events))

    try:
        if until(lambda: readies() == 1 and servers_of(p, port), 120) is None:
            return {**row, "error": "never ready"}
        first = servers_of(p, port)[0]
        os.kill(first.pid, sig)
        t = until(lambda: readies() == 2, 120)
        row["serving_again_s"] = round(t, 2) if t is not None else None
        row["answers"] = serves(port)
        later = servers_of(p, port)
    finally:
        ended(p)
    row["left_running"] = (first is not None and alive(first)) or any(alive(c) for c in later)
    row["said"] = next((e["text"] for e in events_of(events) if e.get("event") == "notice"), None)
    return row


def stand_in_fault(tmp: Path, model: Path, env: dict[str, str], name: str, body: str) -> dict[str, object]:
    d = tmp / name
    d.mkdir()
    srv = stand_in(d, body)
    t0 = time.monotonic()
    r = subprocess.run([*LLAMAFIT, "run", str(model), "--server", srv, "--liveness", "1", "--max-restarts", "3"],
                       capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    said = [ln.strip() for ln in r.stderr.splitlines() if "not started again" in ln or "starting it again" in ln]
    return {"fault": name, "stopped_after_s": round(time.monotonic() - t0, 2), "exit": r.returncode,
            "restarts": sum("starting it again" in s for s in said), "said": said[-1] if said else None}  # fmt: skip


def smaps_anon(pid: int) -> int | None:
    """Anonymous + Swap of /proc/PID/smaps_rollup: a reading independent of the watch's /proc/PID/status."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kb = {k.strip(): int(v.split()[0]) for k, _, v in (ln.partition(":") for ln in text.splitlines()[1:]) if v}
    return (kb.get("Anonymous", 0) + kb.get("Swap", 0)) * 1024


def complete(port: int, prompt: str, n: int) -> None:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0.8})
        c.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
        c.getresponse().read()
    finally:
        c.close()


def soak(model: Path, server: str, env: dict[str, str], minutes: float) -> dict[str, object]:
    p, port = launch(model, server, env, "--watch", "5")
    if until(lambda: serves(port) and servers_of(p, port), 120) is None:
        ended(p)
        return {"error": "never served"}
    (srv,) = servers_of(p, port)[:1]
    rng = random.Random(7)
    words = [
        "the",
        "a",
        "model",
        "memory",
        "cache",
        "token",
        "server",
        "slot",
        "prompt",
        "layer",
        "graph",
        "buffer",
        "device",
    ]
    own_peak, requests, t_end = 0, 0, time.monotonic() + minutes * 60
    while time.monotonic() < t_end:
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(5, 600))) + f" #{requests}"
        complete(port, prompt, rng.randint(1, 64))
        requests += 1
        own_peak = max(own_peak, smaps_anon(srv.pid) or 0)
    ended(p)
    h = subprocess.run([*LLAMAFIT, "history", "--json"], capture_output=True, text=True, env=env, timeout=60)
    mem = json.loads(h.stdout)["launches"][-1].get("host_memory") or {}
    peak = float(mem.get("peak_mib", 0))
    own = own_peak / (1 << 20)
    return {
        "minutes": minutes, "requests": requests, "watch_peak_mib": peak, "independent_peak_mib": round(own, 2),
        "agreement": round(abs(peak - own) / own, 4) if own else None, "allowed_mib": mem.get("allowed_mib"),
        "at_ready_mib": mem.get("at_ready_mib"), "within_plan": peak <= float(mem.get("allowed_mib", 0)),
        "samples": mem.get("samples"), "watch_cpu_ms": mem.get("cpu_ms"),
        "watch_cpu_share": round(mem["cpu_ms"] / 1e3 / (minutes * 60), 6) if mem.get("cpu_ms") else None,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--server")
    a = ap.parse_args()
    srv = find_server(a.server)
    tmp = Path(tempfile.mkdtemp(prefix="llamafit-keepalive-"))
    env = dict(os.environ, LLAMAFIT_DATA=str(tmp / "data"), LLAMAFIT_PROBE="off")
    model = ensure_demo_model(tmp / "m")
    faults = [real_fault(tmp, model, srv.path, env, s) for s in (signal.SIGKILL, signal.SIGSTOP)]
    faults.append(stand_in_fault(tmp, model, env, "answers, fails every generation", FAILS_GENERATIONS))
    faults.append(stand_in_fault(tmp, model, env, "a restart loop (dies at once after ready)", READY + CRASHES_AT_ONCE))
    for f in faults:
        print(json.dumps(f))
    history_ok = subprocess.run([*LLAMAFIT, "history", "--json"], capture_output=True, env=env).returncode == 0
    s = soak(model, srv.path, env, a.minutes)
    print(json.dumps(s))
    out = {"server": srv.path, "faults": faults, "history_intact": history_ok, "soak": s}
    (HERE / "results" / "keep_alive.json").write_text(json.dumps(out, indent=1) + "\n")
    print("wrote bench/results/keep_alive.json")


if __name__ == "__main__":
    main()

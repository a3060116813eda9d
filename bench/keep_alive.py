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
import contextlib
import http.client
import json
import os
import random
import shutil
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
from llamafit.serving.liveness import probe  # noqa: E402
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


SAID: dict[int, Path] = {}  # llamafit's stderr, by pid: a file, since a pipe nobody reads while it serves fills
# and blocks llamafit's writes (then the server's, then its probes fail)


def launch(model: Path, server: str, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    argv = [*LLAMAFIT, "run", str(model), "--server", server, *extra, "--", "--port", str(port)]
    err = Path(tempfile.mkstemp(prefix="llamafit-keepalive-", suffix=".err")[1])
    with err.open("w") as f:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=f, text=True, env=env)
    SAID[p.pid] = err
    return p, port


def ended(p: subprocess.Popen[str]) -> str:
    """Stop llamafit (SIGINT, SIGKILL after 60 s); what it said."""
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    err = SAID.pop(p.pid, None)
    if err is None:
        return ""
    text = err.read_text(errors="replace")
    err.unlink(missing_ok=True)
    return text


def events_of(path: Path) -> list[dict[str, object]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def signal_fault(sig: signal.Signals) -> tuple[str, Callable[[psutil.Process, int], None]]:
    return f"{sig.name} of the server", lambda server, _port: os.kill(server.pid, sig)


def out_of_memory(server: psutil.Process, port: int) -> None:
    """A run-time out-of-memory: the server's address space capped 64 MiB above what it holds, then a request
    whose allocation fails (the server logs std::bad_alloc and hangs)."""
    cap = server.memory_info().vms + (64 << 20)
    subprocess.run(["prlimit", "--pid", str(server.pid), f"--as={cap}"], check=True)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    with contextlib.suppress(OSError, http.client.HTTPException):
        c.request("POST", "/completion", body=json.dumps({"prompt": "word " * 400, "n_predict": 4}))
        c.getresponse().read()
    c.close()


def real_fault(
    tmp: Path, model: Path, server: str, env: dict[str, str], fault: tuple[str, Callable[[psutil.Process, int], None]]
) -> dict[str, object]:
    """The fault is made once llamafit itself said the server is ready (its --events file), and timed to its
    next "ready": the server serving again under llamafit."""
    name, make = fault
    events = tmp / f"events-{len(list(tmp.glob('events-*')))}.jsonl"
    p, port = launch(model, server, env, "--liveness", "2", "--max-restarts", "2", "--events", str(events))
    row: dict[str, object] = {"fault": name, "liveness_s": 2}
    first: psutil.Process | None = None
    later: list[psutil.Process] = []

    def readies() -> int:
        return sum(e.get("event") == "ready" for e in events_of(events))

    try:
        if until(lambda: readies() == 1 and servers_of(p, port), 120) is None:
            return {**row, "error": "never ready"}
        first = servers_of(p, port)[0]
        t0 = time.monotonic()
        make(first, port)
        t = until(lambda: readies() == 2, 120)
        row["serving_again_s"] = round(time.monotonic() - t0, 2) if t is not None else None
        row["answers"] = serves(port)
        later = servers_of(p, port)
    finally:
        ended(p)
    row["left_running"] = (first is not None and alive(first)) or any(alive(c) for c in later)
    row["said"] = next((e["text"] for e in events_of(events) if e.get("event") == "notice"), None)
    return row


def router_faults(tmp: Path, model: Path, server: str, env: dict[str, str]) -> dict[str, object]:
    """Under the router (two models): one instance SIGSTOPped and another SIGKILLed at once, each timed to
    llamafit saying it is ready again (its instance_ready event)."""
    other = tmp / "second.gguf"
    shutil.copy(model, other)
    events, port = tmp / "events-router.jsonl", free_port()
    argv = [*LLAMAFIT, "run", str(model), str(other), "--server", server, "--liveness", "2", "--events", str(events),
            "--", "--port", str(port)]  # fmt: skip
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def readies() -> list[dict[str, object]]:
        return [e for e in events_of(events) if e.get("event") == "instance_ready"]

    row: dict[str, object] = {"fault": "router: one instance SIGSTOPped, another SIGKILLed", "liveness_s": 2}
    hit: list[psutil.Process] = []
    try:
        if until(lambda: len(readies()) >= 2, 120) is None:
            return {**row, "error": "never ready"}
        kids = psutil.Process(p.pid).children(recursive=True)
        for e, sig in zip(readies(), (signal.SIGSTOP, signal.SIGKILL), strict=True):
            hit.append(next(c for c in kids if f"--port {e['port']}" in " ".join(c.cmdline())))
            row[f"{e['model']}"] = sig.name
        t0 = time.monotonic()
        for c, sig in zip(hit, (signal.SIGSTOP, signal.SIGKILL), strict=True):
            os.kill(c.pid, sig)
        again: dict[str, float] = {}
        while len(again) < 2 and time.monotonic() - t0 < 120:
            for e in readies()[2:]:
                again.setdefault(str(e["model"]), round(time.monotonic() - t0, 2))
            time.sleep(0.05)
        row["ready_again_s"] = {str(k): again.get(str(k)) for k, v in row.items() if v in ("SIGSTOP", "SIGKILL")}
    finally:
        ended(p)
    row["left_running"] = any(alive(c) for c in hit)
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
    failed: list[str] = []
    try:
        while time.monotonic() < t_end:
            prompt = " ".join(rng.choice(words) for _ in range(rng.randint(5, 600))) + f" #{requests}"
            try:
                complete(port, prompt, rng.randint(1, 64))
            except (OSError, http.client.HTTPException) as e:  # the server's HTTP layer dropped one: counted
                failed.append(f"request {requests}: {e!r}")
                if len(failed) > 10 or p.poll() is not None:
                    return {"error": "; ".join(failed[-3:]), "llamafit_said": ended(p)[-4000:]}
            requests += 1
            own_peak = max(own_peak, smaps_anon(srv.pid) or 0)
    except BaseException:  # an interrupt of the bench: nothing of the run is left behind
        ended(p)
        raise
    # the prompt cache grows ~8 MiB a second under this load: the watch samples every 5 s, so its last sample
    # can be 5 s behind the last request. Quiet for one interval, both read the same memory.
    time.sleep(6)
    own_peak = max(own_peak, smaps_anon(srv.pid) or 0)
    ended(p)
    h = subprocess.run([*LLAMAFIT, "history", "--json"], capture_output=True, text=True, env=env, timeout=60)
    mem = json.loads(h.stdout)["launches"][-1].get("host_memory") or {}
    peak = float(mem.get("peak_mib", 0))
    own = own_peak / (1 << 20)
    return {
        "minutes": minutes, "requests": requests, "dropped": failed, "watch_peak_mib": peak,
        "independent_peak_mib": round(own, 2),
        "agreement": round(abs(peak - own) / own, 4) if own else None, "allowed_mib": mem.get("allowed_mib"),
        "at_ready_mib": mem.get("at_ready_mib"), "within_plan": peak <= float(mem.get("allowed_mib", 0)),
        "samples": mem.get("samples"), "watch_cpu_ms": mem.get("cpu_ms"),
        "watch_cpu_share": round(mem["cpu_ms"] / 1e3 / (minutes * 60), 6) if mem.get("cpu_ms") else None,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--server")
    ap.add_argument("--soak-only", action="store_true", help="the soak again, the faults' results kept")
    a = ap.parse_args()
    srv = find_server(a.server)
    tmp = Path(tempfile.mkdtemp(prefix="llamafit-keepalive-"))
    env = dict(os.environ, LLAMAFIT_DATA=str(tmp / "data"), LLAMAFIT_PROBE="off")
    model = ensure_demo_model(tmp / "m")
    if a.soak_only:  # the soak again, the faults' results kept
        s = soak(model, srv.path, env, a.minutes)
        print(json.dumps(s))
        path = HERE / "results" / "keep_alive.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "soak": s}, indent=1) + "\n")
        return
    made = [signal_fault(signal.SIGKILL), signal_fault(signal.SIGSTOP), ("run-time out of memory", out_of_memory)]
    faults = [real_fault(tmp, model, srv.path, env, f) for f in made]
    faults.append(router_faults(tmp, model, srv.path, env))
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

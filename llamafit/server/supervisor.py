"""Run llama-server under supervision: stream its log, notice when it is ready, forward signals.

The one process runner of llamafit (``run``, ``demo``, the tests and the benchmarks). Silent like the
rest of the core: what to show is decided by the callbacks the CLI passes. The server's stdout and
stderr are read as one stream, line by line as they come, on a reader thread, so the caller can talk
to a ready server (``complete``) while its log keeps flowing; ``--log-file`` keeps every raw line.
Readiness is llama-server's own ``listening on`` line, which it prints after the model is loaded and
its signal handlers are installed (tools/server/server.cpp:498-527), in its own format (``SRV_INF``'s
prefix), confirmed on the port: the server's process listens there and its task loop answers. A model's
metadata, which llama.cpp prints into the same log, cannot pass for it. A server killed by a signal is
reported the way a shell does (128 + N, so SIGABRT is 134).
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import psutil

from llamafit.errors import ServerLoadError, ServerNotFoundError, UsageError
from llamafit.server.children import Guardian, die_with_parent
from llamafit.server.endpoint import Endpoint, endpoint_of
from llamafit.server.failures import Failure, classify
from llamafit.server.logparse import LoadLog, parse, strip

_LEVEL = re.compile(r"^(?:\x1b\[[0-9;]*m)*\d+\.\d{2}\.\d{3}\.\d{3} (?:\x1b\[[0-9;]*m)*(?P<level>[IWED]) ")
# SRV_INF's prefix (tools/server/server-common.h:35: "srv  %12.*s: ", the function in 12 characters) and
# server.cpp:526; b9310's said "server is listening on URL" (its router "router server is ...", in that build's
# own server.cpp), and builds before those "main: server is listening on URL - starting the main loop"
_LISTEN = re.compile(
    r"^srv +[\w()~]{1,12}: (?:(?:router )?server is )?listening on (?P<url>(?:https?|unix)://\S+)$"
    r"|^main: server is listening on (?P<old>https?://\S+) - starting the main loop$"
)
KEY_EVENTS = (
    "loading model",
    "model loaded",
    "listening on",
    "initializing, n_slots",
    "loading draft model",
    "creating MTP draft context",
    "speculative decoding context initialized",
    "loaded multimodal model",
    "exiting due to",
    "shutting down",
    "Received second interrupt",
)


CONFIRM_TIMEOUT = 30.0  # from `listening on` to the task loop answering: milliseconds on a healthy server
# from a forwarded interrupt to the server's exit: seconds when healthy. llama-server's signal handler can
# deadlock in exit() (it calls exit from the handler; seen with the malloc lock held), so past this it is killed
STOP_GRACE = 30.0
MAX_LINE = 16384  # characters kept of one log line (the --log-file keeps it whole)
MAX_LOAD_BYTES = 32 << 20  # log kept up to ready: the memory lines are there
TAIL_LINES = 400  # log kept after ready, for classifying a crash


def listening_url(raw: str) -> str | None:
    """The URL of llama-server's own ``listening on`` line, None for any other line (one that merely holds
    the words, as a model's name printed into the log can)."""
    if "listening on" not in raw:
        return None
    m = _LISTEN.match(strip(raw))
    return (m.group("url") or m.group("old")) if m else None


def url_port(url: str) -> int | None:
    """The port of a URL, None when it has none or not one a socket can have."""
    try:
        return urlsplit(url).port
    except ValueError:
        return None


def line_level(raw: str) -> str:
    """I, W, E or D for a prefixed llama.cpp log line, "" for anything else."""
    m = _LEVEL.match(raw)
    return m.group("level") if m else ""


def is_key_line(raw: str) -> bool:
    """Shown without --verbose: warnings, errors and the events a user waits for."""
    lvl = line_level(raw)
    if lvl in ("W", "E"):
        return True
    if not lvl and raw.strip():
        return "error" in raw.lower() or "warn" in raw.lower()
    return any(k in raw for k in KEY_EVENTS)


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Outcome:
    ready: bool
    url: str | None
    returncode: int
    failure: Failure | None
    log: LoadLog
    lines: list[str] = field(repr=False, default_factory=list)
    interrupted: bool = False
    killed_after: float | None = None  # seconds it was given to stop after an interrupt before SIGKILL


@dataclass(frozen=True)
class Hooks:
    """What a supervisor tells its caller, on its own threads: each line the server writes, ready (the URL and the
    load's log), a warning of the supervisor's own (a line it could not read, a log file it could not write)."""

    on_line: Callable[[str], None] | None = None
    on_ready: Callable[[str, LoadLog], None] | None = None
    on_warning: Callable[[str], None] | None = None


class Supervisor:
    """One llama-server child: started, its lines read and kept, ready when it answers ``probe``, stopped with it.
    ``planned``: each device's planned total and usable bytes, for a failure's words (``failures.classify``);
    ``stop_grace``: the seconds an interrupted server is given to stop before SIGKILL."""

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        log_file: Path | None = None,
        hooks: Hooks = Hooks(),
        planned: tuple[dict[str, int], dict[str, int]] | None = None,
        probe: str = "/slots",
        stop_grace: float = STOP_GRACE,
    ) -> None:
        on_line, on_ready, on_warning = hooks.on_line, hooks.on_ready, hooks.on_warning
        predicted, usable = planned if planned is not None else (None, None)
        self.argv = list(argv)
        self.probe = probe  # what the task loop answers once ready (the router: /models)
        self.stop_grace = stop_grace
        self.killed_after: float | None = None
        self.env = env
        self.log_file = log_file
        self.log_lost: str | None = None
        self.on_warning = on_warning
        self.on_line = on_line
        self.on_ready = on_ready
        self.predicted = predicted
        self.usable = usable
        self.lines: list[str] = []
        self.url: str | None = None
        self.endpoint: Endpoint | None = None  # where it answers, once ready (its prefix and key with it)
        self._listener: psutil.Process | None = None  # the process that listens there, when not the child
        self.interrupted = False
        self.timed_out: float | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._kept_bytes = 0
        self._announcer: threading.Thread | None = None
        self._sink: IO[str] | None = None
        self._guardian: Guardian | None = None
        self._line_failed = False  # a callback failed on a line (said once)

    # -- the process ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server in a session of its own (the terminal's Ctrl-C reaches llamafit alone, which
        forwards one interrupt), tied to llamafit's life (it is killed when llamafit dies, even by SIGKILL:
        PR_SET_PDEATHSIG on Linux)."""
        if self.log_file is not None:
            try:
                self._sink = open(self.log_file, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
            except OSError as e:
                raise UsageError(f"cannot write the log file {self.log_file}: {e.strerror or e}") from None
        self._proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        # the router's model instances are not tied to llamafit's life: its process group is guarded
        self._guardian = Guardian(self._proc.pid)
        self._reader = threading.Thread(target=self._pump, name="llama-server log", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        """Read the log to its end, whatever a line holds: a callback that fails on one is said once, and the
        reading goes on (a server whose pipe is not read blocks)."""
        assert self._proc is not None and self._proc.stdout is not None
        for whole in self._proc.stdout:
            raw = whole if len(whole) <= MAX_LINE else whole[:MAX_LINE] + f" ... ({len(whole) - MAX_LINE} more)\n"
            self._keep(raw)
            if self._sink is not None:
                self._to_log_file(whole)
            try:
                if self.on_line:
                    self.on_line(raw.rstrip("\n"))
            except Exception as e:  # a bug of a callback must not stop the supervision
                if not self._line_failed and self.on_warning:
                    self.on_warning(f"a line of the server's log could not be read ({type(e).__name__}: {e})")
                self._line_failed = True
            if self.url is None and self._announcer is None and (url := listening_url(raw)) is not None:
                # confirmed on its own thread, so the log keeps flowing meanwhile
                self._announcer = threading.Thread(
                    target=self._announce, args=(url,), name="llama-server ready", daemon=True
                )
                self._announcer.start()

    def _to_log_file(self, whole: str) -> None:
        """The log file keeps every byte, while it can: a full disk or a lost mount stops the copy (said
        once), never the reading of the server's log that supervision needs."""
        assert self._sink is not None
        try:
            self._sink.write(whole)
            self._sink.flush()
        except (OSError, ValueError) as e:
            self.log_lost = f"the log file {self.log_file} stopped taking lines ({getattr(e, 'strerror', None) or e})"
            with contextlib.suppress(OSError, ValueError):
                self._sink.close()
            self._sink = None
            if self.on_warning:
                self.on_warning(self.log_lost + "; the server runs on, its log is no longer copied")

    def _keep(self, raw: str) -> None:
        """What the load report and the failure classification need, bounded: the lines up to ready (the
        memory lines are there) within MAX_LOAD_BYTES, then a tail."""
        if not self._ready.is_set() and self._kept_bytes + len(raw) <= MAX_LOAD_BYTES:
            self.lines.append(raw)
            self._kept_bytes += len(raw)
        else:
            self._tail.append(raw)

    def _announce(self, url: str) -> None:
        """Ready once the task loop answers at ``url``: llama-server prints ``listening on`` just before its
        task loop starts, and a shutdown asked for in between is lost (start_loop sets ``running``,
        server-queue.cpp:279); ``/slots`` is answered by that loop (server-context.cpp:5085-5100). A line
        that is not the server's (nothing of its process listens there, or it still loads: the real line
        comes after the load) is passed over, and the next one is waited for."""
        endpoint = endpoint_of(url, self.argv, self.env)
        why = self._confirm(endpoint, time.monotonic() + CONFIRM_TIMEOUT)
        if why is not None or not self.running:
            if self.running and self.on_warning:
                said = f"a log line said the server listens on {url}, but it does not answer there ({why})"
                self.on_warning(said + ": ignored")
            self._announcer = None
            return
        self.url, self.endpoint = url, endpoint
        self._ready.set()
        if self.on_ready:
            self.on_ready(url, parse(list(self.lines)))

    @property
    def pid(self) -> int | None:
        """The server's process id, once started."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait_ready(self, timeout: float) -> str:
        """The server's URL once it serves; ServerLoadError if it exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if not self.running:
                assert self._reader is not None
                self._reader.join(timeout=5)
                if self._ready.is_set():
                    break
                rc = exit_status(self._proc.returncode if self._proc else 0)
                tail = "".join(self.lines[-8:]).strip()
                raise ServerLoadError(
                    f"llama-server exited with code {rc} before it was ready" + (f":\n{tail}" if tail else ""),
                    hint="run with --verbose to see the whole log",
                )
            if time.monotonic() > deadline:
                raise ServerLoadError(f"llama-server was not ready after {timeout:.0f} s")
        assert self.url is not None
        return self.url

    def _confirm(self, endpoint: Endpoint, deadline: float) -> str | None:
        """None when the server's own process (or one of its children: a wrapper script may run llama-server as
        its child) listens at ``endpoint`` and its task loop answers ``self.probe`` there; else why not."""
        if endpoint.scheme not in ("http", "https", "unix") or (endpoint.scheme != "unix" and endpoint.port is None):
            return "not an HTTP URL with a port, nor a unix socket"
        if not self._listens(endpoint):
            return "its process does not listen there"
        why = "its task loop did not answer"
        while self.running and time.monotonic() < deadline:
            try:
                status, _ = endpoint.request("GET", self.probe, 2.0)
                # 200: the loop answered; 501: --no-slots; 401/403: an API key: nothing more to learn
                if status in (200, 401, 403, 501):
                    return None
                if status == 503:
                    return "it answered 503 (still loading)"  # the real line comes after the load
                why = f"it answered HTTP {status}" + (
                    f" at {endpoint.prefix}{self.probe}" if endpoint.prefix and status == 404 else ""
                )
            except ConnectionRefusedError:
                return "the connection was refused"
            except (OSError, http.client.HTTPException) as e:
                why = f"it did not answer ({getattr(e, 'strerror', None) or type(e).__name__})"
            time.sleep(0.05)
        return why

    def _listens(self, endpoint: Endpoint) -> bool:
        """The server's process or one of its descendants listens at ``endpoint`` (True when the system does
        not say); the one that does is kept, to be stopped with the server."""
        assert self._proc is not None
        try:
            root = psutil.Process(self._proc.pid)
            tree = [root, *root.children(recursive=True)]
        except (psutil.Error, OSError):
            return True
        said = False
        for proc in tree:
            try:
                if endpoint.socket_path is not None:
                    hit = any(_path(c.laddr) == endpoint.socket_path for c in proc.net_connections("unix"))
                else:
                    conns = proc.net_connections("inet")
                    hit = any(
                        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == endpoint.port for c in conns
                    )
            except (psutil.Error, OSError):
                continue
            said = True
            if hit:
                self._listener = proc if proc.pid != root.pid else None
                return True
        return not said

    def _signal(self, signum: int) -> None:
        """``signum`` to the server, and to the process that listens when that is another (a wrapper script
        that runs llama-server as its child passes no signal on)."""
        assert self._proc is not None
        if self._proc.poll() is None:
            self._proc.send_signal(signum)
        if self._listener is not None:
            with contextlib.suppress(psutil.Error, OSError):
                self._listener.send_signal(signum)

    def stop(self, timeout: float = 30.0) -> Outcome:
        """SIGINT (llama-server's graceful shutdown), then SIGKILL if it lingers."""
        if self.running:
            assert self._proc is not None
            self._signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        return self._finish()

    def run(
        self,
        ready_timeout: float | None = None,
        stop_when: Callable[[], bool] | None = None,
        stop_after: float = 15.0,
    ) -> Outcome:
        """Start the server and supervise it until it exits. SIGINT and SIGTERM are forwarded to it once
        each (a second Ctrl-C is the user insisting: llama-server then stops at once); SIGHUP, a closed
        terminal, stops it like SIGTERM; a server still running ``stop_grace`` seconds after the first one
        is killed. A server not ready after ``ready_timeout`` seconds is stopped, and so is one for which
        ``stop_when()`` turns true (checked a few times a second; killed if still running ``stop_after``
        seconds later)."""
        self.start()
        assert self._proc is not None
        proc = self._proc
        started = time.monotonic()
        asked: list[float] = []  # when the first interrupt was forwarded

        def forward(signum: int, _frame: object) -> None:
            self.interrupted = True
            asked.append(time.monotonic())
            if proc.poll() is None:
                self._signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            while proc.poll() is None:
                try:
                    proc.wait(timeout=0.2)  # a short wait keeps the signal handlers running
                except subprocess.TimeoutExpired:
                    if ready_timeout and not self._ready.is_set() and time.monotonic() - started > ready_timeout:
                        self.timed_out = ready_timeout
                        self.stop(timeout=10)
                    elif asked and time.monotonic() - asked[0] > self.stop_grace:
                        self.killed_after = self.stop_grace
                        proc.kill()
                    elif stop_when is not None and stop_when():
                        self.stop(timeout=stop_after)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        return self._finish()

    def _finish(self) -> Outcome:
        assert self._proc is not None
        try:
            self._proc.wait()
        finally:
            if self._proc.poll() is None:  # pragma: no cover - only on an exception while waiting
                self._proc.kill()
                self._proc.wait()
        # whatever the server left behind in its session (a child holding the log pipe open) goes with it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        if self._guardian is not None:
            self._guardian.release()
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._announcer is not None:
            self._announcer.join(timeout=CONFIRM_TIMEOUT)
        if self._sink is not None:
            with contextlib.suppress(OSError, ValueError):  # a full disk refuses the last buffered bytes too
                self._sink.close()
            self._sink = None
        code = exit_status(self._proc.returncode)
        ready = self._ready.is_set()
        lines = [*self.lines, *self._tail]
        failure = None if ready else classify(lines, self._proc.returncode, self.predicted, self.usable)
        if failure is not None and self.timed_out:
            failure = Failure(
                "timeout",
                f"llama-server was not ready after {self.timed_out:.0f} s and was stopped",
                "raise --ready-timeout for a slow disk or a large model, or run with --verbose",
            )
        return Outcome(ready, self.url, code, failure, parse(self.lines), lines, self.interrupted, self.killed_after)

    # -- talking to it ----------------------------------------------------------------------------

    def complete(self, prompt: str, n_predict: int = 8, timeout: float = 120.0) -> dict[str, Any]:
        """One /completion request to the ready server."""
        if self.endpoint is None:
            raise ServerLoadError("llama-server is not ready")
        body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True})
        try:
            status, data = self.endpoint.request("POST", "/completion", timeout, body)
        except (OSError, http.client.HTTPException) as e:
            raise ServerLoadError(f"/completion at {self.endpoint.shown()} failed: {e}") from None
        if status != 200:
            raise ServerLoadError(f"/completion answered HTTP {status}: {data[:200]!r}")
        out: dict[str, Any] = json.loads(data)
        return out


def _path(laddr: object) -> str | None:
    """A unix socket's path as psutil gives it (a string), None for an address of another family."""
    return laddr if isinstance(laddr, str) else None


def exec_server(argv: Sequence[str], env: dict[str, str]) -> None:  # pragma: no cover - replaces the process
    """Hand the process over to the server (``--exec``): for scripts and service managers."""
    try:
        os.execvpe(argv[0], list(argv), env)
    except OSError as e:
        raise ServerNotFoundError(f"could not start {argv[0]}: {e.strerror or e}") from None

"""Never hang, never leave a server behind: real processes, real signals, stand-in servers for the faults.

A stand-in here is a small script in the server's place that misbehaves in one precise way (never
answers --help, never gets ready, keeps the log pipe open after it exits, crashes after ready, floods
the log); the rest runs against the real llama-server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from llamafit.errors import ExitCode
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.binary import ServerBinary, free_port
from llamafit.server.supervisor import STOP_GRACE, Hooks, Supervisor
from tests.realserver import READY, health, stand_in, wait_for

LLAMAFIT = [sys.executable, "-m", "llamafit"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return ensure_demo_model(tmp_path / "m")


def children_named(pid: int, name: str) -> list[psutil.Process]:
    """The children whose command line names ``name``, less a fork not yet exec'd (the guardian's shell, for a
    moment, still carries its parent's command line: seen once in CI as a second "child")."""
    try:
        parents = {p.pid: p.cmdline() for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]}
        return [c for c in psutil.Process(pid).children(recursive=True)
                if name in " ".join(c.cmdline()) and c.cmdline() != parents.get(c.ppid())]  # fmt: skip
    except psutil.NoSuchProcess:
        return []


def seen(found: list[psutil.Process], pid: int, name: str) -> bool:
    """Fills ``found`` the first time such children exist: a second lookup could race a start."""
    if not found:
        found.extend(children_named(pid, name))
    return bool(found)


# -- the server dies with llamafit --------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM])
def test_the_server_does_not_outlive_llamafit(server_bin: ServerBinary, model: Path, sig: signal.Signals) -> None:
    port = free_port()
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", server_bin.path, "--", "--port", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        found: list[psutil.Process] = []  # the server as first seen (a second lookup could race its start)
        assert wait_for(lambda: seen(found, p.pid, "--port"), 60), "no server started"
        (server,) = found
        assert wait_for(lambda: health(port) == 200, 60)
        os.kill(p.pid, sig)
        # llama-server's own SIGTERM handler can hang in exit(): llamafit kills it STOP_GRACE s later, so the wait
        # is longer than that (30 s exactly raced the kill)
        assert wait_for(lambda: not server.is_running() or server.status() == psutil.STATUS_ZOMBIE, STOP_GRACE + 15), (
            f"llama-server still runs after llamafit got {sig.name}"
        )
    finally:
        p.kill()
        p.wait()


STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("stubborn: up", flush=True)
time.sleep(600)
"""
DRIVER = """
import json, sys
from llamafit.server.supervisor import STOP_GRACE, Supervisor
out = Supervisor([sys.executable, "-c", sys.argv[1]], {}, stop_grace=1.5).run()
print(json.dumps({"killed_after": out.killed_after, "interrupted": out.interrupted}), flush=True)
"""


def test_a_server_that_does_not_stop_after_the_interrupt_is_killed() -> None:
    """llama-server's signal handler can hang in exit() (seen: malloc's lock held by the interrupted
    thread); a server that ignores the forwarded interrupt is killed after the grace period, not waited on."""
    import json

    p = subprocess.Popen([sys.executable, "-c", DRIVER, STUBBORN], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)  # fmt: skip
    try:
        found: list[psutil.Process] = []
        assert wait_for(lambda: seen(found, p.pid, "stubborn"), 30), "the child never started"
        (child,) = found
        time.sleep(0.3)  # the driver's handlers are installed once run() is past start()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert json.loads(out.splitlines()[-1]) == {"killed_after": 1.5, "interrupted": True}, err
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


@pytest.mark.server
def test_ctrl_c_on_the_terminal_reaches_the_server_once(server_bin: ServerBinary, model: Path) -> None:
    """A terminal's Ctrl-C signals the whole foreground group; the server must get one interrupt (its
    clean shutdown), not two (its 'terminating immediately' path)."""
    port = free_port()
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", server_bin.path, "--", "--port", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        assert wait_for(lambda: health(port) == 200, 60)  # ready (the port opens before the model loads)
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)  # what the terminal does
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "second interrupt" not in err.lower()


def test_a_script_that_ignores_sigint_still_stops_the_server(tmp_path: Path, model: Path) -> None:
    body = (
        f"{READY}signal.signal(signal.SIGINT, lambda *a: sys.exit(0))\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True: time.sleep(0.05)\n"
    )
    srv = stand_in(tmp_path, body)
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", srv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    try:
        assert wait_for(lambda: bool(children_named(p.pid, "llama-server")), 30)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err


# -- every wait has a bound -------------------------------------------------------------------------------


def test_a_server_that_never_answers_its_probe(tmp_path: Path, model: Path) -> None:
    hang = "#!{python}\nimport time\nwhile True: time.sleep(1)\n"
    srv = stand_in(tmp_path, "", header=hang)
    t = time.monotonic()
    r = subprocess.run([*LLAMAFIT, "plan", str(model), "--server", srv], capture_output=True, text=True, timeout=60)
    assert r.returncode == ExitCode.SERVER_NOT_FOUND, r.stderr
    assert time.monotonic() - t < 20 and "did not answer" in r.stderr
    assert not [p for p in psutil.process_iter(["cmdline"]) if srv in " ".join(p.info["cmdline"] or [])]


@pytest.mark.parametrize("cmd", [["run", "--dry-run"], ["run", "--exec"], ["plan"], ["demo"]])
def test_a_text_file_with_x_is_not_a_server(tmp_path: Path, model: Path, cmd: list[str]) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text("this is not a program\n")
    fake.chmod(0o755)
    argv = [*LLAMAFIT, cmd[0], *([] if cmd[0] == "demo" else [str(model)]), *cmd[1:], "--server", str(fake)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == ExitCode.SERVER_NOT_FOUND, r.stderr
    assert "cannot be run" in r.stderr and "internal error" not in r.stderr


def test_a_server_that_never_gets_ready(tmp_path: Path, model: Path) -> None:
    srv = stand_in(tmp_path, "while True: time.sleep(0.05)\n")
    t = time.monotonic()
    r = subprocess.run([*LLAMAFIT, "run", str(model), "--server", srv, "--ready-timeout", "2"], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == ExitCode.SERVER_LOAD_FAILED, r.stderr
    assert time.monotonic() - t < 20 and "not ready after 2 s" in r.stderr


def test_a_child_that_holds_the_log_open_after_the_server_exits(tmp_path: Path, model: Path) -> None:
    pid_file = tmp_path / "child.pid"  # this test's own child, not any `sleep 300` on the machine
    body = (
        f"import subprocess\nc = subprocess.Popen(['sleep', '300'])\nopen({str(pid_file)!r}, 'w').write(str(c.pid))\n"
        'print("0.00.000.000 E srv  main: exiting due to model loading error", file=sys.stderr)\nsys.exit(1)\n'
    )
    srv = stand_in(tmp_path, body)
    t = time.monotonic()
    r = subprocess.run([*LLAMAFIT, "run", str(model), "--server", srv], capture_output=True, text=True, timeout=60)
    assert r.returncode == ExitCode.SERVER_LOAD_FAILED, r.stderr
    assert time.monotonic() - t < 20
    child = int(pid_file.read_text())
    assert wait_for(lambda: not _alive(child), 5), "the server's child outlived llamafit"


def _alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and p.cmdline()[:2] == ["sleep", "300"]
    except psutil.NoSuchProcess:
        return False


# -- after ready ------------------------------------------------------------------------------------------


def test_a_crash_after_ready_is_said(tmp_path: Path, model: Path) -> None:
    srv = stand_in(tmp_path, f"{READY}time.sleep(0.5)\nos.kill(os.getpid(), signal.SIGABRT)\n")
    argv = [*LLAMAFIT, "run", str(model), "--server", srv, "--restart", "no"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 134
    assert "stopped after it was ready: killed by SIGABRT (exit 134)" in r.stderr


def test_the_log_kept_in_memory_is_bounded(tmp_path: Path) -> None:
    flood = (
        'print("W " + "x" * 10_000_000, file=sys.stderr)\n'
        'for i in range(200_000): print(f"I line {i}", file=sys.stderr)\n'
    )
    srv = stand_in(tmp_path, READY + flood)
    shown: list[str] = []
    out = Supervisor([srv], dict(os.environ), hooks=Hooks(on_line=shown.append)).run()
    assert out.ready and out.returncode == 0
    assert len(out.lines) <= 1000 and sum(map(len, out.lines)) < 1_000_000
    assert "I line 199999\n" in out.lines[-1]
    big = [line for line in shown if line.startswith("W ")]
    assert len(big) == 1 and len(big[0]) < 20_000 and big[0].endswith("more)")

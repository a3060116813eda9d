"""Faults and hostile sources: a Hub that drips or lies, files that are not files, outputs that are
inputs, a full disk, thousands of entries, and every failure's exit code and JSON document.

Each case runs the real command line (``python -m llamafit``, so Click's own errors go the same way as
ours) against the loopback Hub, stand-in servers that misbehave in one precise way, or the real
llama-server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamafit.errors import ExitCode
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.binary import ServerBinary, free_port
from llamafit.several.preset import router_name
from llamafit.several.together import resident_counts
from tests import factory
from tests.hubserver import FakeHub
from tests.realserver import READY, STAND_IN_FLAGS, launch_run, read_json_doc, router_models, stop_run
from tests.realserver import stand_in as server_stand_in

LLAMAFIT = [sys.executable, "-m", "llamafit"]

ROUTER_FLAGS = f"{STAND_IN_FLAGS} --models-preset --models-max --no-warmup"


def stand_in(tmp_path: Path, body: str) -> str:
    return server_stand_in(tmp_path, body, flags=ROUTER_FLAGS)


def cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLAMAFIT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip


def no_traceback(r: subprocess.CompletedProcess[str]) -> bool:
    return "Traceback" not in r.stderr and "internal error" not in r.stderr


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory: pytest.TempPathFactory, demo: Path) -> Iterator[FakeHub]:
    d = tmp_path_factory.mktemp("hubfiles")
    broken = d / "broken.gguf"
    broken.write_bytes(b"<html>not a model</html>" * 100)
    hub = FakeHub()
    hub.add("acme/tiny", {"tiny-Q8_0.gguf": demo})
    hub.add("acme/escape", {"../../../../planted/evil-Q4_K_M.gguf": demo})
    hub.add("acme/escaped", {"tiny-Q8_0.gguf": demo}, commit="../../../escaped")
    hub.add("acme/broken", {"m-Q4_K_M.gguf": broken, "m-Q8_0.gguf": broken})
    hub.add("acme/many", {f"m-Q{i}_K.gguf": demo for i in range(3000)})
    yield hub.start()
    hub.stop()


# -- the Hub: bounded, validated, and never showing a password -----------------------------------------


@pytest.mark.parametrize(("fault", "args"), [("drip_info", []), ("drip_info", ["--quants"]), ("drip_file", [])])
def test_a_hub_that_drips_its_answer_is_cut_at_the_deadline(hub: FakeHub, fault: str, args: list[str]) -> None:
    hub.fault = fault
    try:
        t = time.monotonic()
        r = cli("plan", "acme/tiny", "--gpu", "8GiB", *args, env={"LLAMAFIT_HUB_TIMEOUT": "3"}, timeout=60)
        elapsed = time.monotonic() - t
    finally:
        hub.fault = None
    assert r.returncode == ExitCode.NETWORK, r.stderr
    assert "got no answer within 3 s" in r.stderr and no_traceback(r)
    assert elapsed < 25


@pytest.mark.parametrize(("repo", "said"), [("acme/escape", "would leave the repo"),
                                            ("acme/escaped", "not a commit id")])  # fmt: skip
@pytest.mark.parametrize("cmd", [["plan"], ["run", "--dry-run"]])
def test_hub_paths_and_commits_that_leave_the_cache_are_refused(hub: FakeHub, repo: str, said: str,
                                                                cmd: list[str]) -> None:  # fmt: skip
    r = cli(*cmd, repo, "--gpu", "8GiB")
    assert r.returncode == ExitCode.MODEL_NOT_FOUND, r.stderr
    assert said in r.stderr and no_traceback(r) and "planted" not in r.stdout and "escaped" not in r.stdout


@pytest.mark.parametrize("fault", ["html", None])
def test_credentials_in_the_endpoint_are_never_shown(hub: FakeHub, fault: str | None) -> None:
    port = hub.url.rsplit(":", 1)[1] if fault else str(free_port())  # a live Hub that lies, or nothing there
    hub.fault = fault
    try:
        r = cli("plan", "acme/tiny", "--gpu", "8GiB", env={"HF_ENDPOINT": f"http://user:S3cret@127.0.0.1:{port}"})
    finally:
        hub.fault = None
    assert r.returncode == ExitCode.NETWORK, r.stderr
    assert "S3cret" not in r.stderr + r.stdout and "***@127.0.0.1" in r.stderr


def test_every_quant_broken_is_one_answer(hub: FakeHub) -> None:
    ladder = cli("plan", "acme/broken", "--quants", "--gpu", "8GiB")
    best = cli("plan", "acme/broken:best", "--gpu", "8GiB")
    assert ladder.returncode == best.returncode == ExitCode.MODEL_NOT_FOUND, ladder.stderr + best.stderr
    said = [next(x for x in r.stderr.splitlines() if x.startswith("error:")) for r in (ladder, best)]
    assert said[0] == said[1] and "no quant of acme/broken could be planned" in said[0]


def test_a_listing_of_thousands_of_quants_is_bounded_work(hub: FakeHub) -> None:
    t = time.monotonic()
    ladder = cli("plan", "acme/many", "--quants", "--gpu", "8GiB")
    assert ladder.returncode == ExitCode.USAGE and "lists 3000 quants" in ladder.stderr, ladder.stderr
    assert time.monotonic() - t < 30  # refused before 3000 header reads
    hub.reset_counts()
    best = cli("plan", "acme/many:best", "--gpu", "8GiB", "--json")
    assert best.returncode == 0, best.stderr
    assert len(hub.file_requests()) < 40  # a bisection: a few headers of the 3000


# -- files: read only if regular, written only atomically and never over an input -------------------


def test_a_preset_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "p.ini"
    os.mkfifo(fifo)
    r = cli("plan", "--models-preset", str(fifo), timeout=30)
    assert r.returncode == ExitCode.USAGE and "not a regular file" in r.stderr, r.stderr


def test_an_output_that_is_an_input_is_refused(tmp_path: Path, demo: Path) -> None:
    a, b = factory.qwen3_0_6b().write(tmp_path / "a.gguf"), factory.qwen3_0_6b().write(tmp_path / "b.gguf")
    before = a.read_bytes()
    r = cli("plan", str(a), str(b), "--cpu-only", "--models-preset-out", str(a))
    assert r.returncode == ExitCode.USAGE and "is also an input" in r.stderr, r.stderr
    assert a.read_bytes() == before
    ini = tmp_path / "in.ini"
    ini.write_text(f"[a]\nmodel = {a}\n\n[b]\nmodel = {b}\n")
    r = cli("plan", "--models-preset", str(ini), "--cpu-only", "--models-preset-out", str(ini))
    assert r.returncode == ExitCode.USAGE and "is also an input" in r.stderr and ini.read_text().startswith("[a]")
    fifo = tmp_path / "out.fifo"  # a device node is refused alike; a FIFO is one nobody minds testing
    os.mkfifo(fifo)
    r = cli("plan", str(a), str(b), "--cpu-only", "--models-preset-out", str(fifo))
    assert r.returncode == ExitCode.USAGE and "not a regular file" in r.stderr and fifo.is_fifo()
    r = cli("plan", str(a), str(b), "--cpu-only", "--models-preset-out", str(a / "x.ini"))
    assert r.returncode == ExitCode.USAGE and "cannot write the preset" in r.stderr and no_traceback(r)
    out = tmp_path / "planned.ini"
    assert cli("plan", str(a), str(b), "--cpu-only", "--models-preset-out", str(out)).returncode == 0
    assert out.read_text().count("[") == 2 and sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == []


def test_a_log_file_on_a_full_disk_stops_the_copy_not_the_supervision(tmp_path: Path, demo: Path) -> None:
    srv = stand_in(tmp_path, READY + "for i in range(200): print('line', i, file=sys.stderr, flush=True)\n"
                   "time.sleep(1)\n")  # fmt: skip
    r = cli("run", str(demo), "--server", srv, "--log-file", "/dev/full", "--ready-timeout", "30", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "stopped taking lines" in r.stderr and no_traceback(r)
    r = cli("run", str(demo), "--server", srv, "--log-file", str(tmp_path / "no" / "such" / "dir" / "x.log"))
    assert r.returncode == ExitCode.USAGE and "cannot write the log file" in r.stderr, r.stderr
    r = cli("run", str(demo), "--server", srv, "--log-file", str(demo))
    assert r.returncode == ExitCode.USAGE and "is also an input" in r.stderr, r.stderr


def test_a_folder_of_more_files_than_are_planned_says_so(tmp_path: Path) -> None:
    for i in range(4097):
        (tmp_path / f"m-{i:05d}-Q8_0.gguf").touch()
    r = cli("plan", str(tmp_path), "--quants", "--gpu", "8GiB")
    assert r.returncode == ExitCode.USAGE and "more than 4096 GGUF files" in r.stderr, r.stderr


# -- several models: the router's names, bounded work, Ctrl-C ---------------------------------------


@pytest.mark.parametrize(("section", "name"), [("qwen:latest", "qwen:LATEST"), ("repo:UD-Q4_K_XL", "repo:Q4_K_XL"),
                                               ("a:b.q8_0", "a:Q8_0"), ("plain", "plain"), ("x:ſ", "x:ſ")])  # fmt: skip
def test_sections_are_named_as_the_router_names_them(section: str, name: str) -> None:
    assert router_name(section) == name


def test_the_number_resident_is_found_by_bisection() -> None:
    asked: list[int] = []

    def fits(k: int) -> bool:
        asked.append(k)
        return k <= 7

    assert resident_counts(100, fits) == [7] and len(asked) <= 8
    assert resident_counts(5, lambda k: True) == [5]


def test_a_preset_of_thousands_of_sections_is_bounded_work(tmp_path: Path, demo: Path) -> None:
    ini = tmp_path / "big.ini"
    ini.write_text("".join(f"[m{i}]\nmodel = {demo}\n" for i in range(3500)))
    t = time.monotonic()
    r = cli("plan", "--models-preset", str(ini), "--cpu-only", timeout=60)
    assert r.returncode == ExitCode.USAGE and "3500 models" in r.stderr, r.stderr
    assert time.monotonic() - t < 30


def test_ctrl_c_while_the_router_starts_is_an_interrupt(tmp_path: Path, demo: Path) -> None:
    srv = stand_in(
        tmp_path,
        """
names = [l.strip()[1:-1] for l in open(args[args.index("--models-preset") + 1]) if l.startswith("[")]
def stop(*_):
    for n in names:
        print(f"srv  log: instance name={n} exited with status 1", file=sys.stderr, flush=True)
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
for i, n in enumerate(names):
    print(f"srv  load: spawning server instance with name={n} on port {40000 + i}", file=sys.stderr, flush=True)
while True: time.sleep(0.1)
""",
    )
    other = factory.qwen3_0_6b().write(tmp_path / "other.gguf")
    p = subprocess.Popen([*LLAMAFIT, "run", str(demo), str(other), "--server", srv, "--cpu-only", "--verbose",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stderr is not None
    seen = ""
    deadline = time.monotonic() + 60
    while "spawning server instance" not in seen and time.monotonic() < deadline:
        seen += p.stderr.readline()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == ExitCode.INTERRUPTED, seen + err
    assert "failed to load" not in err and json.loads(out)["error"]["kind"] == "interrupted"


# -- exits and messages ----------------------------------------------------------------------------------


def test_every_failure_under_json_prints_one_document(tmp_path: Path, demo: Path, hub: FakeHub) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    dies = stand_in(tmp_path, 'print("0.00.000.000 E srv  main: exiting due to model loading error", '
                              "file=sys.stderr)\nsys.exit(1)\n")  # fmt: skip
    small = ["--gpu", "1MiB", "--margin", "host=1000000GiB"]
    cases = [
        (["plan", str(demo), "--margin", "lots"], ExitCode.USAGE),
        (["plan", str(demo), "--min-ctx", "5"], ExitCode.USAGE),  # Click's own check
        (["plan", str(demo), "--no-such-option"], ExitCode.USAGE),
        (["plan", str(tmp_path / "missing.gguf")], ExitCode.MODEL_NOT_FOUND),
        (["plan", str(demo), "--server", str(tmp_path / "nope")], ExitCode.SERVER_NOT_FOUND),
        (["plan", str(bad), "--gpu", "8GiB"], ExitCode.BAD_MODEL_FILE),
        (["plan", "acme/nothing-here", "--gpu", "8GiB"], ExitCode.MODEL_NOT_FOUND),
        (["plan", str(demo), *small], ExitCode.DOES_NOT_FIT),
        (["plan", str(demo), str(demo), *small], ExitCode.DOES_NOT_FIT),
        (["run", str(demo), "--server", dies], ExitCode.SERVER_LOAD_FAILED),
    ]
    for args, code in cases:
        r = cli(*args, "--json")
        assert r.returncode == code, (args, r.stderr)
        doc = json.loads(r.stdout)  # one document, whatever failed
        assert doc["error"]["exit_code"] == code and doc["error"]["message"], (args, doc)
        assert doc["schema"] == ("llamafit.plan/1" if args == ["plan", str(demo), *small] else "llamafit.error/1")
        if code in (ExitCode.DOES_NOT_FIT, ExitCode.SERVER_LOAD_FAILED) and doc["schema"] == "llamafit.error/1":
            assert doc["plan"]["schema"] == "llamafit.plan/1"  # the plan that was made


def test_ipv6_rpc_endpoints_are_refused_before_llama_cpp_aborts(demo: Path) -> None:
    for ep in ("[::1]:50052", "::1:50052"):
        r = cli("plan", str(demo), "--rpc", ep)
        assert r.returncode == ExitCode.USAGE and "cannot take an IPv6 address" in r.stderr, r.stderr


@pytest.mark.server
def test_an_rpc_peer_that_sends_garbage_is_said(server_bin: ServerBinary, demo: Path) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def garbage() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.sendall(os.urandom(64))
            c.close()

    threading.Thread(target=garbage, daemon=True).start()
    try:
        r = cli("plan", str(demo), "--rpc", f"127.0.0.1:{port}", "--server", server_bin.path, timeout=90)
    finally:
        srv.close()
    assert r.returncode == ExitCode.NETWORK, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("error:"))
    assert "No such file or directory" not in line and "libc-start" not in line and f"127.0.0.1:{port}" in line


def test_a_closed_stdout_is_an_ordinary_exit(demo: Path) -> None:
    for args in (["plan", str(demo), "--gpu", "8GiB"], ["plan", str(demo), "--gpu", "8GiB", "--json"]):
        p = subprocess.Popen([*LLAMAFIT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout is not None
        p.stdout.close()  # `| true`: the reader is gone before anything is written
        _, err = p.communicate(timeout=60)
        assert p.returncode == ExitCode.OUTPUT_CLOSED and "Traceback" not in err and "internal error" not in err


@pytest.mark.parametrize("digits", [400, 5000])
def test_numbers_of_hundreds_of_digits_are_usage_errors(demo: Path, digits: int) -> None:
    n = "1" * digits
    for args in (["--margin", n], ["--gpu", f"{n}GiB"], ["--gpu", f"8GiB@{n}GB/s"], ["--host-bandwidth", f"{n}GB/s"],
                 ["--", "-c", n], ["--", "-ngl", n]):  # fmt: skip
        r = cli("plan", str(demo), *args)
        assert r.returncode == ExitCode.USAGE and no_traceback(r), (args[0], r.stderr[-500:])


@pytest.mark.server
def test_a_tagged_section_is_waited_for_under_the_routers_name(server_bin: ServerBinary, tmp_path: Path,
                                                               demo: Path) -> None:  # fmt: skip
    ini = tmp_path / "in.ini"
    ini.write_text(f"[*]\nno-warmup = true\n\n[demo:latest]\nmodel = {demo}\n")
    p = launch_run(["--models-preset", str(ini), "--cpu-only", "--json", "--ready-timeout", "120", "--", "--port",
                    "0"], server_bin)  # fmt: skip
    try:
        doc = read_json_doc(p, 150)
        assert doc["schema"] == "llamafit.run-set/1" and set(doc["models"]) == {"demo:LATEST"}
        assert router_models(doc["url"]) == {"demo:LATEST": "loaded"}
    finally:
        assert stop_run(p) == 0

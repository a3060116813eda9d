"""Launch and observe: supervision, failure classes, environment hygiene, --exec, calibration.

Failure paths use small real programs standing in for llama-server: they answer the capability
probe like the real binary and then print llama.cpp's exact error lines and exit or abort.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary, free_port
from llamafit.server.environment import child_env, config_findings
from llamafit.server.failures import classify
from llamafit.server.supervisor import Supervisor, is_key_line
from tests.realserver import read_until

LLAMAFIT = [sys.executable, "-m", "llamafit"]
PREFIX = "0.00.123.456"

STAND_IN = r"""#!{python}
import os, sys, signal, time
args = sys.argv[1:]
if args[:1] == ["--completion-bash"]:
    print('opts="{flags}"'); sys.exit(0)
if args[:1] == ["--help"]:
    print("--spec-type none,draft-simple,draft-mtp,ngram-mod\n   types"); sys.exit(0)
if "--list-devices" in args:
    print("Available devices:\n  (none)"); sys.exit(0)
if args[:1] == ["--version"]:
    print("version: 0.6.0 (build 11434, commit deadbee)", file=sys.stderr); sys.exit(0)
with open({argv_log!r}, "w") as fh:
    fh.write("\n".join(args) + "\nPID=" + str(os.getpid()) + "\n" + "\n".join(sorted(os.environ)))
mode = {mode!r}
port = 0
if mode == "serve":  # it listens, as llama-server does before it says so; @PORT@ in a line is its port
    import http.server, threading
    class Loop(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"[]")
        def log_message(self, *a): pass
    loop = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Loop)
    threading.Thread(target=loop.serve_forever, daemon=True).start()
    port = loop.server_port
for line in {lines!r}:
    print("{prefix} " + line.replace("@PORT@", str(port)), file=sys.stderr, flush=True)
if mode == "abort":
    os.kill(os.getpid(), signal.SIGABRT)
if mode == "serve":
    signal.signal(signal.SIGINT, lambda *a: sys.exit(0))
    while True:
        time.sleep(0.05)
sys.exit({rc})
"""


FLAGS = (
    "-m --model -c --ctx-size -ngl --gpu-layers -fit --fit -lv --verbosity --port --host -np --spec-type "
    "-md --spec-draft-n-max -fa --flash-attn -lm --load-mode"
)


def stand_in(tmp_path: Path, lines: list[str], mode: str = "exit", rc: int = 1, flags: str = FLAGS) -> Path:
    exe = tmp_path / "llama-server"
    exe.write_text(STAND_IN.format(python=sys.executable, argv_log=str(tmp_path / "argv.txt"), lines=lines,
                                   prefix=PREFIX, mode=mode, rc=rc, flags=flags))  # fmt: skip
    exe.chmod(0o755)
    return exe


FAILURES = [
    (
        "device_oom_weights",
        ["E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 16383.42 MiB on device 0: cudaMalloc failed: "
         "out of memory",
         "E ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA0 buffer of size 17178820608",
         "E llama_model_load: error loading model: unable to allocate CUDA0 buffer",
         "E srv  llama_server: exiting due to model loading error"],
        "CUDA0 ran out of memory loading the weights (asked for 16.0 GiB)",
    ),
    (
        "device_oom_kv",
        ["E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8192.00 MiB on device 1: cudaMalloc failed: "
         "out of memory",
         "E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
         "E cmn  common_init_: failed to create context with model 'm.gguf'"],
        "CUDA1 ran out of memory allocating the KV cache (asked for 8.0 GiB)",
    ),
    (
        "device_oom_compute",
        ["E ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 1073741824",
         "E graph_reserve: failed to allocate compute buffers",
         "E llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers"],
        "CUDA0 ran out of memory for the compute buffers (asked for 1.0 GiB)",
    ),
    (
        "host_oom",
        ["E ggml_aligned_malloc: insufficient memory (attempted to allocate 24576.00 MB)",
         "E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 25769803776"],
        "the host ran out of memory",
    ),
    (
        "model_file",
        ["E gguf_init_from_file: failed to open GGUF file 'missing.gguf' (No such file or directory)",
         "E llama_model_load: error loading model: llama_model_loader: failed to load model from missing.gguf"],
        "could not open missing.gguf: No such file or directory",
    ),
    (
        "device_oom_mmproj",
        ["E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 796.44 MiB on device 0: cudaMalloc failed: "
         "out of memory",
         "E mtmd_init_from_file: error: failed to allocate the weights buffer",
         "E srv    load_model: failed to load multimodal model, 'mmproj.gguf'"],
        "CUDA0 ran out of memory loading the projector (asked for 796 MiB)",
    ),
    (
        "mmproj",
        ["E mtmd_init_from_file: error: mismatch between text model (n_embd = 256) and mmproj (n_embd = 512)",
         "E srv    load_model: failed to load multimodal model, 'mmproj.gguf'"],
        "could not load the multimodal projector: mismatch between text model (n_embd = 256)",
    ),
    ("bad_argument", ["error: invalid argument: --no-mmap"], "does not accept --no-mmap"),
    (
        "port_in_use",
        ["E srv    start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080",
         "E srv  llama_server: exiting due to HTTP server error"],
        "port 8080 on 127.0.0.1 is already in use",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "lines", "message"), FAILURES, ids=[f[0] for f in FAILURES])
def test_each_failure_class_from_a_stand_in(tmp_path: Path, kind: str, lines: list[str], message: str) -> None:
    exe = stand_in(tmp_path, lines)
    out = Supervisor([str(exe)], dict(os.environ), planned=({"CUDA0": 15 << 30}, {"CUDA0": 23 << 30})).run()
    assert not out.ready and out.returncode == 1
    assert out.failure is not None and out.failure.kind == kind
    assert message in out.failure.message
    assert out.failure.hint
    if kind == "device_oom_weights":
        assert "the plan put 15.0 GiB there of 23.0 GiB usable" in out.failure.message


def test_sigabrt_during_warmup(tmp_path: Path) -> None:
    exe = stand_in(tmp_path, ["E CUDA error: out of memory", "E   current device: 0"], mode="abort")
    out = Supervisor([str(exe)], dict(os.environ)).run()
    assert out.returncode == 134
    assert out.failure is not None and out.failure.kind == "abort"
    assert "SIGABRT" in out.failure.message and "CUDA error: out of memory" in out.failure.message


def test_run_maps_a_load_failure_to_exit_5(tmp_path: Path) -> None:
    model = ensure_demo_model(tmp_path / "m")
    exe = stand_in(tmp_path, FAILURES[4][1])
    r = subprocess.run([*LLAMAFIT, "run", str(model), "--server", str(exe)], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 5, r.stderr
    assert "could not open missing.gguf" in r.stderr and "Traceback" not in r.stderr


def test_ready_passthrough_and_exit_code_after_loading(tmp_path: Path) -> None:
    model = ensure_demo_model(tmp_path / "m")
    lines = ["I srv  llama_server: model loaded", "I srv  llama_server: listening on http://127.0.0.1:@PORT@",
             "W srv  llama_server: a warning the user should see", "I llama_context: n_ctx = 4096"]  # fmt: skip
    exe = stand_in(tmp_path, lines, mode="serve")
    log = tmp_path / "server.log"
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", str(exe), "--log-file", str(log)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp_path / "argv.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "ready at http://127.0.0.1:" in err
    assert "a warning the user should see" in err
    assert "n_ctx = 4096" not in err  # INFO lines only with --verbose
    assert "n_ctx = 4096" in log.read_text()  # but every line is in --log-file
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert "-lv" in argv and argv[argv.index("-lv") + 1] == "4"  # added: the buffer lines need it


def test_environment_is_scrubbed_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = child_env({"PATH": "/bin", "LLAMA_ARG_CTX_SIZE": "99", "LLAMA_ARG_NO_KV_OFFLOAD": "1",
                     "MTMD_BACKEND_DEVICE": "CUDA1", "AIP_MODE": "PREDICTION", "HF_TOKEN": "hf_secret"})  # fmt: skip
    assert env.env == {"PATH": "/bin", "HF_TOKEN": "hf_secret"}
    assert env.removed == ("AIP_MODE", "LLAMA_ARG_CTX_SIZE", "LLAMA_ARG_NO_KV_OFFLOAD", "MTMD_BACKEND_DEVICE")
    # end to end: the child never sees them, and the user is told which (names only)
    model = ensure_demo_model(tmp_path / "m")
    exe = stand_in(tmp_path, ["E srv  llama_server: exiting due to model loading error"])
    monkeypatch.setenv("LLAMA_ARG_N_GPU_LAYERS", "7")
    r = subprocess.run([*LLAMAFIT, "run", str(model), "--server", str(exe)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ))  # fmt: skip
    assert "LLAMA_ARG_N_GPU_LAYERS" in r.stderr and "7" not in r.stderr.split("LLAMA_ARG_N_GPU_LAYERS")[1][:3]
    child_vars = (tmp_path / "argv.txt").read_text()
    assert "LLAMA_ARG_N_GPU_LAYERS" not in child_vars


def test_config_ini_entries_that_change_the_plan_are_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "llama.cpp" / "config.ini"
    cfg.parent.mkdir()
    cfg.write_text("cache-type-k = q8_0\nport = 9000\n[*]\nLLAMA_ARG_OVERRIDE_TENSOR = exps=CPU\n[other]\nc = 5\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}
    found = config_findings(env, parse_server_args(["-c", "4096"]))
    assert any("cache-type-k" in f and "sets --cache-type-k" in f for f in found)
    assert any("LLAMA_ARG_OVERRIDE_TENSOR" in f and "adds to --override-tensor" in f for f in found)
    assert not any("port" in f for f in found)  # does not change memory
    assert not any("= '5'" in f for f in found)  # other sections do not apply


def test_exec_replaces_the_process(tmp_path: Path) -> None:
    model = ensure_demo_model(tmp_path / "m")
    exe = stand_in(tmp_path, ["I started"], rc=0)
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--exec", "--server", str(exe)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    p.communicate(timeout=60)
    assert p.returncode == 0
    lines = (tmp_path / "argv.txt").read_text().splitlines()
    pid = int(next(x for x in lines if x.startswith("PID="))[4:])
    assert pid == p.pid  # the server ran in llamafit's own process
    assert "-lv" not in lines  # handed over as planned, without supervision flags


def test_renamed_flags_are_translated_for_this_build(tmp_path: Path) -> None:
    model = ensure_demo_model(tmp_path / "m")
    r = CliRunner().invoke(app, ["run", str(model), "--dry-run", "--", "--draft-max", "5", "--no-mmap", "-fa"])
    assert r.exit_code == 0, r.output
    argv = r.stdout.split()
    assert "--spec-draft-n-max" in argv and "--draft-max" not in argv
    assert argv[argv.index("-lm") + 1] == "none" and argv[argv.index("-fa") + 1] == "on"
    assert "spelled" in r.stderr


def test_flags_the_binary_does_not_accept_are_never_emitted(tmp_path: Path) -> None:
    model = ensure_demo_model(tmp_path / "m")
    exe = stand_in(tmp_path, [], flags=FLAGS.replace("-fit --fit ", ""))  # a build from before --fit
    r = CliRunner().invoke(app, ["run", str(model), "--dry-run", "--server", str(exe)])
    assert r.exit_code == 0, r.output
    assert "-fit" not in r.stdout.split()
    assert "does not accept -fit" in r.stderr


def test_key_lines() -> None:
    assert is_key_line(f"{PREFIX} W srv  something odd")
    assert is_key_line(f"{PREFIX} I srv  llama_server: model loaded")
    assert not is_key_line(f"{PREFIX} I llama_context: n_ctx = 4096")


def test_unknown_failure_keeps_the_servers_words() -> None:
    f = classify([f"{PREFIX} E something broke in a new way"], 3)
    assert f.kind == "unknown" and "code 3" in f.message and "something broke" in f.message


@pytest.mark.server
def test_real_server_predicted_vs_actual_json_and_calibration(server_bin: ServerBinary, tmp_path: Path) -> None:
    model = ensure_demo_model(tmp_path / "m")
    port = free_port()
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--json", "--server", server_bin.path, "--", "--port",
                          str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None
    first = ""
    deadline = time.monotonic() + 120
    buf = []
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        buf.append(line)
        try:
            doc = json.loads("".join(buf))
            first = "ok"
            break
        except ValueError:
            continue
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert first == "ok", err
    assert p.returncode == 0, err
    assert doc["schema"] == "llamafit.run/1" and doc["url"].endswith(str(port))
    assert all(m["within_tolerance"] for m in doc["memory"]), doc["memory"]
    # the launch was recorded, and the next plan for the same model and settings uses it
    hist = CliRunner().invoke(app, ["history", "--json"])
    launches = json.loads(hist.stdout)["launches"]
    assert launches and launches[-1]["model"]["name"].startswith("llamafit demo")
    assert launches[-1]["actual_mib"]["kv"]["CPU"] == 4.0
    again = CliRunner().invoke(app, ["plan", str(model), "--json", "--server", server_bin.path])
    codes = [d["code"] for d in json.loads(again.stdout)["decisions"]]
    assert "calibration.applied" in codes


@pytest.mark.server
def test_real_shape_supervised_table_and_ctrl_c(server_bin: ServerBinary, tmp_path: Path) -> None:
    """A sparse Qwen3-0.6B: ready detection, the human predicted-vs-actual table, exit 0 on SIGINT."""
    from tests import factory

    model = factory.qwen3_0_6b().write(tmp_path / "qwen3-0.6b.gguf")
    port = free_port()
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", server_bin.path, "--", "--port", str(port),
                          "--no-warmup", "-c", "8192"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)  # fmt: skip
    assert p.stderr is not None
    _, seen = read_until(p.stderr, "actual MiB")  # the table's header: the server is ready and the table is out
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()  # not communicate(): it reads the fd and would skip what readline buffered
    p.wait(timeout=60)
    err = "".join(seen) + rest
    assert p.returncode == 0, err
    assert "llamafit: ready" in err and f":{port}" in err
    kv = next(line for line in err.splitlines() if " kv " in f" {line} " and "CPU" in line)
    # 28 layers x 8 KV heads x 128 x 2 (K and V) x f16 x 8192 cells = 896 MiB, predicted and logged
    assert kv.count("896.00") == 2, kv
    assert " !" not in err.split("actual MiB", 1)[1].split("llamafit:", 1)[0], err


def test_device_and_fit_lines_are_read() -> None:
    from llamafit.server.logparse import parse

    log = parse([
        f"{PREFIX} I llama_prepare_model_devices: using device CUDA0 (NVIDIA H200) (0000:19:00.0) - 142700 MiB free",
        f"{PREFIX} I llama_prepare_model_devices: using device CUDA1 (NVIDIA H200) (0000:2a:00.0) - 90000 MiB free",
        f"{PREFIX} I common_params_fit_impl: projected to use 61807 MiB of device memory vs. 24077 MiB of free "
        "device memory",
        f"{PREFIX} I common_params_fit_impl: context size reduced from 131072 to 32768 -> need 4096 MiB less memory "
        "in total",
        f"{PREFIX} I common_fit_params: successfully fit params to free device memory",
    ])  # fmt: skip
    assert log.device_free_mib == {"CUDA0": 142700, "CUDA1": 90000}
    assert len(log.fit) == 3 and log.fit[1].startswith("context size reduced from 131072 to 32768")


def test_memory_taken_after_planning_is_reported(tmp_path: Path) -> None:
    from llamafit.options import Options
    from llamafit.planning.planner import prepare
    from llamafit.server.logparse import LoadLog
    from llamafit.serving.outcome import free_drift

    prep = prepare(str(ensure_demo_model(tmp_path)), Options(gpu=["8GiB"], calibrate=False))
    assert free_drift(prep, LoadLog(device_free_mib={"CUDA0": 8192})) == []
    (msg,) = free_drift(prep, LoadLog(device_free_mib={"CUDA0": 5120}))
    assert "CUDA0 had 5120 MiB free" in msg and "3072 MiB less" in msg


def test_one_memory_table_per_device() -> None:
    from llamafit.cli.render import device_of, memory_tables
    from llamafit.serving.compare import Row

    assert [device_of(b) for b in ("CPU", "CPU_Mapped", "CUDA_Host", "CPU_REPACK", "CUDA0", "CUDA1")] == [
        "host", "host", "host", "host", "CUDA0", "CUDA1",
    ]  # fmt: skip
    rows = [
        Row("target", "model", "CUDA0", 1 << 20, 1.0),
        Row("target", "kv", "CUDA1", 1 << 20, 1.0),
        Row("target", "output", "CUDA_Host", 1 << 20, 3.0),
        Row("mmproj", "model", "CUDA0", 1 << 20, 1.0),
    ]
    tables = memory_tables(rows)
    assert [str(t.title).split(":")[0] for t in tables] == ["CUDA0", "CUDA1", "host"]
    assert tables[0].row_count == 2

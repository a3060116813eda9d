"""A launch that recovers: a load that runs out of memory is planned again within what it showed the machine
holds, at most twice, and the next plan keeps to it. Run for real: llama-server under an address-space limit
fails at load exactly as a full machine does (``ggml_aligned_malloc: insufficient memory``)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from llamafit.gguf.model import load_model
from llamafit.memory.calibration import failed_load_caps, history_file, read_history
from llamafit.server.binary import ServerBinary, free_port
from tests import factory
from tests.realserver import run_until_ready_then_interrupt

pytestmark = [pytest.mark.server, pytest.mark.slow]
LIMIT = 3_000_000 * 1024  # ulimit -v 3000000: the 40960-token cache of a 0.6B model does not fit


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _run(model: Path, server: ServerBinary, *extra: str) -> tuple[int, str, str]:
    port = free_port()
    argv = [sys.executable, "-m", "llamafit", "run", str(model), "--cpu-only", "--server", server.path, *extra,
            "--", "-np", "1", "--port", str(port), "--no-warmup"]  # fmt: skip
    env = dict(os.environ, LD_LIBRARY_PATH=server.lib_dir or os.environ.get("LD_LIBRARY_PATH", ""))
    return run_until_ready_then_interrupt(argv, port, 240, env, may_fail=True, preexec=_limited)


@pytest.fixture(scope="module")
def q06(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.qwen3_0_6b().write(tmp_path_factory.mktemp("m") / "q06.gguf")


def test_a_load_that_runs_out_of_memory_is_planned_again_and_the_next_plan_keeps_to_it(
    q06: Path, server_bin: ServerBinary
) -> None:
    rc, out, err = _run(q06, server_bin)
    assert "ran out of memory" in err and "planning again within it (attempt 2 of 3" in err, err[-3000:]
    assert rc == 0 and out.startswith("http://"), err[-3000:]  # ready in the end, then interrupted
    caps, _ = failed_load_caps(load_model(q06), (), read_history())
    assert 0 < caps["host"] < 3 * 1024**3
    # the next plan, even on a machine without the limit, stays within what the failed load showed
    r = subprocess.run([sys.executable, "-m", "llamafit", "plan", str(q06), "--cpu-only", "--json", "--server",
                        server_bin.path, "--", "-np", "1"], capture_output=True, text=True, timeout=120)  # fmt: skip
    doc = json.loads(r.stdout)
    assert doc["host"]["usable"] <= caps["host"] and doc["context"]["n_ctx"] < 40960
    assert any("failed load" in d["message"] for d in doc["decisions"] if d["code"] == "calibration.applied")


def test_no_retry_stops_at_the_first_failure(q06: Path, server_bin: ServerBinary) -> None:
    rc, _, err = _run(q06, server_bin, "--no-retry")  # each test has a data directory of its own
    assert rc == 5 and "planning again" not in err
    assert history_file().exists()  # the failure is still recorded for the next plan


OOM_LINES = """\
load_tensors: loading model tensors, this can take a while... (mmap = true, direct_io = false)
load_tensors:        CUDA0 model buffer size =   604.15 MiB
llama_context: constructing llama_context
ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4480.00 MiB on device 0: cudaMalloc failed: out of memory
alloc_tensor_range: failed to allocate CUDA0 buffer of size 4697620480
llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache
"""


def test_a_card_that_runs_out_is_planned_again_with_its_name_and_numbers(
    q06: Path, server_bin: ServerBinary, tmp_path: Path
) -> None:
    """A stand-in for a CUDA build prints a real device OOM's lines at every load on the card (lavapipe's
    devices never refuse): each attempt is planned within what the last showed CUDA0 holds, and when the card
    holds too little even for its own buffers the last attempt runs without it (-dev none) and serves."""
    from tests.test_device_list import stand_in

    script = Path(
        stand_in(tmp_path, server_bin, "Available devices:\n  CUDA0: NVIDIA RTX (24000 MiB, 23000 MiB free)\n")
    )
    (tmp_path / "oom.txt").write_text(OOM_LINES)
    text = script.read_text().replace(
        'exec "', f'case "$*" in *"-dev none"*) ;; *--port*) cat "{tmp_path / "oom.txt"}" >&2; exit 1;; esac\nexec "', 1
    )
    script.write_text(text)
    port = free_port()
    argv = [sys.executable, "-m", "llamafit", "run", str(q06), "--server", str(script), "--", "--port", str(port),
            "--no-warmup", "-np", "1"]  # fmt: skip
    rc, out, err = run_until_ready_then_interrupt(argv, port, 240, dict(os.environ), may_fail=True)
    assert err.count("CUDA0 ran out of memory allocating the KV cache (asked for 4.4 GiB)") == 2, err[-3000:]
    assert "CUDA0 could not take 4480 MiB more after 604 MiB: planning for at most" in err
    assert "attempt 2 of 3" in err and "attempt 3 of 3" in err
    assert "-dev none" in err.rsplit("attempt 3 of 3", 1)[1]  # the last attempt without the card
    assert rc == 0 and out.startswith("http://"), err[-3000:]  # it served, then was interrupted
    caps, _ = failed_load_caps(load_model(q06), ("CUDA0",), read_history())
    assert 0 < caps["CUDA0"] < int((604.15 + 2240) * 1024**2)

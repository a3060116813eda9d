"""Devices as llama-server lists them, for every backend's line shape, and what the plan does with them.

The lines follow ``common_print_available_devices``'s format (common/arg.cpp:1165, ``  %s: %s (%zu MiB,
%zu MiB free)``) with real device descriptions. Backends this machine cannot have (CUDA, ROCm, Metal,
SYCL, an unknown one) are exercised through a stand-in binary that prints a given device list and hands
every other flag to the real llama-server; Vulkan is measured for real in tests/test_vulkan.py.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.devices.listed import ListedDevice, parse_device_list
from llamafit.devices.machine import Host, discover, merge_listed
from llamafit.memory import backends
from llamafit.server.binary import ServerBinary
from llamafit.units import GiB, MiB
from tests import factory

LISTING = """\
load_backend: loaded CPU backend from libggml-cpu.so
Available devices:
  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23400 MiB free)
  ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 24286 MiB free)
  Vulkan0: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 23012 MiB free)
  Vulkan1: NVIDIA GeForce RTX 4090 (24080 MiB, 23000 MiB free)
  Vulkan2: Intel(R) Arc(tm) A770 Graphics (DG2) (16032 MiB, 16032 MiB free)
  Vulkan3: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)
  SYCL0: Intel(R) Arc(TM) A770 Graphics (15473 MiB, 15473 MiB free)
  MTL0: Apple M2 Max (49152 MiB, 49151 MiB free)
  MUSA0: MTT S80 (16384 MiB, 16000 MiB free)
  RPC0: 192.168.1.10:50052 (8192 MiB, 8000 MiB free)
  BLAS: OpenBLAS (0 MiB, 0 MiB free)
  CANN0: Ascend910B (65536 MiB, 60000 MiB free)
"""


def test_every_backends_line_shape() -> None:
    devs = {d.name: d for d in parse_device_list(LISTING)}
    assert list(devs) == ["CUDA0", "ROCm0", "Vulkan0", "Vulkan1", "Vulkan2", "Vulkan3", "SYCL0", "MTL0", "MUSA0",
                          "RPC0", "CANN0"]  # fmt: skip
    assert devs["Vulkan0"].description == "AMD Radeon RX 7900 XTX (RADV NAVI31)"  # parentheses inside
    assert devs["Vulkan3"].description == "llvmpipe (LLVM 15.0.6, 256 bits)"
    assert (devs["Vulkan0"].total, devs["Vulkan0"].free) == (24560 * MiB, 23012 * MiB)
    assert {n: d.backend for n, d in devs.items()} == {
        "CUDA0": "CUDA", "ROCm0": "ROCm", "Vulkan0": "Vulkan", "Vulkan1": "Vulkan", "Vulkan2": "Vulkan",
        "Vulkan3": "Vulkan", "SYCL0": "SYCL", "MTL0": "Metal", "MUSA0": "MUSA", "RPC0": "RPC", "CANN0": "",
    }  # fmt: skip
    assert devs["RPC0"].description == "192.168.1.10:50052"


def test_no_device_and_vulkans_integrated_flag() -> None:
    assert parse_device_list("Available devices:\n  (none)\n") == []
    debug = (
        "ggml_vulkan: 0 = AMD Radeon 890M Graphics (RADV GFX1150) (radv) | uma: 1 | fp16: 1 | bf16: 0 | warp size: 64\n"
        "ggml_vulkan: 1 = AMD Radeon RX 7600 (RADV NAVI33) (radv) | uma: 0 | fp16: 1 | bf16: 0 | warp size: 64\n"
    )
    text = (
        "Available devices:\n  Vulkan0: AMD Radeon 890M Graphics (RADV GFX1150) (32768 MiB, 30000 MiB free)\n"
        "  Vulkan1: AMD Radeon RX 7600 (RADV NAVI33) (8176 MiB, 8000 MiB free)\n"
    )
    a, b = parse_device_list(text, debug)
    assert a.integrated and not b.integrated
    # llama.cpp uses an integrated GPU only when there is no discrete one (src/llama.cpp:280-286)
    devs, notes, blind = merge_listed([a, b], None)
    assert [d.id for d in devs] == ["Vulkan1"] and any("Vulkan0" in n for n in notes) and not blind


def test_the_same_card_through_two_backends_is_used_once() -> None:
    cuda = ListedDevice("CUDA0", "NVIDIA GeForce RTX 4090", 24080 * MiB, 23400 * MiB, "CUDA")
    vk = ListedDevice("Vulkan0", "NVIDIA GeForce RTX 4090", 24080 * MiB, 23000 * MiB, "Vulkan")
    devs, notes, _ = merge_listed([cuda, vk], None)
    assert [d.id for d in devs] == ["CUDA0"] and "Vulkan0" in notes[0]


def test_nvml_gives_the_live_numbers_of_the_servers_cuda_devices() -> None:
    from llamafit.devices.machine import Device

    listed = [ListedDevice("CUDA0", "NVIDIA H200", 143000 * MiB, 140000 * MiB, "CUDA")]
    nvml = [Device("CUDA0", "NVIDIA H200", 143771 * MiB + 123, 139000 * MiB + 7, uuid="GPU-1", nvml_index=0)]
    devs, _, _ = merge_listed(listed, nvml)
    assert devs[0].free == 139000 * MiB + 7 and devs[0].uuid == "GPU-1" and devs[0].backend == "CUDA"
    two = [*listed, ListedDevice("CUDA1", "NVIDIA H200", 143000 * MiB, 141000 * MiB, "CUDA")]
    devs, notes, _ = merge_listed(two, nvml)  # counts differ: the server's list is the truth
    assert [d.free for d in devs] == [140000 * MiB, 141000 * MiB] and notes


def test_per_backend_allocation_rules() -> None:
    assert backends.pads_rows("CUDA0") and backends.pads_rows("ROCm1") and backends.pads_rows("SYCL0")
    assert not backends.pads_rows("Vulkan0") and not backends.pads_rows("MTL0_Mapped")
    assert backends.alignment("Vulkan0", 32) == 16 and backends.alignment("CUDA0", 32) == 128
    assert backends.host_buffer(["Vulkan0", "Vulkan1"]) == "Vulkan_Host"
    assert backends.host_buffer(["ROCm0"]) == "ROCm_Host" and backends.host_buffer(["MTL0"]) is None
    assert backends.host_buffer(["RPC0", "CUDA0"]) == "CUDA_Host"
    assert backends.weights_buffer("MTL0", use_mmap=True) == "MTL0_Mapped"
    assert backends.weights_buffer("MTL0", use_mmap=False) == "MTL0"
    assert backends.device_of_buffer("MTL0_Mapped") == "MTL0" and backends.device_of_buffer("Vulkan_Host") == "CPU"
    assert backends.kind("Vulkan0") == "gpu" and backends.kind("RPC0[127.0.0.1:1]") == "rpc"


# -- a stand-in server: a given device list, the real binary for everything else -----------------------


def stand_in(tmp_path: Path, real: ServerBinary, listing: str, *, exit_code: int = 0) -> str:
    calls = tmp_path / "list-calls"
    script = tmp_path / "llama-server"
    (tmp_path / "listing.txt").write_text(listing)
    lib = f'export LD_LIBRARY_PATH="{real.lib_dir}:$LD_LIBRARY_PATH"\n' if real.lib_dir else ""
    script.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do\n'
        '  if [ "$a" = "--list-devices" ]; then\n'
        f'    echo x >> "{calls}"\n'
        f'    cat "{tmp_path / "listing.txt"}"\n'
        f"    exit {exit_code}\n"
        "  fi\n"
        "done\n"
        f'{lib}exec "{real.path}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(script)


def list_calls(tmp_path: Path) -> int:
    f = tmp_path / "list-calls"
    return len(f.read_text().splitlines()) if f.exists() else 0


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.qwen3_8b().write(tmp_path_factory.mktemp("m") / "qwen3-8b.gguf")


def plan_json(server: str, model: Path, *args: str) -> dict:  # type: ignore[type-arg]
    r = CliRunner().invoke(app, ["plan", str(model), "--server", server, "--json", *args])
    assert r.exit_code == 0, r.output
    out: dict = json.loads(r.stdout)  # type: ignore[type-arg]
    return out


pytestmark = pytest.mark.server


def test_a_metal_mac_is_planned_as_one_pool(tmp_path: Path, server_bin: ServerBinary, model: Path) -> None:
    import psutil

    ram = psutil.virtual_memory()
    total_mib = int(ram.total * 0.7) // MiB  # recommendedMaxWorkingSetSize: about 70 % of RAM
    srv = stand_in(
        tmp_path, server_bin, f"Available devices:\n  MTL0: Apple M2 Max ({total_mib} MiB, {total_mib} MiB free)\n"
    )
    doc = plan_json(srv, model)
    dev = doc["devices"][0]
    assert (dev["id"], dev["backend"], dev["uma"]) == ("MTL0", "Metal", True)
    assert any(d["code"] == "memory.unified" for d in doc["decisions"])
    host = doc["host"]
    # device use plus host use never exceed what the machine has, and the device is counted once
    dev_total = sum(dev["use"].values())
    assert host["unified"] == dev_total > 0
    assert sum(host["use"].values()) + host["unified"] <= host["usable"] <= ram.available
    assert "-fit" in doc["argv"] and "-c" in doc["argv"]
    # weights of an mmapped file are wrapped in place on Metal: no copy on the host side
    assert dev["use"]["model"] > 0 and host["use"]["model"] < dev["use"]["model"]


def test_an_unknown_backend_leaves_placement_to_llama_cpp(
    tmp_path: Path, server_bin: ServerBinary, model: Path
) -> None:
    srv = stand_in(tmp_path, server_bin, "Available devices:\n  CANN0: Ascend910B (65536 MiB, 60000 MiB free)\n")
    doc = plan_json(srv, model)
    assert "-fit" not in doc["argv"] and "-ngl" not in doc["argv"] and "-c" not in doc["argv"]
    dec = next(d for d in doc["decisions"] if d["code"] == "fit.llama_cpp")
    assert "CANN0" in dec["message"] and doc["blind"]


def test_an_unreadable_device_list_is_not_a_cpu_plan(tmp_path: Path, server_bin: ServerBinary, model: Path) -> None:
    srv = stand_in(tmp_path, server_bin, "ggml_vulkan: vkCreateInstance failed\n", exit_code=1)
    doc = plan_json(srv, model)
    assert "-fit" not in doc["argv"] and doc["blind"]
    assert any(d["code"] == "fit.llama_cpp" for d in doc["decisions"])


def test_rocm_devices_are_planned_with_their_names(tmp_path: Path, server_bin: ServerBinary, model: Path) -> None:
    listing = (
        "Available devices:\n  ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 24000 MiB free)\n"
        "  ROCm1: AMD Radeon RX 7900 XTX (24560 MiB, 12000 MiB free)\n"
    )
    srv = stand_in(tmp_path, server_bin, listing)
    doc = plan_json(srv, model, "--", "-c", "131072")
    assert [d["id"] for d in doc["devices"]] == ["ROCm0", "ROCm1"]
    assert all(d["backend"] == "ROCm" and not d["uma"] for d in doc["devices"])
    assert doc["argv"][doc["argv"].index("-fit") + 1] == "off" and "-ts" in doc["argv"]
    assert all(sum(d["use"].values()) <= d["usable"] for d in doc["devices"])  # each card on its own
    # a margin names a device as llama.cpp does, whatever the case
    tight = plan_json(srv, model, "--margin", "rocm1=4GiB", "--", "-c", "131072")
    assert tight["devices"][1]["usable"] == doc["devices"][1]["usable"] - 3 * GiB


def test_the_device_set_of_a_cpu_build_is_listed_once(tmp_path: Path, server_bin: ServerBinary, model: Path) -> None:
    srv = stand_in(tmp_path, server_bin, "Available devices:\n  (none)\n")
    for _ in range(2):
        doc = plan_json(srv, model)
        assert doc["devices"] == [] and not doc["blind"]
    assert list_calls(tmp_path) == 1  # the set is cached by binary; nothing is live to re-read
    # a device set with memory that only the server can read is listed live every time
    other = tmp_path / "vk"
    other.mkdir()
    srv = stand_in(
        other, server_bin, "Available devices:\n  Vulkan0: AMD Radeon RX 7600 (RADV NAVI33) (8176 MiB, 8000 MiB free)\n"
    )
    for _ in range(2):
        plan_json(srv, model)
    assert list_calls(other) == 2


def test_gpus_shows_backend_and_unified_memory(tmp_path: Path, server_bin: ServerBinary) -> None:
    srv = stand_in(tmp_path, server_bin, LISTING)
    r = CliRunner().invoke(app, ["gpus", "--server", srv, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    by_id = {g["id"]: g for g in doc["gpus"]}
    assert by_id["MTL0"]["uma"] and by_id["Vulkan3"]["uma"] and not by_id["ROCm0"]["uma"]
    assert by_id["Vulkan0"]["backend"] == "Vulkan" and "Vulkan1" not in by_id  # the 4090 again, via Vulkan
    assert "CANN0" not in by_id and any("CANN0" in b for b in doc["blind"])


def test_a_gpu_as_large_as_the_host_shares_its_memory() -> None:
    from llamafit.devices.machine import Device, _with_uma

    host = Host(128 * GiB, 120 * GiB)
    jetson = Device("CUDA0", "NVIDIA GB10", 120 * GiB, 110 * GiB)
    card = Device("CUDA1", "RTX", 24 * GiB, 24 * GiB)
    assert [d.uma for d in _with_uma([jetson, card], host)] == [True, False]


def test_discover_without_a_server_is_nvml_alone() -> None:
    m = discover(environ={}, host=Host(8 * GiB, 8 * GiB), server=None)
    assert m.gpus == () and not m.blind
    assert any("no llama-server to ask" in n for n in m.notes)

"""What differs between the kinds of offload device llama.cpp can use: local CUDA GPUs and RPC devices.

Device ids are llama.cpp's device names (``CUDA0``, ``RPC1``); a device's weight, KV and compute
buffers are named after it in the plan. Per kind:

* **CUDA**: tensors padded to 512-element rows (``ggml-cuda.cu:903-920``), 128-byte buffer alignment,
  pinned host buffers named ``CUDA_Host`` for the CPU side, a runtime overhead (CUDA context,
  cuBLAS workspaces) that no buffer reports.
* **RPC** (``ggml-rpc.cpp``): the remote backend decides alloc sizes and alignment; llamafit assumes a
  CPU backend there (``ggml-rpc-server`` without ``-d``), so plain tensor bytes and 32-byte
  alignment. An RPC device has no host buffer type, so the CPU side uses plain CPU buffers. The
  remote process's own runtime memory is outside the free memory it reports: no overhead here.
  Its buffers are logged as ``RPC<index on that server>[<endpoint>]`` (``ggml-rpc.cpp:1094``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

CPU = "CPU"
CUDA_HOST = "CUDA_Host"
_DEVICE_PREFIXES = ("CUDA", "RPC", "ROCm", "Vulkan", "Metal", "SYCL", "MUSA")


def kind(device: str) -> str:
    """``cuda``, ``rpc`` or ``cpu`` for a device id or buffer name."""
    if device.startswith("RPC"):
        return "rpc"
    if device.startswith(_DEVICE_PREFIXES) and not device.endswith("_Host"):
        return "cuda"
    return "cpu"


def is_device_buffer(name: str) -> bool:
    """A buffer that lives on an offload device (not host memory, not a pinned host buffer)."""
    return kind(name) != "cpu"


def host_buffer(devices: Iterable[str]) -> str | None:
    """The host buffer type llama.cpp uses beside these devices (the first that has one), or None."""
    return CUDA_HOST if any(kind(d) == "cuda" for d in devices) else None


def pads_rows(device: str) -> bool:
    return kind(device) == "cuda"


def has_runtime_overhead(device: str) -> bool:
    return kind(device) == "cuda"


def rpc_buffer_aliases(endpoints: Mapping[str, str]) -> dict[str, str]:
    """Logged RPC buffer names -> device ids. ``endpoints`` maps each RPC device id to its endpoint,
    in device order; a server's k-th device is logged as ``RPC<k>[endpoint]``."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for dev, ep in endpoints.items():
        k = seen.get(ep, 0)
        seen[ep] = k + 1
        out[f"RPC{k}[{ep}]"] = dev
    return out

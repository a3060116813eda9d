"""What differs between the backends llama.cpp offloads to, by device name (``CUDA0``, ``Vulkan1``, ``MTL0``).

Device ids are llama.cpp's device names; a device's weight, KV and compute buffers are named after it.
Per backend (b11434 sources; docs/backends.md):

* **CUDA / ROCm / MUSA** (one code base, ggml-cuda): quantized rows padded to 512 elements
  (``ggml-cuda.cu:903-920``), 128-byte alignment, pinned host buffers ``<NAME>_Host``, a runtime
  overhead (CUDA/HIP context, BLAS workspaces, the memory pool) that no buffer reports.
* **Vulkan** (``ggml-vulkan.cpp:13056-13135``): a tensor takes its bytes (no padding), aligned to the
  device's ``minStorageBufferOffsetAlignment`` (16 on lavapipe and NVIDIA, 4 on RADV, 64 on Intel:
  llamafit uses 16; the difference is at most 48 bytes a tensor); buffers are split at the
  suballocation block size (1 GiB), which does not change their total
  (``ggml_backend_buft_alloc_buffer_n_plan``, ggml-backend.cpp:57-89). Host buffers ``Vulkan_Host``
  (+32 bytes, like the CPU's). A runtime overhead for the driver's objects and the dequantization
  scratch buffers ggml-vulkan allocates outside the graph (``prealloc_x/y``).
* **Metal** (``ggml-metal.cpp:220-320``): bytes as they are (graph ops may add scratch), 32-byte
  alignment; weights of an mmapped file are wrapped in place as ``MTL<n>_Mapped`` buffers; no host
  buffer type. Unified memory: see llamafit.devices.machine.
* **SYCL** (``ggml-sycl.cpp:1061-1100``): quantized rows padded like CUDA, 128-byte alignment,
  ``SYCL_Host``.
* **RPC** (``ggml-rpc.cpp``): the remote backend decides; llamafit assumes a CPU backend there
  (``ggml-rpc-server`` without ``-d``): plain tensor bytes, 32-byte alignment, no host buffer type,
  no overhead (the remote process's memory is outside the free memory it reports). Buffers are logged
  as ``RPC<index on that server>[<endpoint>]`` (``ggml-rpc.cpp:1094``).

Runtime overheads are reference values (CUDA's from common_memory_breakdown_print's "unaccounted"
column on current drivers, docs/memory-model.md §3.4; the others estimates); the first launch on a
machine measures them and calibration corrects the next plan.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llamafit.units import MiB

CPU = "CPU"


@dataclass(frozen=True)
class Backend:
    name: str  # CUDA, ROCm, MUSA, Vulkan, Metal, SYCL, RPC
    host_buffer: str | None  # the pinned host buffer type beside it, if it has one
    pads_rows: bool  # quantized rows padded to MATRIX_ROW_PADDING
    align: int  # buffer alignment
    overhead: int  # runtime memory no buffer reports
    cuda_like: bool = False  # ggml-cuda's compute quirks (FA's F16 K/V copies)
    mapped_weights: bool = False  # mmapped weights wrapped in place (<dev>_Mapped)
    # its host buffer's alignment (the CPU's compute buffer beside it): ggml-vulkan's is the device's
    # minMemoryMapAlignment (ggml-vulkan.cpp:13115-13116; the Vulkan spec's minimum, 64, on the drivers
    # seen), the others keep the CPU's TENSOR_ALIGNMENT
    host_align: int = 32


BACKENDS = {
    "CUDA": Backend("CUDA", "CUDA_Host", True, 128, 384 * MiB, cuda_like=True),
    "ROCm": Backend("ROCm", "ROCm_Host", True, 128, 384 * MiB, cuda_like=True),
    "MUSA": Backend("MUSA", "MUSA_Host", True, 128, 384 * MiB, cuda_like=True),
    "Vulkan": Backend("Vulkan", "Vulkan_Host", False, 16, 256 * MiB, host_align=64),
    "MTL": Backend("Metal", None, False, 32, 128 * MiB, mapped_weights=True),
    "SYCL": Backend("SYCL", "SYCL_Host", True, 128, 384 * MiB),
    "RPC": Backend("RPC", None, False, 32, 0),
}
_PREFIX = re.compile(r"^(?P<prefix>CUDA|ROCm|MUSA|Vulkan|MTL|Metal|SYCL|RPC)\d*")


@functools.cache  # a handful of names, asked for every tensor of every placement the fit tries
def backend(device: str) -> Backend | None:
    """The backend of a device id or a buffer name (``Vulkan0``, ``MTL0_Mapped``); None for host buffers."""
    if device.endswith("_Host"):
        return None
    m = _PREFIX.match(device)
    return BACKENDS["MTL" if m["prefix"] == "Metal" else m["prefix"]] if m else None


def kind(device: str) -> str:
    """``gpu``, ``rpc`` or ``cpu`` for a device id or buffer name."""
    b = backend(device)
    if b is None:
        return "cpu"
    return "rpc" if b.name == "RPC" else "gpu"


META = "Meta()"  # -sm tensor's Meta device, as llama.cpp logs its buffers (each card holds one of that size or less)


def is_device_buffer(name: str) -> bool:
    """A buffer that lives on an offload device (not host memory, not a pinned host buffer)."""
    return name == META or backend(name) is not None


def device_of_buffer(name: str) -> str:
    """The device a buffer is on: ``MTL0_Mapped`` -> ``MTL0``; host buffers -> ``CPU``."""
    return name.removesuffix("_Mapped") if is_device_buffer(name) else CPU


def host_buffer(devices: Iterable[str]) -> str | None:
    """The host buffer type llama.cpp uses beside these devices (the first that has one), or None."""
    for d in devices:
        b = backend(d)
        if b is not None and b.host_buffer:
            return b.host_buffer
    return None


def pads_rows(buft: str) -> bool:
    b = backend(buft)
    return b is not None and b.pads_rows


_HOST_BUFFERS = {b.host_buffer: b for b in BACKENDS.values() if b.host_buffer}


def alignment(buft: str, cpu_align: int) -> int:
    """A buffer type's alignment: a device's own, a pinned host buffer's (``Vulkan_Host``: its
    ``host_align``), else the CPU's."""
    b = backend(buft)
    if b is not None:
        return b.align
    host = _HOST_BUFFERS.get(buft)
    return host.host_align if host is not None else cpu_align


def runtime_overhead(device: str) -> int:
    b = backend(device)
    return b.overhead if b is not None else 0


def cuda_like(device: str) -> bool:
    b = backend(device)
    return b is not None and b.cuda_like


def weights_buffer(device: str, use_mmap: bool) -> str:
    """The buffer name a device's weights are logged under."""
    b = backend(device)
    return f"{device}_Mapped" if b is not None and b.mapped_weights and use_mmap else device


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

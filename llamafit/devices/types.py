"""What a plan is made for: the offload devices as llama.cpp will see them, the host's RAM, the two together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamafit.memory.backends import rpc_buffer_aliases


@dataclass(frozen=True)
class Device:
    """An offload device as llama.cpp will see it: a local GPU, or a device behind an RPC server."""

    id: str  # CUDA0, CUDA1, ...
    name: str
    total: int
    free: int
    uuid: str = ""
    nvml_index: int | None = None
    kind: str = "gpu"  # "gpu" | "rpc"
    source: str = "nvml"  # "nvml" | "override" | "rpc" | "server" (llama-server --list-devices)
    endpoint: str | None = None  # host:port of an RPC device
    backend: str = "CUDA"  # CUDA, ROCm, MUSA, Vulkan, Metal, SYCL, RPC
    uma: bool = False  # its memory is host RAM: checked with the host as one pool
    max_tensor: int = 0  # the largest tensor its backend accepts (0: no limit known)
    bandwidth: float = 0.0  # peak memory bytes/s where known (NVML, a named card, --gpu SIZE@RATE); 0: not known
    bandwidth_source: str = ""  # nvml | table | given
    link: float = 0.0  # bytes/s of its link to host memory (NVML's PCIe generation and width); 0: not known
    fp16: float = 0.0  # FLOP/s of dense FP16 matmuls where the card is known (llamafit.devices.cards); 0: not known

    @property
    def maps_files(self) -> bool:
        """Whether llama.cpp may memory-map the model beside it (its ``mmap_support``): not an integrated GPU of
        ggml-cuda (HIP and MUSA too) or Vulkan (ggml-cuda.cu:5231, ggml-vulkan.cpp:15314), of which lavapipe, a CPU
        device to Vulkan, is none; Metal, SYCL and RPC devices may."""
        return not (self.uma and self.backend in _NO_MMAP_WHEN_INTEGRATED and "llvmpipe" not in self.name)


_NO_MMAP_WHEN_INTEGRATED = frozenset({"CUDA", "ROCm", "MUSA", "Vulkan"})


@dataclass(frozen=True)
class Host:
    total: int
    available: int
    numa_nodes: int = 1  # the NUMA nodes llama.cpp finds on it (llamafit.devices.numa); 1: one, or a described host


@dataclass(frozen=True)
class Machine:
    gpus: tuple[Device, ...]
    host: Host
    notes: tuple[str, ...] = field(default=())
    blind: tuple[str, ...] = ()  # why the server will use memory llamafit cannot size (placement left to --fit)

    def to_json(self) -> dict[str, Any]:
        """The ``llamafit.gpus/1`` document (``llamafit gpus --json``)."""
        return {
            "schema": "llamafit.gpus/1",
            "gpus": [self._gpu_json(g) for g in self.gpus],
            "host": {"total": self.host.total, "available": self.host.available},
            "notes": list(self.notes),
            "blind": list(self.blind),
        }

    @staticmethod
    def _gpu_json(g: Device) -> dict[str, Any]:
        keys = ("id", "kind", "name", "uuid", "total", "free", "source", "endpoint", "backend", "uma")
        out: dict[str, Any] = {k: getattr(g, k) for k in keys}
        if g.bandwidth:
            out |= {"bandwidth": g.bandwidth, "bandwidth_source": g.bandwidth_source, "link": g.link or None}
        return out

    @property
    def buffer_aliases(self) -> dict[str, str]:
        """Buffer type names llama-server gives an RPC device (``RPC0[host:port]``, in ``-ot`` and its
        log) -> the device id; other devices' buffer types are named as the devices are."""
        return rpc_buffer_aliases({g.id: g.endpoint for g in self.gpus if g.endpoint})

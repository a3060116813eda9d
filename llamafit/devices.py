"""What the machine has: GPUs through NVML, host RAM through psutil, or hardware described by --gpu.

NVML is the one boundary the tests cannot have for real, so it sits behind :class:`GpuProbe`; the
tests pass their own probe, the product uses :class:`NvmlProbe`. There is no other seam.

CUDA_VISIBLE_DEVICES is honoured the way the CUDA runtime applies it: the listed indices or UUIDs,
in the listed order, stopping at the first entry that does not resolve; the visible devices are
renamed CUDA0, CUDA1, ... in that order, which is how llama.cpp names them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llamafit.errors import UsageError
from llamafit.units import parse_size


@dataclass(frozen=True)
class PhysicalGpu:
    index: int  # NVML index
    name: str
    uuid: str
    total: int
    free: int


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
    source: str = "nvml"  # "nvml" | "override" | "rpc"
    endpoint: str | None = None  # host:port of an RPC device


@dataclass(frozen=True)
class Host:
    total: int
    available: int


@dataclass(frozen=True)
class Machine:
    gpus: tuple[Device, ...]
    host: Host
    notes: tuple[str, ...] = field(default=())


class GpuProbe(Protocol):
    def gpus(self) -> list[PhysicalGpu]:
        """All physical GPUs; raises GpuProbeError when the driver/library is unusable."""
        ...


class GpuProbeError(Exception):
    pass


class NvmlProbe:
    """Query NVIDIA GPUs with nvidia-ml-py (pynvml)."""

    def gpus(self) -> list[PhysicalGpu]:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            raise GpuProbeError(f"nvidia-ml-py is not installed ({e})") from None
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise GpuProbeError(str(e) or type(e).__name__) from None
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                out.append(
                    PhysicalGpu(
                        index=i,
                        name=name.decode() if isinstance(name, bytes) else str(name),
                        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                        total=int(mem.total),
                        free=int(mem.free),
                    )
                )
            return out
        except Exception as e:
            raise GpuProbeError(str(e) or type(e).__name__) from None
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()


def apply_cuda_visible(gpus: Sequence[PhysicalGpu], env: str | None) -> list[PhysicalGpu]:
    """Filter and order GPUs as CUDA_VISIBLE_DEVICES would (indices, UUIDs or UUID prefixes)."""
    if env is None:
        return list(gpus)
    out: list[PhysicalGpu] = []
    for raw in env.split(","):
        tok = raw.strip()
        if not tok:
            break
        match: PhysicalGpu | None = None
        if tok.lstrip("-").isdigit():
            i = int(tok)
            match = next((g for g in gpus if g.index == i), None)
        else:
            want = tok.upper()
            want = want if want.startswith(("GPU-", "MIG-")) else "GPU-" + want
            cands = [g for g in gpus if g.uuid.upper().startswith(want)]
            match = cands[0] if len(cands) == 1 else None
        if match is None or match in out:
            break  # the CUDA runtime ignores everything after an invalid entry
        out.append(match)
    return out


def parse_gpu_spec(spec: str) -> tuple[int, int]:
    """``--gpu FREE[/TOTAL]`` -> (free, total). A bare size is both."""
    if "/" in spec:
        a, b = spec.split("/", 1)
        free, total = parse_size(a), parse_size(b)
    else:
        free = total = parse_size(spec)
    if free > total:
        raise UsageError(f"--gpu {spec}: free memory exceeds total", hint="write FREE/TOTAL, e.g. 20GiB/24GiB")
    return free, total


def host_memory() -> Host:
    import psutil

    vm = psutil.virtual_memory()
    return Host(total=int(vm.total), available=int(vm.available))


def discover(
    *,
    gpu_specs: Sequence[str] = (),
    cpu_only: bool = False,
    probe: GpuProbe | None = None,
    environ: dict[str, str] | None = None,
    host: Host | None = None,
) -> Machine:
    """The devices a plan is made for. ``--gpu`` specs replace detection; ``--cpu-only`` ignores GPUs."""
    env = os.environ if environ is None else environ
    h = host if host is not None else host_memory()
    notes: list[str] = []
    if cpu_only:
        return Machine((), h, ("--cpu-only: planning for host memory only",))
    if gpu_specs:
        devs = []
        for i, spec in enumerate(gpu_specs):
            free, total = parse_gpu_spec(spec)
            devs.append(Device(id=f"CUDA{i}", name=f"--gpu {spec}", total=total, free=free, source="override"))
        return Machine(tuple(devs), h, ("planning for the GPUs given with --gpu",))
    p = probe if probe is not None else NvmlProbe()
    try:
        phys = p.gpus()
    except GpuProbeError as e:
        notes.append(f"no NVIDIA GPU found (NVML: {e})")
        return Machine((), h, tuple(notes))
    visible = apply_cuda_visible(phys, env.get("CUDA_VISIBLE_DEVICES"))
    if len(visible) < len(phys):
        notes.append(f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')} shows {len(visible)} of {len(phys)} GPUs")
    if not visible:
        notes.append("no GPU is visible; planning a CPU-only load")
    devs = [
        Device(id=f"CUDA{i}", name=g.name, total=g.total, free=g.free, uuid=g.uuid, nvml_index=g.index)
        for i, g in enumerate(visible)
    ]
    return Machine(tuple(devs), h, tuple(notes))

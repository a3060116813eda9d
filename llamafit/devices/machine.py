"""What the machine has: the devices llama-server will use, host RAM through psutil, or hardware
described by --gpu (llamafit.devices.described).

The server binary is asked (``llama-server --list-devices``, llamafit.devices.listed): every backend it
was built with, named and ordered as llama.cpp does (CUDA0, ROCm0, Vulkan0, MTL0, SYCL0, ...). NVML is
the fast path for NVIDIA cards (bytes rather than MiB, other processes' use, UUIDs) and is reconciled
with the server's CUDA list; without a server binary NVML alone is asked. NVML is the one boundary the
tests cannot have for real, so it sits behind :class:`GpuProbe`; the product uses :class:`NvmlProbe`.

CUDA_VISIBLE_DEVICES is honoured the way the CUDA runtime applies it: the listed indices or UUIDs,
in the listed order, stopping at the first entry that does not resolve; the visible devices are
renamed CUDA0, CUDA1, ... in that order, which is how llama.cpp names them.

Unified memory: a device whose memory is host RAM (Apple Silicon's Metal device, an integrated GPU,
lavapipe, a CUDA device as large as the host such as Jetson or GB10) is marked ``uma``; the fit then
checks it and the host as one pool (docs/backends.md). A device the server will use but llamafit
cannot size makes the machine ``blind``: the plan then leaves placement to llama.cpp's own fit.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from llamafit.devices.described import described_machine
from llamafit.devices.listed import (
    DeviceListError,
    ListedDevice,
    Listing,
    cached_device_set,
    read_devices,
    remember_device_set,
)
from llamafit.devices.numa import numa_nodes
from llamafit.devices.rates import nvml_rates
from llamafit.devices.types import Device as Device  # re-exported: the devices package's types
from llamafit.devices.types import Host as Host
from llamafit.devices.types import Machine as Machine
from llamafit.errors import UsageError
from llamafit.units import MiB


@dataclass(frozen=True)
class PhysicalGpu:
    index: int  # NVML index
    name: str
    uuid: str
    total: int
    free: int
    mem_bus_width: int = 0  # bits (nvmlDeviceGetMemoryBusWidth); 0: not reported
    mem_clock_mhz: int = 0  # the memory's maximum clock (nvmlDeviceGetMaxClockInfo, NVML_CLOCK_MEM)
    pcie_gen: int = 0  # the link's maximum generation (nvmlDeviceGetMaxPcieLinkGeneration)
    pcie_width: int = 0  # lanes it runs with (nvmlDeviceGetCurrPcieLinkWidth)


class GpuProbe(Protocol):
    def gpus(self) -> list[PhysicalGpu]:
        """All physical GPUs; raises GpuProbeError when the driver/library is unusable."""
        ...


class GpuProbeError(Exception):
    pass


# pynvml's own message where the driver's library is missing (NVML_ERROR_LIBRARY_NOT_FOUND)
NO_LIBRARY = "NVML Shared Library Not Found"


@functools.cache
def _library_loads() -> bool:
    """Whether NVIDIA's driver library loads, as pynvml loads it outside Windows (``CDLL("libnvidia-ml.so.1")``,
    its ``_LoadNvmlLibrary``): without it pynvml can only say so, and importing pynvml (a large module of ctypes
    structures) would cost every plan on a machine without an NVIDIA driver about 12 ms for that."""
    if sys.platform.startswith("win"):
        return True  # pynvml searches System32 and the NVSMI folder: let it
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _nvml() -> Iterator[Any]:
    """pynvml, initialised for the block and shut down after it; GpuProbeError where it cannot be used."""
    if not _library_loads():
        raise GpuProbeError(NO_LIBRARY)
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        raise GpuProbeError(f"nvidia-ml-py is not installed ({e})") from None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise GpuProbeError(str(e) or type(e).__name__) from None
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


class NvmlProbe:
    """Query NVIDIA GPUs with nvidia-ml-py (pynvml)."""

    def gpus(self) -> list[PhysicalGpu]:
        with _nvml() as nv:
            try:
                out = []
                for i in range(nv.nvmlDeviceGetCount()):
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    name = nv.nvmlDeviceGetName(h)
                    uuid = nv.nvmlDeviceGetUUID(h)
                    mem = nv.nvmlDeviceGetMemoryInfo(h)
                    out.append(
                        PhysicalGpu(
                            index=i,
                            name=name.decode() if isinstance(name, bytes) else str(name),
                            uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                            total=int(mem.total),
                            free=int(mem.free),
                            **_nvml_speed(nv, h),
                        )
                    )
                return out
            except Exception as e:
                raise GpuProbeError(str(e) or type(e).__name__) from None

    def process_memory(self, pid: int) -> dict[int, int]:
        """Bytes process ``pid`` holds on each card (NVML index -> bytes), from NVML's per-process list; empty
        where NVML cannot be used, what was read so far where a driver stops answering."""
        out: dict[int, int] = {}
        try:
            with _nvml() as nv:
                for i in range(nv.nvmlDeviceGetCount()):
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                        if p.pid == pid and isinstance(p.usedGpuMemory, int):
                            out[i] = out.get(i, 0) + p.usedGpuMemory
        except Exception:  # no library, no driver, a query the driver does not answer
            pass
        return out

    def busy(self, index: int) -> int | None:
        """The percent of NVML's last sample period (1/6 s to 1 s) card ``index`` ran kernels, whoever's
        (nvmlDeviceGetUtilizationRates); None where NVML cannot say."""
        try:
            with _nvml() as nv:
                return int(nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByIndex(index)).gpu)
        except Exception:  # no library or driver; NVMLError_NotSupported (some boards, vGPUs); a bad index
            return None


def _nvml_speed(pynvml: Any, h: Any) -> dict[str, int]:
    """What NVML says about a card's memory bus and PCIe link; a query a driver does not answer is 0."""
    queries: dict[str, Callable[[], Any]] = {
        "mem_bus_width": lambda: pynvml.nvmlDeviceGetMemoryBusWidth(h),
        "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "pcie_gen": lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "pcie_width": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
    }
    out = {}
    for k, q in queries.items():
        try:
            v = int(q())
        except Exception:  # NVMLError_NotSupported on some boards, virtual GPUs, old drivers
            v = 0
        out[k] = v if 0 < v < 1 << 20 else 0
    return out


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


def host_memory() -> Host:
    import psutil

    vm = psutil.virtual_memory()
    return Host(total=int(vm.total), available=int(vm.available), numa_nodes=numa_nodes())


def discover(
    *,
    gpu_specs: Sequence[str] = (),
    cpu_only: bool = False,
    probe: GpuProbe | None = None,
    environ: dict[str, str] | None = None,
    host: Host | None = None,
    server: str | None = None,
    server_env: dict[str, str] | None = None,
    cache: Path | None = None,
) -> Machine:
    """The devices a plan is made for. ``--gpu`` specs replace detection; ``--cpu-only`` ignores GPUs.

    ``server`` is the llama-server binary that will run (``server_env`` its environment): its device
    list is the truth; ``cache`` keeps its device set between plans.
    """
    env = os.environ if environ is None else environ
    if gpu_specs and cpu_only:
        raise UsageError("--cpu-only and --gpu: choose one", hint="--gpu describes GPUs; --cpu-only plans without any")
    if gpu_specs:
        return described_machine(gpu_specs, host, host_memory)
    h = host if host is not None else host_memory()
    if cpu_only:
        return Machine((), h, ("--cpu-only: planning for host memory only",))
    gpu_probe = probe if probe is not None else NvmlProbe()
    nvml, notes = _nvml_devices(gpu_probe, env, visible_only=server is None)
    if server is None:
        if not nvml:
            notes.append("no llama-server to ask for its devices: only NVIDIA GPUs (NVML) are seen")
        return Machine(tuple(_with_uma(nvml or [], h)), h, tuple(notes))
    senv = dict(env) if server_env is None else server_env
    try:
        listing = _listed(server, senv, cache, nvml_ok=nvml is not None)
    except DeviceListError as e:
        notes.append(f"could not read llama-server's devices: {e}")
        why = f"llama-server's device list could not be read ({e})"
        return Machine(tuple(_with_uma(nvml or [], h)), h, tuple(notes), (why,))
    devs, more, blind = merge_listed(listing.devices, nvml)
    blind += [f"llama-server lists a device llamafit cannot read ({u})" for u in listing.unreadable]
    return Machine(tuple(_with_uma(devs, h)), h, (*notes, *listing.notes, *more), tuple(blind))


def _nvml_devices(
    probe: GpuProbe, env: Mapping[str, str], *, visible_only: bool = True
) -> tuple[list[Device] | None, list[str]]:
    """NVIDIA GPUs as CUDA will number them (``visible_only``: after CUDA_VISIBLE_DEVICES, in NVML's order;
    else every physical card, for matching a server's list card by card), or None when NVML cannot be used
    (with why in the notes)."""
    try:
        phys = probe.gpus()
    except GpuProbeError as e:
        return None, [f"no NVIDIA GPU found (NVML: {e})"]
    notes: list[str] = []
    if not visible_only:
        return [
            Device(
                id=f"NVML{g.index}",
                name=g.name,
                total=g.total,
                free=g.free,
                uuid=g.uuid,
                nvml_index=g.index,
                **_speed_fields(g),
            )
            for g in phys
        ], notes
    visible = apply_cuda_visible(phys, env.get("CUDA_VISIBLE_DEVICES"))
    if len(visible) < len(phys):
        notes.append(f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')} shows {len(visible)} of {len(phys)} GPUs")
    if not visible:
        notes.append("no GPU is visible; planning a CPU-only load")
    devs = [
        Device(
            id=f"CUDA{i}", name=g.name, total=g.total, free=g.free, uuid=g.uuid, nvml_index=g.index, **_speed_fields(g)
        )
        for i, g in enumerate(visible)
    ]
    return devs, notes


def _speed_fields(g: PhysicalGpu) -> dict[str, Any]:
    """Peak bandwidth and PCIe link from NVML's numbers (llamafit.devices.rates.nvml_rates)."""
    r = nvml_rates(g.mem_bus_width, g.mem_clock_mhz, g.pcie_gen, g.pcie_width)
    if r is None:
        return {}
    return {"bandwidth": r.read, "bandwidth_source": "nvml", "link": r.link or 0.0}


def _listed(server: str, env: dict[str, str], cache: Path | None, *, nvml_ok: bool) -> Listing:
    """The server's devices: from the cached set when NVML can give the live numbers of all of them
    (a CPU-only or CUDA-only build), else from a live --list-devices (free memory is read now). A listing
    with corrections or unreadable lines is never cached (it is read again, and said again)."""
    if cache is not None:
        known = cached_device_set(server, env, cache)
        if known is not None and all(d.backend == "CUDA" for d in known) and (nvml_ok or not known):
            return Listing(known, [], [])
    listing = read_devices(server, env)
    if cache is not None and not listing.notes and not listing.unreadable:
        remember_device_set(server, env, cache, listing.devices)
    return listing


def merge_listed(
    listed: Sequence[ListedDevice], nvml: Sequence[Device] | None
) -> tuple[list[Device], list[str], list[str]]:
    """The server's devices with NVML's live numbers for its CUDA ones, as llama.cpp will use them:
    (devices, notes, reasons the plan is blind)."""
    notes: list[str] = []
    blind: list[str] = []
    cuda = [d for d in listed if d.backend == "CUDA"]
    by_order: dict[str, Device] = {}
    if cuda and nvml is not None:
        # each card by what it is, not by position: CUDA numbers cards fastest first unless
        # CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML by PCI bus, and CUDA_VISIBLE_DEVICES indexes CUDA's order;
        # identical cards keep NVML's order among themselves (CUDA's is stable for equals)
        pool = list(nvml)
        for ld in cuda:
            alike = [n for n in pool if _same_card(ld, n)]
            listed_alike = [x for x in cuda if x.description == ld.description and abs(x.total - ld.total) < 1024 * MiB]
            if not alike or len(alike) < len([x for x in listed_alike if x.name not in by_order]):
                # fewer such cards in NVML than the server lists: which is which cannot be known
                notes.append(f"NVML cannot tell which card {ld.name} ({ld.description}) is: using the server's numbers")
                continue
            pool.remove(alike[0])
            by_order[ld.name] = replace(alike[0], id=ld.name)
    devs: list[Device] = []
    for d in listed:
        if not d.backend:
            blind.append(f"llama-server will use {d.name} ({d.description}), a device llamafit cannot size")
            continue
        if d.backend == "Vulkan" and any(c.description == d.description and c.total == d.total for c in cuda):
            # the same card seen by two backends: llama.cpp keeps the first (same device id, llama.cpp:236-253)
            notes.append(f"{d.name} is {d.description} again (as a Vulkan device): llama.cpp uses it once")
            continue
        devs.append(
            by_order.get(d.name)
            or Device(
                d.name,
                d.description,
                d.total,
                d.free,
                source="server",
                backend=d.backend,
                kind="rpc" if d.backend == "RPC" else "gpu",
                uma=d.integrated or _shares_host(d),
                max_tensor=_max_tensor(d),
            )
        )
    discrete = [d for d in devs if d.kind == "gpu" and not any(ld.name == d.id and ld.integrated for ld in listed)]
    if discrete and len(discrete) < len([d for d in devs if d.kind == "gpu"]):
        dropped = [d.id for d in devs if d.kind == "gpu" and d not in discrete]
        notes.append(f"integrated GPU(s) {', '.join(dropped)} not used beside a discrete one (llama.cpp:280-286)")
        devs = [d for d in devs if d.kind != "gpu" or d in discrete]
    return devs, notes, blind


def _same_card(ld: ListedDevice, nv: Device) -> bool:
    """The server's CUDA device and NVML's card are one: the same name and, within the rounding of MiB and
    what the driver keeps back, the same memory."""
    # cudaMemGetInfo's total leaves out what the driver keeps (an RTX 4090: 24080 of NVML's 24564 MiB)
    return ld.description.strip() == nv.name.strip() and abs(ld.total - nv.total) <= max(ld.total // 25, 512 * MiB)


# Devices whose memory is host RAM, by the names their backends give them: Apple Silicon (Metal),
# NVIDIA's Jetson/Thor/GB10 (CUDA reports MemTotal/MemAvailable there), AMD APUs (HIP), and Mesa's
# software Vulkan device. A discrete card is never matched by size alone: a 24 GiB card in a 24 GiB
# machine is as common as a GB10. Vulkan also says so itself (ggml_vulkan's "uma: 1").
_UNIFIED = re.compile(
    r"^Apple |Orin|Jetson|Xavier|Tegra|Thor|GB10|llvmpipe|Radeon(?:\(TM\))? (?:\d{3,4}[MS]|Graphics)|Ryzen AI",
    re.IGNORECASE,
)


def _max_tensor(d: ListedDevice) -> int:
    """Vulkan's maxStorageBufferRange where the device is known to have a small one: lavapipe's is
    128 MiB (vulkaninfo); desktop drivers report 2-4 GiB or index 64-bit, beyond any single weight."""
    return 128 << 20 if d.backend == "Vulkan" and "llvmpipe" in d.description else 0


def _shares_host(d: ListedDevice) -> bool:
    return bool(_UNIFIED.search(d.description))


def _with_uma(devs: Sequence[Device], host: Host) -> list[Device]:
    """NVML's devices by name (Jetson has no NVML; a GB10 has)."""
    return [replace(d, uma=True) if not d.uma and d.kind == "gpu" and _UNIFIED.search(d.name) else d for d in devs]

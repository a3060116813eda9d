"""The devices llama-server itself will use, as ``llama-server --list-devices`` prints them.

``common_print_available_devices`` (common/arg.cpp:1144-1167, docs/backends.md) loads every backend
the binary was built with and prints one line per non-CPU device, in llama.cpp's order::

      Vulkan0: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 23012 MiB free)

or ``  (none)``. A description may hold parentheses, so the memory is read from the last group. The
list honours the selection variables the server honours (``CUDA_VISIBLE_DEVICES``,
``HIP_VISIBLE_DEVICES``, ``GGML_VK_VISIBLE_DEVICES``, ``ONEAPI_DEVICE_SELECTOR``, ...). Free memory comes
from each backend at that moment: ``cudaMemGetInfo``, Vulkan's memory budget (or total when the driver
has none), Metal's ``recommendedMaxWorkingSetSize`` less what is allocated.

The device *set* of a binary (names, descriptions, totals) is cached by path, size, mtime and the
selection variables; free memory is read live whenever a device is not an NVIDIA card NVML can read.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from llamafit import store
from llamafit.memory import backends
from llamafit.server.bounded import run_bounded
from llamafit.units import MiB

LIST_TIMEOUT = 10.0
CACHE_VERSION = 1
_LINE = re.compile(
    r"^\s+(?P<name>[A-Za-z][A-Za-z_]*\d+): (?P<desc>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$"
)
# ggml-vulkan's device line at debug verbosity (ggml-vulkan.cpp:5168): "uma" is an integrated GPU
_VK_INFO = re.compile(r"ggml_vulkan: (?P<i>\d+) = .* \| uma: (?P<uma>[01]) \|")
# device name prefix -> backend, as each backend names its devices (GGML_CUDA_NAME, GGML_VK_NAME, ...)
# variables that change which devices a backend shows (docs/backends.md)
SELECTION_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "GGML_VK_VISIBLE_DEVICES",
    "ONEAPI_DEVICE_SELECTOR",
    "MUSA_VISIBLE_DEVICES",
)


@dataclass(frozen=True)
class ListedDevice:
    name: str  # llama.cpp's device name: CUDA0, Vulkan1, MTL0, RPC0, ...
    description: str
    total: int  # bytes (the server prints MiB, rounded down)
    free: int
    backend: str  # CUDA, ROCm, MUSA, Vulkan, SYCL, Metal, RPC, or "" when llamafit does not know it
    integrated: bool = False  # the backend says it is an integrated GPU (shares host memory)


def backend_of(name: str) -> str:
    """The backend of a listed device's name (``CUDA0``, ``MTL0``), "" for one llamafit does not know."""
    b = backends.backend(name)
    return b.name if b is not None else ""


# a device line llamafit cannot read: indented, a name and a colon, then anything (common/arg.cpp:1165)
_ANY_DEVICE_LINE = re.compile(r"^\s+(?P<name>[A-Za-z][A-Za-z_]*\d*): ")
MAX_DEVICE_MIB = 16 << 20  # 16 TiB: no device reports more; a larger number is not a device's memory


def parse_device_list(text: str, debug: str = "") -> list[ListedDevice]:
    """The devices of ``--list-devices`` output; ``debug`` is the stderr of the same run (Vulkan's
    per-device lines say which devices are integrated). Devices with no memory (BLAS and other
    pseudo-devices) are left out, as are lines ``unreadable`` names (the plan then cannot size them)."""
    return read_device_list(text, debug)[0]


def read_device_list(text: str, debug: str = "") -> tuple[list[ListedDevice], list[str], list[str]]:
    """(devices, notes, unreadable): the output is input like any other. A name listed twice is one device
    (the first); free memory above the total is the total; a line that cannot be read, or that reports
    an impossible size, is ``unreadable``: a device the server will use that llamafit cannot size."""
    vk_uma = {int(m["i"]): m["uma"] == "1" for m in _VK_INFO.finditer(debug)}
    out: list[ListedDevice] = []
    notes: list[str] = []
    unreadable: list[str] = []
    listing = text.split("Available devices:", 1)[-1]
    for line in listing.splitlines():
        m = _LINE.match(line)
        if not m:
            if (u := _ANY_DEVICE_LINE.match(line)) is not None and "(none)" not in line:
                unreadable.append(f"{u['name']}: {line.strip()[:120]!r}")
            continue
        total, free = int(m["total"]), int(m["free"])
        if total == 0:
            continue
        name, backend = m["name"], backend_of(m["name"])
        if total > MAX_DEVICE_MIB:
            unreadable.append(f"{name}: reports {total} MiB, more than any device has")
            continue
        if any(d.name == name for d in out):
            notes.append(f"llama-server lists {name} twice: it is one device (its first line is used)")
            continue
        if free > total:
            notes.append(f"{name} reports {free} MiB free of {total} MiB: planned with {total} MiB free")
            free = total
        integrated = backend == "Vulkan" and vk_uma.get(int(re.sub(r"^\D+", "", name)), False)
        out.append(ListedDevice(name, m["desc"], total * MiB, free * MiB, backend, integrated))
    return out, notes, unreadable


class DeviceListError(Exception):
    pass


@dataclass(frozen=True)
class Listing:
    devices: list[ListedDevice]
    notes: list[str]
    unreadable: list[str]


def list_devices(
    server: str, env: dict[str, str], *, extra: tuple[str, ...] = (), timeout: float = LIST_TIMEOUT
) -> list[ListedDevice]:
    """Run ``server [extra] --list-devices`` (bounded); DeviceListError when it cannot say."""
    return read_devices(server, env, extra=extra, timeout=timeout).devices


def read_devices(
    server: str, env: dict[str, str], *, extra: tuple[str, ...] = (), timeout: float = LIST_TIMEOUT
) -> Listing:
    """``list_devices`` with what it had to correct and the lines it could not read."""
    try:
        r = run_bounded([server, *extra, "-lv", "5", "--list-devices"], env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeviceListError(f"`{server} --list-devices` did not answer in {timeout:.0f} s") from None
    except OSError as e:
        raise DeviceListError(f"could not run {server}: {e.strerror or e}") from None
    if r.returncode != 0 or "Available devices" not in r.stdout + r.stderr:
        tail = ((r.stderr or r.stdout).strip().splitlines() or ["no output"])[-1][:200]
        raise DeviceListError(f"`{server} --list-devices` failed (exit {r.returncode}): {tail}")
    return Listing(*read_device_list(r.stdout, r.stderr))


def _key(server: str, env: dict[str, str]) -> str:
    st = os.stat(server)
    sel = ",".join(f"{k}={env[k]}" for k in SELECTION_VARS if k in env)
    return f"{os.path.realpath(server)}|{st.st_size}|{st.st_mtime_ns}|{sel}|{CACHE_VERSION}"


def cached_device_set(server: str, env: dict[str, str], cache_dir: Path) -> list[ListedDevice] | None:
    """The device set last listed for this binary and selection, or None (a cache we wrote earlier is
    input like any other: anything malformed is a miss)."""
    try:
        doc = store.read_json(cache_dir / "devices.json")
        rows = doc[_key(server, env)]
        out = [ListedDevice(**{k: r[k] for k in ListedDevice.__dataclass_fields__}) for r in rows]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return out if all(_valid(d) for d in out) else None


def _valid(d: ListedDevice) -> bool:
    """A cached row as --list-devices could have produced it: short strings, sizes of a real device."""
    texts = (d.name, d.description, d.backend)
    if not all(isinstance(t, str) and len(t) <= 256 and t.isprintable() for t in texts):
        return False
    sizes = (d.total, d.free)
    return all(type(v) is int and 0 <= v < 1 << 50 for v in sizes) and isinstance(d.integrated, bool)


def remember_device_set(server: str, env: dict[str, str], cache_dir: Path, devices: list[ListedDevice]) -> None:
    try:
        key = _key(server, env)
    except OSError:
        return
    rows = [asdict(d) for d in devices]
    # a cache that cannot be written costs one --list-devices per plan, nothing more
    store.update_json(cache_dir / "devices.json", lambda doc: {**(doc if isinstance(doc, dict) else {}), key: rows})

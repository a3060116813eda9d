"""Hardware described on the command line instead of detected: ``--gpu`` cards (their memory, bandwidth, FP16
throughput, backend and whether their memory is the host's) and ``--host-ram``. A plan for described hardware
reads nothing of this machine's devices, and of its RAM only what ``--host-ram`` or a unified-memory card does
not say (the plan notes it)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from llamafit.devices.types import Device, Host, Machine
from llamafit.errors import UsageError
from llamafit.units import parse_size


def parse_gpu_spec(spec: str) -> tuple[int, int]:
    """``--gpu FREE[/TOTAL]`` -> (free, total). A bare size is both; each needs a unit (a bare number
    would be MiB, and ``--gpu 24`` almost always meant GiB)."""
    from llamafit.devices import cards

    for part in spec.split("/", 1):
        if re.fullmatch(r"\s*[\d.]+\s*", part):
            like = cards.named_like(part) if "/" not in spec else []
            card = f", or the card: --gpu {like[0].lower().replace(' ', '-')}" if like else ""
            raise UsageError(f"--gpu {spec}: give a unit", hint=f"e.g. --gpu {part.strip()}GiB (or MiB){card}")
    if "/" in spec:
        a, b = spec.split("/", 1)
        free, total = parse_size(a), parse_size(b)
    else:
        free = total = parse_size(spec)
    if free > total:
        raise UsageError(f"--gpu {spec}: free memory exceeds total", hint="write FREE/TOTAL, e.g. 20GiB/24GiB")
    return free, total


# --gpu BACKEND:SPEC: the backend a described card runs with, as llama.cpp names its devices
_BACKEND_PREFIX = {
    "cuda": "CUDA",
    "rocm": "ROCm",
    "hip": "ROCm",
    "musa": "MUSA",
    "vulkan": "Vulkan",
    "metal": "MTL",
    "mtl": "MTL",
    "sycl": "SYCL",
}


def described_gpu(spec: str, index: int = 0) -> Device:
    """One ``--gpu`` device: ``FREE[/TOTAL]``, ``FREE[/TOTAL]@RATE`` (its memory bandwidth, e.g. 1008GB/s),
    ``FREE[/TOTAL]@CARD`` or ``CARD`` alone (a card of llamafit.devices.cards: its memory, bandwidth, FP16
    throughput, backend and whether its memory is the host's), each optionally after ``BACKEND:`` (cuda, rocm,
    vulkan, metal, sycl, musa: the backend it runs with, else the card's, else CUDA). Its id is the backend's
    (``CUDA0``, ``Vulkan0``, ``MTL0``) numbered by ``index`` (default 0)."""
    from llamafit.devices import cards
    from llamafit.devices.rates import parse_rate

    prefix, colon, rest = spec.partition(":")
    backend = _BACKEND_PREFIX.get(prefix.strip().lower()) if colon else None
    if colon and backend is None:
        raise UsageError(
            f"--gpu {spec}: no backend called {prefix!r}", hint="one of: " + ", ".join(sorted(_BACKEND_PREFIX))
        )
    body = rest if backend else spec
    mem, _, speed = body.partition("@")
    card = cards.lookup(mem) if not speed and not re.match(r"\s*[\d.]", mem) else None
    if card is not None:
        mem, speed = "", mem
    elif not speed and re.match(r"\s*[A-Za-z]", mem) and not re.fullmatch(r"\s*[A-Za-z]+\s*", mem):
        raise _unknown_card(spec, mem)  # a name, not a size ("rtx-9999"): say so, not "not a size"
    bandwidth, source, name = 0.0, "", f"--gpu {spec}"
    if speed:
        if re.search(r"/s\s*$", speed, re.IGNORECASE):
            bandwidth, source = parse_rate(speed, "--gpu"), "given"
        else:
            card = card or cards.lookup(speed)
            if card is None:
                raise _unknown_card(spec, speed)
            bandwidth, source, name = card.bandwidth, "table", f"{card.name} (--gpu {spec})"
    if mem:
        free, total = parse_gpu_spec(mem)
        if card is not None and card.memory and "/" not in mem:
            total = max(free, card.memory)  # what is free of a card whose size the table knows
    elif card is not None and card.memory:
        free = total = card.memory
    else:
        raise UsageError(
            f"--gpu {spec}: {card.name if card else spec} comes with several memory sizes",
            hint=f"give it, e.g. --gpu 48GiB@{speed.strip() or spec.strip()}",
        )
    if card is not None and card.memory and total > card.memory * 1.02:
        raise UsageError(f"--gpu {spec}: the {card.name} has {card.memory >> 30} GiB", hint="give FREE/TOTAL within it")
    backend = backend or (card.backend if card is not None else "CUDA")
    return Device(
        id=f"{backend}{index}",
        name=name,
        total=total,
        free=free,
        source="override",
        backend="Metal" if backend == "MTL" else backend,
        # Metal is Apple Silicon's GPU: its memory is always the host's (docs/backends.md, "Unified memory")
        uma=(card is not None and card.uma) or backend == "MTL",
        bandwidth=bandwidth,
        bandwidth_source=source,
        fp16=card.fp16 if card is not None else 0.0,
    )


def _unknown_card(spec: str, name: str) -> UsageError:
    from llamafit.devices import cards

    like = cards.named_like(name)
    return UsageError(
        f"--gpu {spec}: no card called {name.strip()!r} is known"
        + (f" (did you mean {' or '.join(like[:3])}?)" if like else ""),
        hint="give its bandwidth instead (e.g. 24GiB@1008GB/s), or one of: " + ", ".join(cards.names()[:12]) + ", ...",
    )


def described_gpus(specs: Sequence[str]) -> list[Device]:
    """``--gpu`` devices in order, numbered per backend as llama.cpp numbers them (CUDA0, CUDA1, Vulkan0); a value
    may list several, comma-separated (``--gpu rtx-4090,rtx-3090``, as llama.cpp's own lists are written)."""
    out: list[Device] = []
    count: dict[str, int] = {}
    for spec in (part.strip() for value in specs for part in value.split(",")):
        if not spec:
            raise UsageError("--gpu has an empty entry", hint="e.g. --gpu rtx-4090,rtx-3090 or --gpu 24GiB --gpu 24GiB")
        d = described_gpu(spec)
        prefix = d.id.rstrip("0123456789")
        out.append(replace(d, id=f"{prefix}{count.get(prefix, 0)}"))
        count[prefix] = count.get(prefix, 0) + 1
    return out


def described_machine(specs: Sequence[str], host: Host | None, here: Callable[[], Host]) -> Machine:
    """The machine ``--gpu`` describes; its host RAM is ``--host-ram``'s, else a unified-memory card's (that
    machine's RAM, not this one's), else this machine's, said so."""
    devs = described_gpus(specs)
    notes = ["planning for the GPUs given with --gpu"]
    pool = [d for d in devs if d.uma]
    if host is None and pool:
        host = Host(total=max(d.total for d in pool), available=max(d.free for d in pool))
        notes.append("host RAM: the unified-memory card's (give --host-ram to say otherwise)")
    elif host is None:
        host = here()
        notes.append("host RAM: this machine's (give --host-ram for the other machine's)")
    return Machine(tuple(devs), host, tuple(notes))


def described_host(spec: str) -> Host:
    """``--host-ram AVAILABLE[/TOTAL]``: the host's RAM as given (a unit is required)."""
    try:
        available, total = parse_gpu_spec(spec)
    except UsageError as e:
        raise UsageError(e.message.replace("--gpu", "--host-ram"), hint="e.g. --host-ram 480GiB/512GiB") from None
    return Host(total=total, available=available)

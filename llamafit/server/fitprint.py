"""The binary's own no-alloc measurement: ``llama-fit-params -fitp on``, beside llama-server in llama.cpp builds.

It loads the model with ``no_alloc`` and builds a real llama_context (common/fit.cpp:30-120), so its
buffers are the ones that build would allocate for the settings it is given, without allocating them. At
``-v`` it logs each buffer as the server does, to two decimals (``sched_reserve: CUDA0 compute buffer size
= 156.02 MiB``); its stdout table is floored to whole MiB, so the log is read instead.

What it cannot be given (it parses only the options of LLAMA_EXAMPLE_FIT_PARAMS): ``-kvu``, the server's
output limit (it reserves ``n_batch`` outputs: src/llama-context.cpp:252, where the server asks for one
per slot, tools/server/server-context.cpp:1116), a drafter or a projector. ``llamafit.planning.bound`` prices
those differences with the memory model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamafit.numbers import DEC
from llamafit.server.bounded import run_tool
from llamafit.server.logparse import strip
from llamafit.units import MiB

NAME = "llama-fit-params"
# a no-alloc load reads the file's header and builds the graphs: seconds even for the largest models
TIMEOUT = 120.0
_COMPUTE = re.compile(rf"sched_reserve: +(?P<buft>\S+) compute buffer size = +(?P<mib>{DEC}) MiB")
_RESERVING = re.compile(r"sched_reserve: reserving")


class NoAllocFailed(Exception):
    """The measurement could not be made; the message says why (for the plan's note)."""


@dataclass(frozen=True)
class NoAlloc:
    argv: tuple[str, ...]
    compute: Mapping[str, int]  # buffer type -> bytes of the last reserve (the one the server keeps), from its log
    # its stdout table: device name ("Host" for the host's buffers) -> whole MiB of compute (floored)
    table: Mapping[str, int]

    @property
    def logged(self) -> bool:
        """The log's exact lines were read (else only the table's floored MiB)."""
        return bool(self.compute)


def beside(server_path: str) -> str | None:
    """The llama-fit-params built with this llama-server (the same folder), or None."""
    p = Path(server_path).with_name(NAME)
    return str(p) if p.is_file() else None


def parse_compute(text: str) -> dict[str, int]:
    """Each buffer type's compute buffer from a -v log; a re-reserve (its line ``reserving ...``) replaces."""
    out: dict[str, int] = {}
    for raw in text.splitlines():
        line = strip(raw)
        if _RESERVING.search(line):
            out = {}
        elif m := _COMPUTE.search(line):
            out[m["buft"]] = round(float(m["mib"]) * MiB)
    return out


# its log is written by a thread that its exit cuts short (fit-params.cpp:71-77 flushes it before the compute lines,
# then returns): a DeepSeek-V4 shape lost them in 17 of 40 runs here, so three tries all lost them one plan in
# thirteen; eight, one in a thousand (a run takes a fraction of a second)
ATTEMPTS = 8


def measure(binary: str, args: Sequence[str], env: dict[str, str], timeout: float = TIMEOUT) -> NoAlloc:
    """Run ``binary -fitp on -v ARGS`` (its process group killed at ``timeout``) and read its compute buffers.

    The table it prints on stdout (common/fit.cpp:1100-1112, whole MiB, always written) says which devices
    have compute; a run whose log lacks some of their lines is run again, and after the last attempt the
    table alone is returned."""
    argv = (binary, *args, "-fitp", "on", "-v")
    table: dict[str, int] = {}
    for _ in range(ATTEMPTS):
        done = run_tool(argv, env=env, timeout=timeout, fail=NoAllocFailed)
        if done.returncode != 0:
            last = [ln for ln in (done.stderr or "").splitlines() if ln.strip()][-1:]
            tail = f" ({strip(last[0])})" if last else ""
            raise NoAllocFailed(f"{NAME} exited {done.returncode} without a compute buffer{tail}")
        compute, table = parse_compute(done.stderr), parse_table(done.stdout)
        if compute and len(compute) >= sum(1 for v in table.values() if v > 0):
            return NoAlloc(argv, compute, table)
    if not table:
        raise NoAllocFailed(f"{NAME} printed no memory table")
    return NoAlloc(argv, {}, table)


def parse_table(stdout: str) -> dict[str, int]:
    """Each row of the ``DEVICE model context compute`` table: the device's compute, whole MiB."""
    out: dict[str, int] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            out[parts[0]] = int(parts[3])
    return out

"""The host's NUMA nodes as llama.cpp counts them: ``/sys/devices/system/node/node0``, ``node1``, ... up to the first
one missing, at most ``GGML_NUMA_MAX_NODES`` (ggml-cpu/ggml-cpu.c:545, 656-662). A host without that directory
(not Linux) is one node."""

from __future__ import annotations

from pathlib import Path

NODES = Path("/sys/devices/system/node")
MAX_NODES = 8  # GGML_NUMA_MAX_NODES


def numa_nodes(root: Path = NODES) -> int:
    """How many NUMA nodes ggml-cpu would find under ``root`` (1 where it finds none)."""
    n = 0
    try:
        while n < MAX_NODES and (root / f"node{n}").exists():
            n += 1
    except OSError:  # an unreadable sysfs: as ggml-cpu, which stops at the first node it cannot stat
        pass
    return max(1, n)

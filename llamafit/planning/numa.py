"""A host of several NUMA nodes against llama-server's ``--numa``: the note a plan carries where the flag would
speed generation.

Without ``--numa`` llama.cpp leaves NUMA alone (src/llama.cpp:137-147): the loader maps the model with its pages
prefetched (MAP_POPULATE, src/llama-mmap.cpp:486-492), read in by the one thread that loads it, so from a cold
page cache they land on that thread's node and every thread that computes on the host reads them from there.
``--numa distribute`` spreads the threads over the nodes and maps the model without prefetch
(src/llama-mmap.cpp:486, 521-526): a page lands on the node of the thread that first touches it, so with the page
cache dropped first the weights spread with the threads (the flag's help says to drop it:
common/arg.cpp:2725-2738). llama.cpp issue #11744 measured the difference on a dual EPYC 9175F (16 channels of
DDR5-6400, Llama-3.1-70B F16): 2.4 tok/s without, 4.31 with.
"""

from __future__ import annotations

from collections.abc import Mapping

from llamafit.fit.plan import Plan
from llamafit.options import Options
from llamafit.server.args import ServerArgs
from llamafit.speed.work import host_read
from llamafit.units import fmt_bytes


def numa_note(plan: Plan, user: ServerArgs, environ: Mapping[str, str], o: Options) -> str | None:
    """The note for a plan that reads weights from the memory of this host's several NUMA nodes without ``--numa``
    (None: one node, a described host, weights only on the GPUs, or the flag given)."""
    nodes = plan.host.host.numa_nodes
    if nodes < 2 or o.host_bandwidth or o.host_cores or user.has("--numa") or "LLAMA_ARG_NUMA" in environ:
        return None
    read = host_read(plan.model, plan.footprint.placement)
    if read <= 0:
        return None
    return (
        f"this host has {nodes} NUMA nodes and the plan reads {fmt_bytes(int(read))} of weights from host memory "
        "for each token: without --numa, llama-server reads them from the node the page cache put them on (the "
        "loading thread's). --numa distribute, after dropping the page cache (as root: sync; echo 3 > "
        "/proc/sys/vm/drop_caches), spreads the threads and the weights over the nodes; on a dual EPYC 9175F "
        "that took generation from 2.4 to 4.31 tok/s (llama.cpp issue #11744). The speed shown is without it."
    )

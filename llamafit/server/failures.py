"""Why llama-server did not come up: one actionable message per failure class, read from its own lines.

The strings are llama.cpp b11434's (docs/server-cli.md §7); each class says what happened,
on which device, how much was asked for, what the plan predicted there, and what to try.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from llamafit.numbers import DEC, INT
from llamafit.server.logparse import is_error, strip
from llamafit.units import MiB, fmt_bytes

_CUDA_OOM = re.compile(rf"allocating (?P<mib>{DEC}) MiB on device (?P<dev>{INT}): cudaMalloc failed: (?P<why>.*)")
_BUFT_FAIL = re.compile(rf"failed to allocate (?P<buft>\S+) buffer of size (?P<size>{INT})")
_HOST_OOM = re.compile(
    rf"ggml_aligned_malloc: insufficient memory \(attempted to allocate (?P<mb>{DEC}) MB\)"
    rf"|ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size (?P<size>{INT})"
)
_OPEN_FAIL = re.compile(r"failed to open GGUF file '(?P<path>.*)' \((?P<why>.*)\)")
_BAD_ARG = re.compile(r"error: invalid argument: (?P<arg>\S+)")
_ARG_ERR = re.compile(r'error while handling (?:argument|environment variable) "(?P<arg>[^"]+)": (?P<why>.*)')
_BIND = re.compile(rf"couldn't bind HTTP server socket, hostname: (?P<host>\S+), port: (?P<port>{INT})")
_MTMD_ERR = re.compile(r"(?:mtmd_init_from_file|clip_init): (?:error: )?(?P<why>.*)")
_CUDA_ERR = re.compile(r"CUDA error: (?P<why>.*)")
_CTX_ERR = re.compile(
    r"(quantized V cache requires flash_attn|model does not support different K|SPLIT_MODE_TENSOR requires"
    r"|does not divide n_embd_head|context type MTP requested but model doesn't contain MTP layers)"
)


@dataclass(frozen=True)
class Failure:
    kind: str  # device_oom_weights | device_oom_kv | device_oom_compute | host_oom | model_file | bad_argument |
    # port_in_use | abort | draft | context | mmproj | device_oom_mmproj | unknown
    message: str
    hint: str
    device: str | None = None
    asked: int | None = None  # bytes the failing allocation asked for


def classify(
    lines: Sequence[str],
    returncode: int,
    predicted: dict[str, int] | None = None,
    usable: dict[str, int] | None = None,
) -> Failure:
    """Turn the server's last words and exit status into one Failure. ``predicted``/``usable`` are the
    plan's per-device totals, for the message. The first class whose words the log has wins: a device out of
    memory, the host out of memory, what the server refused (``_refused``), a signal; else its last error."""
    text = [strip(line) for line in lines]
    joined = "\n".join(text)
    return (
        _device_oom(text, joined, predicted, usable)
        or _host_oom(text)
        or _refused(text, joined)
        or _killed(text, returncode)
        or _unknown(lines, text, returncode)
    )


def _device_oom(
    text: Sequence[str], joined: str, predicted: dict[str, int] | None, usable: dict[str, int] | None
) -> Failure | None:
    """A device's allocation that failed, by what it was for (the projector, the weights, the cache, compute)."""
    cuda_oom = next((m for t in text if (m := _CUDA_OOM.search(t))), None)
    buft_fail = next((m for t in text if (m := _BUFT_FAIL.search(t))), None)
    if cuda_oom:
        device, asked = f"CUDA{cuda_oom['dev']}", int(float(cuda_oom["mib"]) * MiB)
    elif buft_fail and buft_fail["buft"].startswith(("CUDA", "ROCm", "Vulkan", "Metal")):
        device, asked = buft_fail["buft"].split("_")[0], int(buft_fail["size"])
    else:
        return None
    plan_says = ""
    if predicted and device in predicted:
        plan_says = f"; the plan put {fmt_bytes(predicted[device])} there" + (
            f" of {fmt_bytes(usable[device])} usable" if usable and device in usable else ""
        )
    what = fmt_bytes(asked) if asked else "memory"
    oom_hint = "leave more room with --margin 2GiB, a smaller -c, --n-cpu-moe N (MoE), or --spec off"
    if "failed to load multimodal model" in joined:
        return Failure(
            "device_oom_mmproj",
            f"{device} ran out of memory loading the projector (asked for {what}){plan_says}",
            "keep the projector on the CPU with --no-mmproj-offload, or leave more room with --margin 2GiB",
            device,
            asked,
        )
    for code, words, doing in (
        ("device_oom_weights", ("error loading model", "unable to allocate"), "loading the weights"),
        ("device_oom_kv", ("kv cache",), "allocating the KV cache"),
        ("device_oom_compute", ("compute", "graph_reserve", "ggml_gallocr"), "for the compute buffers"),
    ):
        if any(w in joined for w in words):
            return Failure(
                code, f"{device} ran out of memory {doing} (asked for {what}){plan_says}", oom_hint, device, asked
            )
    return Failure("device_oom", f"{device} ran out of memory (asked for {what}){plan_says}", oom_hint, device)


def _host_oom(text: Sequence[str]) -> Failure | None:
    if (m := next((m for t in text if (m := _HOST_OOM.search(t))), None)) is None:
        return None
    size = int(float(m["mb"]) * MiB) if m["mb"] else int(m["size"])
    return Failure(
        "host_oom",
        f"the host ran out of memory (an allocation of {fmt_bytes(size)} failed)",
        "close other programs, use -lm mmap (the default) instead of -lm none, fewer slots (-np) or a "
        "smaller --cache-ram",
        None,
        size,
    )


def _refused(text: Sequence[str], joined: str) -> Failure | None:
    """What the server could not open or load, or refused: the model file, an argument, the port, the context
    settings, the projector, the drafter."""
    if m := next((m for t in text if (m := _OPEN_FAIL.search(t))), None):
        return Failure("model_file", f"llama-server could not open {m['path']}: {m['why']}", "check the path")
    if "failed to load model" in joined and ("invalid magic" in joined or "GGUF" in joined):
        return Failure("model_file", "llama-server could not read the model file as GGUF", "is the file complete?")
    if m := next((m for t in text if (m := _BAD_ARG.search(t))), None):
        return Failure(
            "bad_argument",
            f"this llama-server does not accept {m['arg']}",
            "check the flag with llama-server --help; it may be newer or older than this build",
        )
    if m := next((m for t in text if (m := _ARG_ERR.search(t))), None):
        return Failure("bad_argument", f"llama-server refused {m['arg']}: {m['why']}", "fix the value or drop the flag")
    if m := next((m for t in text if (m := _BIND.search(t))), None):
        return Failure(
            "port_in_use",
            f"port {m['port']} on {m['host']} is already in use",
            "stop the other server or pass -- --port N (0 picks a free one)",
        )
    if m := next((m for t in text if (m := _CTX_ERR.search(t))), None):
        return Failure("context", f"llama-server refused the context settings: {m.group(1)}", "adjust -ctk/-ctv/-fa")
    if "failed to load multimodal model" in joined:
        why = next((m["why"] for t in text if (m := _MTMD_ERR.search(t))), "")
        return Failure(
            "mmproj",
            "llama-server could not load the multimodal projector" + (f": {why}" if why else ""),
            "pass the mmproj file made for this model (--mmproj), or drop it",
        )
    if "failed to load draft model" in joined or "failed to create MTP context" in joined:
        return Failure("draft", "llama-server could not load the drafter", "check --draft, or run with --spec off")
    return None


def _killed(text: Sequence[str], returncode: int) -> Failure | None:
    if not (returncode < 0 or returncode >= 128):
        return None
    sig = -returncode if returncode < 0 else returncode - 128
    cuda = next((m for t in text if (m := _CUDA_ERR.search(t))), None)
    why = f" after a CUDA error: {cuda['why']}" if cuda else ""
    name = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV"}.get(sig, f"signal {sig}")
    if not why and (said := next((m.group(1) for t in text if (m := _ABORT.match(t.strip()))), None)):
        why = f": {said[:200]}"  # GGML_ABORT's own words
    return Failure(
        "abort",
        f"llama-server was killed by {name} while loading{why}",
        "an out-of-memory during warmup aborts: try --margin 2GiB or a smaller -c"
        if sig == 6
        else "the system may have run out of memory (check dmesg for the OOM killer)",
    )


def _unknown(lines: Sequence[str], text: Sequence[str], returncode: int) -> Failure:
    # the last error-level line, else the last line that says "error", else its very last words
    tail = next((strip(r) for r in reversed(lines) if is_error(r)), "") or next(
        (t for t in reversed(text) if "error" in t.lower()), next((t for t in reversed(text) if t.strip()), "")
    )
    return Failure(
        "unknown",
        f"llama-server exited with code {returncode} before it was ready" + (f": {tail}" if tail else ""),
        "run with --verbose to see its whole log, or --log-file FILE to keep it",
    )


def abort_reason(stderr: str) -> str:
    """What a llama.cpp that aborted says went wrong: GGML_ABORT's ``file:line: message`` line (the debugger
    backtrace printed after it says nothing useful), else the last error-looking line, else the last line."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    for x in lines:
        if m := _ABORT.match(x):
            return m.group(1)[:200]
    errors = [x for x in lines if re.search(r"error|fail", x, re.IGNORECASE) and not _BACKTRACE.search(x)]
    return (errors or lines or ["no output"])[-1][:200]


_ABORT = re.compile(r"^\S+\.(?:c|cc|cpp|h|m|mm|cu):\d+: (?:GGML_ASSERT\()?(.+)$")
_BACKTRACE = re.compile(r"No such file or directory$|^#\d+ |libc-start|^\[New LWP|^\[Thread")

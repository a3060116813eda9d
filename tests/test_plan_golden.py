"""Plans of the benchmark shapes are held to a committed record, so a refactor cannot change a plan unnoticed.

Each case plans a shape-faithful file of a public model (bench/shapes.py, tests/factory/) on a described
machine (no NVML, no host RAM reading, no server probe), and its ``llamafit.plan/1`` JSON, or the refusal's
message and hint, must equal the one in ``tests/golden/plans.json``. A change that means to change plans
regenerates the record with ``LLAMAFIT_REGEN_GOLDEN=1 pytest tests/test_plan_golden.py`` and says why in
the CHANGELOG.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import factory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import shapes

from llamafit.devices.machine import Device, Host, Machine
from llamafit.errors import LlamafitError
from llamafit.fit.plan import to_json
from llamafit.options import Options
from llamafit.planning.planner import prepare
from llamafit.server.capabilities import ASSUMED
from llamafit.units import GiB

GOLDEN = Path(__file__).parent / "golden" / "plans.json"
HOST = Host(total=64 * GiB, available=56 * GiB)

SHAPES: dict[str, Any] = {
    "llama31-8b": factory.llama31_8b,
    "qwen3-8b": factory.qwen3_8b,
    "qwen3-0.6b": factory.qwen3_0_6b,
    "llama31-70b": shapes.llama31_70b,
    "gemma3-4b": factory.gemma3_4b,
    "qwen3-30b-a3b": shapes.qwen3_30b_a3b,
    "mla": shapes.mla_v2_lite_like,
    "hybrid": shapes.hybrid_like,
    "hybrid-mtp": shapes.hybrid_mtp_like,
    "mamba": shapes.mamba_130m,
    "glm45-air-8": shapes.glm45_air_cut,
    "gemma3-mmproj": lambda: factory.gemma3_siglip_896(2560),
}


@dataclass(frozen=True)
class Case:
    model: str
    gpus: tuple[tuple[float, float], ...] = ()  # (total GiB, free GiB) per CUDA device
    args: tuple[str, ...] = ()
    spec: str = "auto"
    prefer: str = "context"
    draft: str | None = None  # a key of SHAPES
    margin: str = "1024"
    min_ctx: int = 4096
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        gpus = "+".join(f"{t:g}/{f:g}" for t, f in self.gpus) or "cpu"
        parts = [self.model, gpus, *self.args, f"spec={self.spec}"]
        if self.prefer != "context":
            parts.append(f"prefer={self.prefer}")
        if self.draft:
            parts.append(f"draft={self.draft}")
        if self.margin != "1024":
            parts.append(f"margin={self.margin}")
        if self.min_ctx != 4096:
            parts.append(f"min_ctx={self.min_ctx}")
        parts += [f"{k}={v}" for k, v in sorted(self.extra.items())]
        return " ".join(parts)


ONE_24 = ((24.0, 24.0),)
ONE_12 = ((12.0, 12.0),)
ONE_8 = ((8.0, 8.0),)
TWO = ((16.0, 16.0), (6.0, 6.0))
BUSY = ((24.0, 9.5),)

CASES: list[Case] = [
    *(Case(m, g) for m in SHAPES if m != "gemma3-mmproj" for g in ((), ONE_24, ONE_8, TWO)),
    Case("llama31-8b", ONE_12),
    Case("llama31-8b", BUSY, ("-c", "32768")),
    Case("llama31-8b", ONE_24, ("-ctk", "q8_0", "-ctv", "q8_0", "-np", "2")),
    Case("llama31-8b", ONE_24, ("-np", "3", "-no-kvu")),
    Case("llama31-8b", ONE_24, ("-ub", "1024", "-b", "4096", "-fa", "off")),
    Case("llama31-8b", ONE_24, ("-ngl", "20")),
    Case("llama31-8b", TWO, ("-ts", "3,1")),
    Case("llama31-8b", ((2.0, 2.0),)),
    Case("llama31-8b", ((2.0, 2.0), (2.0, 2.0))),
    Case("llama31-8b", ONE_24, margin="CUDA0=4GiB,host=2GiB"),
    Case("llama31-8b", ONE_24, min_ctx=65536),
    Case("llama31-70b", ((24.0, 24.0), (24.0, 24.0))),
    Case("llama31-70b", ONE_24, ("-c", "8192")),
    Case("qwen3-30b-a3b", ((12.0, 12.0),)),
    Case("qwen3-30b-a3b", ((12.0, 12.0),), ("-cmoe",)),
    Case("qwen3-30b-a3b", ((12.0, 12.0),), ("--n-cpu-moe", "10")),
    Case("gemma3-4b", ONE_24, ("--swa-full",)),
    Case("gemma3-4b", ONE_8, ("-c", "0")),
    Case("mla", ONE_24, ("-fa", "off")),
    Case("hybrid", ONE_24, ("-np", "2", "-no-kvu")),
    Case("hybrid-mtp", ONE_24, spec="draft-mtp"),
    Case("hybrid-mtp", ((6.0, 6.0),)),
    Case("hybrid-mtp", ((6.0, 6.0),), prefer="speed"),
    Case("hybrid-mtp", ((6.0, 6.0),), spec="draft-mtp"),
    Case("hybrid-mtp", ONE_24, spec="off"),
    Case("glm45-air-8", ONE_24, spec="draft-mtp"),
    Case("glm45-air-8", TWO, ("-c", "16384")),
    Case("qwen3-8b", ONE_24, draft="qwen3-0.6b"),
    Case("qwen3-8b", ((7.0, 7.0),), draft="qwen3-0.6b"),
    Case("qwen3-8b", ((7.0, 7.0),), draft="qwen3-0.6b", spec="draft-simple"),
    Case("qwen3-8b", TWO, draft="qwen3-0.6b"),
    Case("qwen3-8b", ONE_24, ("--spec-type", "ngram-simple")),
    Case("qwen3-8b", ONE_24, spec="ngram-mod"),
    Case("gemma3-4b", ONE_24, extra={"mmproj": "gemma3-mmproj"}),
    Case("gemma3-4b", ONE_8, ("--no-mmproj-offload",), extra={"mmproj": "gemma3-mmproj"}),
    # the choice by speed under each --prefer (llamafit.fit.choice): a dense model, a MoE, a hybrid, two cards
    *(
        Case(m, g, prefer=p)
        for m, g in (("qwen3-8b", ONE_8), ("qwen3-30b-a3b", ONE_12), ("hybrid", ((4.0, 4.0),)), ("llama31-8b", TWO))
        for p in ("balanced", "speed")
    ),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("golden")
    return {k: make().write(d / f"{k}.gguf") for k, make in SHAPES.items()}


def _machine(case: Case) -> Machine:
    gpus = tuple(
        Device(f"CUDA{i}", f"gpu{i}", int(total * GiB), int(free * GiB)) for i, (total, free) in enumerate(case.gpus)
    )
    return Machine(gpus, HOST)


def plan_case(case: Case, files: dict[str, Path]) -> dict[str, Any]:
    args = list(case.args)
    if "mmproj" in case.extra:
        args += ["--mmproj", str(files[case.extra["mmproj"]])]
    o = Options(
        server_args=args,
        cpu_only=not case.gpus,
        margin=case.margin,
        min_ctx=case.min_ctx,
        spec=case.spec,
        prefer=case.prefer,
        draft=str(files[case.draft]) if case.draft else None,
        calibrate=False,
        host_cores=8,  # the host nobody measured: a desktop of 8 cores assumed, whatever machine runs the test
    )
    try:
        prep = prepare(str(files[case.model]), o, machine=_machine(case), server=(None, ASSUMED))
    except LlamafitError as e:
        doc: dict[str, Any] = {"error": type(e).__name__, "message": e.message, "hint": e.hint}
    else:
        doc = to_json(prep.plan, prep.argv)
        doc["notes"] = [*doc["notes"], *prep.notes]
    # the files live in a fresh temporary folder per run
    text = json.dumps(doc).replace(str(next(iter(files.values())).parent), "<dir>")
    out: dict[str, Any] = json.loads(text)
    return out


def test_every_case_has_a_distinct_key() -> None:
    keys = [c.key for c in CASES]
    assert len(keys) == len(set(keys))


def test_plans_match_the_committed_record(files: dict[str, Path]) -> None:
    got = {c.key: plan_case(c, files) for c in CASES}
    if os.environ.get("LLAMAFIT_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want), "cases added or removed: regenerate the record"
    changed = [k for k in got if got[k] != want[k]]
    assert not changed, f"{len(changed)} plan(s) changed, first: {changed[0]}"

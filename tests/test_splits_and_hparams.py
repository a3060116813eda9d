"""Split sets (any shard names the set; missing and stray shards are errors) and hparam resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.errors import BadModelFileError, ModelNotFoundError
from llamafit.gguf.model import load_model
from llamafit.gguf.writer import TensorSpec, write_gguf
from tests import factory

write_split = factory.write_split


def test_any_shard_loads_the_whole_set(tmp_path: Path) -> None:
    shape = factory.dense(n_layer=4)
    paths = write_split(tmp_path, "model-Q8_0", shape, 3)
    for p in paths:
        m = load_model(p)
        assert m.path == str(paths[0])
        assert list(m.shards) == [str(x) for x in paths]
        assert len(m.tensors) == len(shape.tensors)
        assert m.hparams.n_layer_all == 4
    assert {t.shard for t in load_model(paths[1]).tensors} == {0, 1, 2}


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    paths = write_split(tmp_path, "m", factory.dense(), 3)
    paths[1].unlink()
    with pytest.raises(ModelNotFoundError, match=r"m-00002-of-00003\.gguf"):
        load_model(paths[0])


def test_a_stray_shard_is_named(tmp_path: Path) -> None:
    paths = write_split(tmp_path, "m", factory.dense(), 2)
    stray = tmp_path / "m-00003-of-00002.gguf"
    stray.write_bytes(paths[1].read_bytes())
    with pytest.raises(BadModelFileError, match=r"m-00003-of-00002\.gguf"):
        load_model(paths[0])


def test_a_shard_from_another_set_is_caught_by_split_no(tmp_path: Path) -> None:
    paths = write_split(tmp_path, "m", factory.dense(), 3)
    paths[2].write_bytes(paths[1].read_bytes())  # shard 3 is really shard 2
    with pytest.raises(BadModelFileError, match=r"split\.no"):
        load_model(paths[0])


def test_tensor_count_must_match_split_tensors_count(tmp_path: Path) -> None:
    shape = factory.dense(n_layer=2)
    paths = write_split(tmp_path, "m", shape, 2)
    # rewrite shard 2 with one tensor fewer but the same split keys
    kv = {"split.no": 1, "split.count": 2, "split.tensors.count": len(shape.tensors)}
    write_gguf(paths[1], shape.arch, kv, shape.tensors[1::2][:-1])
    with pytest.raises(BadModelFileError, match="tensors expected"):
        load_model(paths[0])


def test_a_renamed_shard_is_refused(tmp_path: Path) -> None:
    paths = write_split(tmp_path, "m", factory.dense(), 2)
    renamed = tmp_path / "renamed.gguf"
    paths[0].rename(renamed)
    with pytest.raises(BadModelFileError, match="NNNNN-of-MMMMM"):
        load_model(renamed)


def test_gemma3_sliding_window_pattern(tmp_path: Path) -> None:
    m = load_model(factory.gemma3(n_layer=12).write(tmp_path / "g.gguf"))
    hp = m.hparams
    assert hp.swa_type == "standard"
    assert hp.n_swa == 512
    # pattern 6: five sliding-window layers, then one global (gemma3.cpp:7, llama-hparams.cpp:8-22)
    assert [il for il in range(12) if not hp.is_swa[il]] == [5, 11]


def test_gemma3_without_a_window_has_no_swa(tmp_path: Path) -> None:
    shape = factory.gemma3()
    shape.kv["gemma3.attention.sliding_window"] = 0
    hp = load_model(shape.write(tmp_path / "g.gguf")).hparams
    assert hp.swa_type == "none" and not any(hp.is_swa)


def test_explicit_bool_pattern_wins(tmp_path: Path) -> None:
    shape = factory.gemma3(n_layer=6)
    shape.kv["gemma3.attention.sliding_window_pattern"] = [True, False, True, False, True, False]
    hp = load_model(shape.write(tmp_path / "g.gguf")).hparams
    assert hp.is_swa == (True, False, True, False, True, False)


def test_qwen35_recurrent_layers_and_nextn(tmp_path: Path) -> None:
    hp = load_model(factory.qwen35(n_layer=8, n_nextn=1).write(tmp_path / "q.gguf")).hparams
    assert hp.n_layer_all == 9 and hp.n_nextn == 1 and hp.n_layer == 8
    # every 4th layer is full attention; the NextN block is never recurrent (qwen35.cpp:17-23)
    assert [il for il in range(9) if not hp.is_recr[il]] == [3, 7, 8]
    assert hp.supports_rs_rollback
    # gated delta net state: (d_conv-1)*(d_inner + 2*n_group*d_state), d_state*d_inner
    assert hp.n_embd_r() == 3 * (128 + 2 * 2 * 32)
    assert hp.n_embd_s() == 32 * 128


def test_per_layer_head_counts(tmp_path: Path) -> None:
    shape = factory.dense(n_layer=4, n_head_kv=2)
    shape.kv["llama.attention.head_count_kv"] = [2, 4, 2, 4]
    hp = load_model(shape.write(tmp_path / "m.gguf")).hparams
    assert hp.n_head_kv == (2, 4, 2, 4)
    assert hp.n_embd_v_gqa_max() == 4 * 32


def test_mla_detection(tmp_path: Path) -> None:
    hp = load_model(factory.deepseek2().write(tmp_path / "d.gguf")).hparams
    assert hp.mla
    assert hp.head_k == 128 + 32  # kv_lora_rank + rope dims, K-only cache


def test_missing_block_count_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_gguf(p, "llama", {"llama.embedding_length": 8}, [TensorSpec("x.weight", (32,))])
    with pytest.raises(BadModelFileError, match="block_count"):
        load_model(p)

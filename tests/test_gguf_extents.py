"""A local file's vocabulary jumped over on a later read (llamafit.gguf.extents): the same header, a fraction of
the reads, and a remembered extent that no longer holds, or a cache that is not ours, never makes a wrong header."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from llamafit.gguf import reader
from llamafit.gguf.extents import KEPT, SCHEMA, extents_path, read_remembered
from llamafit.gguf.model import load_model
from llamafit.gguf.reader import TAIL, read_file_header
from tests import factory


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file with two long string arrays: 70k tokens and as many merges (a byte-level BPE tokenizer)."""
    shape = factory.with_vocab(factory.dense(n_layer=2, n_vocab=70000), factory.bpe_vocab(70000, 69000))
    return shape.write(tmp_path_factory.mktemp("extents") / "m.gguf")


@pytest.fixture
def vocab_model(written: Path, tmp_path: Path) -> Path:
    """A copy of its own (a test may change it in place)."""
    return Path(shutil.copy(written, tmp_path / "m.gguf"))


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The strings of every long array a read walks one by one, as it does."""
    counts: list[int] = []
    plain = reader._Cursor.skip_strings

    def counted(self: reader._Cursor, count: int) -> None:
        counts.append(count)
        plain(self, count)

    monkeypatch.setattr(reader._Cursor, "skip_strings", counted)
    return counts


def _entry(cache: Path) -> list[list[object]]:
    (entry,) = json.loads(extents_path(cache).read_text())["files"].values()
    extents: list[list[object]] = entry["extents"]
    return extents


def test_a_second_read_jumps_over_the_vocabulary_and_gives_the_same_header(
    vocab_model: Path, tmp_path: Path, walked: list[int]
) -> None:
    cache = tmp_path / "cache"
    whole = read_file_header(vocab_model)
    walked.clear()
    first = read_remembered(vocab_model, cache)
    assert walked == [70000, 69000]
    assert [(e.count, e.end - e.start > 8 * e.count) for e in first.extents] == [(70000, True), (69000, True)]
    assert [e[:3] for e in _entry(cache)] == [[e.start, e.count, e.end] for e in first.extents]
    walked.clear()
    second = read_remembered(vocab_model, cache)
    assert walked == []
    assert second == whole == first  # the metadata and the tensor table
    assert (second.header_bytes, second.extents) == (whole.header_bytes, first.extents)
    # and a plan's model is read so by default (its own cache: the session's LLAMAFIT_CACHE)
    load_model(vocab_model)
    walked.clear()
    assert load_model(vocab_model).tensors == load_model(vocab_model, read_file_header).tensors
    assert walked == [70000, 69000]  # only the plain read's


def test_an_extent_whose_end_no_longer_holds_the_same_bytes_is_walked_again(
    vocab_model: Path, tmp_path: Path, walked: list[int]
) -> None:
    cache = tmp_path / "cache"
    read_remembered(vocab_model, cache)
    st = os.stat(vocab_model)
    end = _entry(cache)[0][2]
    assert isinstance(end, int)
    with open(vocab_model, "r+b") as f:  # the last token's last byte changed in place, the time put back
        f.seek(end - 1)
        last = f.read(1)
        f.seek(end - 1)
        f.write(b"z" if last != b"z" else b"y")
    os.utime(vocab_model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(vocab_model).st_mtime_ns == st.st_mtime_ns
    walked.clear()
    h = read_remembered(vocab_model, cache)
    assert walked == [70000]  # the tokens walked, the merges (unchanged) jumped over
    assert h == read_file_header(vocab_model)


def test_an_extent_that_lands_wrong_is_dropped_and_the_header_read_whole(
    vocab_model: Path, tmp_path: Path, walked: list[int]
) -> None:
    """A remembered end that points into the last strings of the array with the very bytes found there: the jump is
    taken, the header does not parse from there, and the read starts again without hints."""
    cache = tmp_path / "cache"
    read_remembered(vocab_model, cache)
    doc = json.loads(extents_path(cache).read_text())
    (entry,) = doc["files"].values()
    start, count, end, _ = entry["extents"][0]
    wrong = end - 1000
    with open(vocab_model, "rb") as f:
        f.seek(wrong - TAIL)
        entry["extents"][0] = [start, count, wrong, f.read(TAIL).hex()]
    extents_path(cache).write_text(json.dumps(doc))
    walked.clear()
    h = read_remembered(vocab_model, cache)
    assert walked == [70000, 69000]  # the tokens jumped over (wrongly), then the whole header read again
    assert h == read_file_header(vocab_model)
    assert _entry(cache)[0][2] == end  # learned again


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps({"schema": "other/1", "files": {}}),
        json.dumps({"schema": SCHEMA, "files": []}),
        "ENTRY:" + json.dumps([[-1, 70000, 100, "00" * TAIL]]),
        "ENTRY:" + json.dumps([[10, 70000, 1 << 40, "00" * TAIL]]),
        "ENTRY:" + json.dumps([[10, 70000.0, 100, "00" * TAIL]]),
        "ENTRY:" + json.dumps([[10, 70000, 100, "zz" * TAIL]]),
        "ENTRY:" + json.dumps([[10, 70000, 100, "00"]]),
        "ENTRY:" + json.dumps([[10, 70000, 100]]),
        "ENTRY:" + json.dumps([[10, 70000, 100, "00" * TAIL]] * 17),
        "ENTRY:" + json.dumps("extents"),
    ],
)
def test_a_cache_that_is_not_ours_reads_as_nothing(vocab_model: Path, tmp_path: Path, text: str) -> None:
    cache = tmp_path / "cache"
    path = extents_path(cache)
    path.parent.mkdir(parents=True)
    if text.startswith("ENTRY:"):  # an entry filed under this very file
        st = os.stat(vocab_model)
        key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        text = json.dumps({"schema": SCHEMA, "files": {key: {"at": 1, "extents": json.loads(text[6:])}}})
    path.write_text(text)
    assert read_remembered(vocab_model, cache) == read_file_header(vocab_model)
    assert [e[1] for e in _entry(cache)] == [70000, 69000]  # replaced by what the read found


def test_a_cache_that_cannot_be_written_leaves_the_read_as_it_was(vocab_model: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache's folder would be")
    assert read_remembered(vocab_model, blocked) == read_file_header(vocab_model)


def test_the_cache_keeps_the_files_learned_last(vocab_model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old = {f"0:{i}:1:1": {"at": i + 1, "extents": [[10, 70000, 600000, "00" * TAIL]]} for i in range(KEPT + 5)}
    extents_path(cache).parent.mkdir(parents=True)
    extents_path(cache).write_text(json.dumps({"schema": SCHEMA, "files": old}))
    read_remembered(vocab_model, cache)
    files = json.loads(extents_path(cache).read_text())["files"]
    assert len(files) == KEPT
    assert "0:5:1:1" not in files and f"0:{KEPT + 4}:1:1" in files  # the oldest went
    st = os.stat(vocab_model)
    assert f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}" in files


def test_a_cached_hub_header_is_read_so_too(vocab_model: Path, tmp_path: Path, walked: list[int]) -> None:
    """A Hub file's header read over the network walks its vocabulary; read again from llamafit's cache of headers
    (``HubClient.header``), it jumps over it: the same header."""
    from llamafit.hub.remote import HubClient
    from tests.hubserver import FakeHub

    hub = FakeHub().start()
    try:
        hub.add("acme/vocab", {"m.gguf": vocab_model})
        client = HubClient(hub.url, cache_dir=tmp_path / "cache")
        listing = client.listing("acme/vocab")
        (f,) = listing.files
        walked.clear()
        first = client.header("acme/vocab", listing.commit, f)
        assert walked == [70000, 69000]
        second = client.header("acme/vocab", listing.commit, f)
        assert walked == [70000, 69000, 70000, 69000]  # from the cached prefix, learning where the arrays end
        third = client.header("acme/vocab", listing.commit, f)
        assert walked == [70000, 69000, 70000, 69000]  # jumped over
        whole = read_file_header(vocab_model)
        assert first == second == third
        assert (third.kv, third.tensors, third.header_bytes) == (whole.kv, whole.tensors, whole.header_bytes)
    finally:
        hub.stop()

"""How much of a GGUF header a read over the network asks for next.

A read from the Hub pays per request and per byte, and the header's size is not written anywhere: it ends
where the tensor table ends. So each refill asks for what the rest of the header likely needs (the counts
read so far say how many strings, entries and keys are left; the strings read so far, how long one is), and
never for more than 1.10 times the least it can still be: a request may fall short (the next one asks for the
rest), but it cannot run far past the header's end whatever the vocabulary looks like (a tokenizer whose
first tokens are long control tokens, as Mistral's Tekken has, or with fewer merges than tokens, made the
likely size alone read 1.2 to 2.6 times the header).
"""

from __future__ import annotations

from typing import Any, Protocol

# Each request asks for at least AHEAD_MIN and at most AHEAD_MAX bytes (a hostile count cannot make one
# request larger than the largest real header).
AHEAD_MIN = 16 << 10
AHEAD_MAX = 16 << 20
OVER_READ = 1.10  # a request ends within this much of the least the header can still be
# Lower bounds of one metadata entry and one tensor-table entry: a short key with a scalar value; a
# 16-byte name ("blk.0.attn_q.weight" is 19), two dimensions, type and offset (gguf.cpp:640-700).
KV_ENTRY_MIN = 8 + 16 + 4 + 4
TENSOR_ENTRY_MIN = 8 + 16 + 4 + 2 * 8 + 4 + 8
# a tensor-table entry as real ones are, before any is read: "blk.12.ffn_gate_exps.weight" with three
# dimensions is 79 bytes
TENSOR_ENTRY_LIKELY = 96
# A token is its length and at least one byte (tokens are distinct, so one at most is empty); a merge is two
# non-empty pieces and the space between, as the converters write them and llama-vocab.cpp:2050 splits them.
TOKEN_MIN = 8 + 1
MERGE_MIN = 8 + 3
BYTE_SYMBOLS = 256  # a byte-level BPE vocabulary's first tokens, which no merge makes


class Reading(Protocol):
    """What the cursor knows of the header so far: where it is, and the string array it is in."""

    pos: int
    arr_key: str  # the string array being read, while ``arr_left`` of its ``arr_n`` strings are left
    arr_start: int
    arr_n: int
    arr_left: int
    arrays: dict[str, tuple[int, int]]  # each string array read so far: its count and its bytes


class Ahead:
    """What the rest of a header needs, from what has been parsed so far: the rest of the string array being
    read, the tokenizer arrays converters write beside the vocabulary (one i32 token type per token; one f32
    score per token for SentencePiece, ``tokenizer.ggml.model`` "llama"; for byte-level BPE, "gpt2", the
    merges llama-vocab.cpp refuses to load without), the keys not read yet and the tensor table (its count is
    in the file's first bytes)."""

    def __init__(self, cur: Reading, n_kv: int, n_tensors: int, kv: dict[str, Any]) -> None:
        self.cur, self.n_kv, self.n_tensors, self.kv = cur, n_kv, n_tensors, kv
        self.kv_done = 0
        self.table_start = 0
        self.tensors_done = 0

    def request(self, start: int, need: int) -> int:
        """Bytes to ask for from ``start``, where ``need`` more are needed now: what the rest likely needs and
        one ``AHEAD_MIN`` more (a request short by a few table entries costs a request; past the end, a few
        KiB), cut to end within ``OVER_READ`` of the least the header can still end at."""
        likely = max(need, min(self.likely() - (start - self.cur.pos) + AHEAD_MIN, AHEAD_MAX), AHEAD_MIN)
        cap = int(OVER_READ * (self.cur.pos + self.least())) - start
        return max(need, min(likely, cap))

    def likely(self) -> int:
        """What the rest of the header likely needs, from ``pos``: strings as long as those read so far, one
        merge for each token past the byte symbols, table entries as long as those read (or typical ones)."""
        cur = self.cur
        rest = cur.arr_left * self._mean(cur.arr_key) if cur.arr_left else 0
        n_vocab = self._n_vocab()
        merges = max(0, n_vocab - BYTE_SYMBOLS) * self._mean("tokenizer.ggml.merges")
        rest += self._pending(n_vocab, merges)
        if self.tensors_done:
            entry = max(TENSOR_ENTRY_MIN, (cur.pos - self.table_start) // self.tensors_done)
        else:
            entry = TENSOR_ENTRY_LIKELY
        return rest + self._keys_left() + (self.n_tensors - self.tensors_done) * entry

    def least(self) -> int:
        """What the rest of the header needs at least, from ``pos``: the strings left at their shortest, the
        arrays converters write beside the vocabulary (merges counted once their count is read), the keys
        and table entries left at their shortest."""
        cur = self.cur
        shortest = {"tokenizer.ggml.tokens": TOKEN_MIN, "tokenizer.ggml.merges": MERGE_MIN}.get(cur.arr_key, 8)
        rest = cur.arr_left * shortest if cur.arr_left else 0
        rest += self._pending(self._n_vocab(), 0)
        return rest + self._keys_left() + (self.n_tensors - self.tensors_done) * TENSOR_ENTRY_MIN

    def _pending(self, n_vocab: int, merges: int) -> int:
        """The tokenizer arrays not reached yet (``merges``: the bytes assumed for the merges)."""
        if self.tensors_done or not n_vocab:
            return 0
        pending = {"tokenizer.ggml.token_type": 4 * n_vocab}
        model = self.kv.get("tokenizer.ggml.model")
        if model == "llama":
            pending["tokenizer.ggml.scores"] = 4 * n_vocab
        elif model == "gpt2" and merges:
            pending["tokenizer.ggml.merges"] = merges
        cur = self.cur
        return sum(
            8 + len(key) + 4 + 4 + 8 + nbytes
            for key, nbytes in pending.items()
            if key not in self.kv and not (key == cur.arr_key and cur.arr_left)
        )

    def _keys_left(self) -> int:
        return max(0, self.n_kv - self.kv_done - 1) * KV_ENTRY_MIN

    def _mean(self, key: str) -> int:
        """Bytes per element (length prefix included) of a string array read or being read."""
        cur = self.cur
        if key == cur.arr_key and cur.arr_left:
            done = cur.arr_n - cur.arr_left
            if done >= 256:
                return max(8, (cur.pos - cur.arr_start) // done)
        elif key in cur.arrays:
            n, nbytes = cur.arrays[key]
            return max(8, nbytes // max(n, 1))
        if key == "tokenizer.ggml.merges" and self._n_vocab():
            # a merge joins two pieces into one token: about a token's length and the space
            return self._mean("tokenizer.ggml.tokens") + 1
        return 8

    def _n_vocab(self) -> int:
        """The vocabulary's size, whether it is being read now or was read (0: not reached)."""
        cur = self.cur
        if cur.arr_key == "tokenizer.ggml.tokens" and cur.arr_left:
            return cur.arr_n
        return cur.arrays.get("tokenizer.ggml.tokens", (0, 0))[0]

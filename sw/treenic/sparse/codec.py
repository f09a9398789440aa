"""Sparse message codec (golden): (index, value) pairs or a bitmap over the chunk plus the
values, whichever is smaller -- SparCML's sparse/dense switch with Zen's bitmap layout.

Format (32-bit little-endian words; indices are chunk-relative, strictly ascending)::

    word 0        header: bits 0..30 = count L, bit 31 = format (0 pairs, 1 bitmap)
    pairs:        L x (index, value bits)                         -> 1 + 2L words
    bitmap:       ceil(C/32) bitmap words, then L value words     -> 1 + ceil(C/32) + L words

Bitmap bit t (word t >> 5, bit t & 31, LSB first; ``zen.pack_bits``) marks that index t is
present; the values follow in ascending index order. The bit marks presence, not a non-zero
value, so every pair stream round-trips exactly (a selected value is never zero anyway).
Decision rule (:func:`message_format`): bitmap iff ``ceil(C/32) < L``, i.e. iff it is
strictly smaller; equal sizes send pairs. The RTL encoder/decoder
(``treenic.hdl.sparse.codec``) implement the same format and rule.
"""
from __future__ import annotations

import numpy as np

from .base import SparseError, receive_message
from .zen import pack_bits, unpack_bits

FORMAT_PAIRS, FORMAT_BITMAP = 0, 1
MAX_CHUNK = 1 << 24
FORMAT_BIT = 1 << 31


def _check_chunk(chunk) -> int:
    if not isinstance(chunk, (int, np.integer)) or not 1 <= chunk <= MAX_CHUNK:
        raise SparseError(f"chunk must be an integer in 1..{MAX_CHUNK}, got {chunk!r}")
    return int(chunk)


def bitmap_words(chunk: int) -> int:
    return -(-_check_chunk(chunk) // 32)


def message_format(count: int, chunk: int) -> int:
    """FORMAT_BITMAP iff the bitmap message (ceil(C/32) + L words) is strictly smaller than
    the pairs message (2L words)."""
    return FORMAT_BITMAP if bitmap_words(chunk) < count else FORMAT_PAIRS


def message_words(count: int, chunk: int) -> int:
    body = bitmap_words(chunk) + count if message_format(count, chunk) else 2 * count
    return 1 + body


def encode_message(indices, values, chunk: int) -> np.ndarray:
    """uint32 words of the message carrying ``values[n]`` at chunk index ``indices[n]``."""
    chunk = _check_chunk(chunk)
    idx = np.asarray(indices, np.int64)
    val = np.asarray(values, np.float32).view(np.uint32)
    if idx.shape != val.shape or idx.ndim != 1:
        raise SparseError("indices and values must be 1-D arrays of one length")
    if idx.size and (idx[0] < 0 or idx[-1] >= chunk or np.any(np.diff(idx) <= 0)):
        raise SparseError(f"indices must be strictly ascending in [0, {chunk})")
    fmt = message_format(idx.size, chunk)
    header = np.array([idx.size | (fmt << 31)], np.uint32)
    if fmt == FORMAT_BITMAP:
        bits = np.zeros(chunk, bool)
        bits[idx] = True
        return np.concatenate([header, pack_bits(bits), val])
    body = np.stack([idx.astype(np.uint32), val], axis=1).reshape(-1)
    return np.concatenate([header, body])


def decode_message(words, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices int64, values float32) of a message; raises SparseError on a malformed one."""
    chunk = _check_chunk(chunk)
    w = np.asarray(words, np.uint32)
    if w.size < 1:
        raise SparseError("empty message (no header)")
    count, fmt = int(w[0]) & (FORMAT_BIT - 1), int(w[0]) >> 31
    if count > chunk or fmt != message_format(count, chunk) or w.size != message_words(count, chunk):
        raise SparseError(f"malformed message: header {int(w[0]):#010x}, {w.size} words, chunk {chunk}")
    if fmt == FORMAT_BITMAP:
        nw = bitmap_words(chunk)
        idx = np.flatnonzero(unpack_bits(w[1:1 + nw], chunk))
        if idx.size != count:
            raise SparseError(f"bitmap has {idx.size} bits set, header says {count}")
        return idx.astype(np.int64), w[1 + nw:].view(np.float32)
    pairs = w[1:].reshape(-1, 2)
    return pairs[:, 0].astype(np.int64), pairs[:, 1].copy().view(np.float32)


def receive_words(dense, words, *, lo: int, n: int, k: int, intact: bool = True):
    """Golden of the sparse engine's codec receive (a RECV_BM row over the flow
    ``[lo, lo + n)``): the message's words decoded (:func:`decode_message`, flow-relative
    indices) and received by :func:`~.base.receive_message`; a message that does not
    decode contributes nothing. Returns (the new buffer, whether it was taken)."""
    try:
        idx, val = decode_message(words, n)
    except SparseError:
        return np.array(dense, dtype=np.float32, copy=True), False
    return receive_message(dense, idx + lo, val, lo=lo, n=n, k=k, intact=intact)

"""GGUF headers walked with bounds checks, using the `gguf` package's own tables (quantization
types and block sizes, supported versions), rather than through `GGUFReader`, which trusts the
lengths in the file."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from einsora.common.weights.info import WeightsInfo, WeightsRefused
from einsora.common.weights.sniff import looks_like, printable


class _Bad(Exception):
    """A GGUF header fails a check; the text completes "<file> ...". Internal to this module."""


def _truncated(what: str) -> _Bad:
    return _Bad(f"is truncated: the file ends inside {what} (an incomplete download?)")


class _Cursor:
    """Bounds-checked reads through a GGUF header, in the file's byte order."""

    def __init__(self, buf: mmap.mmap, order: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.order = order

    def skip(self, n: int, what: str) -> int:
        """Step over `n` bytes of `what`; returns where they start."""
        start = self.pos
        if n > self.size - start:
            raise _truncated(what)
        self.pos = start + n
        return start

    def number(self, fmt: str, size: int, what: str) -> Any:
        return struct.unpack_from(self.order + fmt, self.buf, self.skip(size, what))[0]

    def u32(self, what: str) -> int:
        return int(self.number("I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.number("Q", 8, what))

    def text(self, what: str) -> str:
        length = self.u64(what)
        start = self.skip(length, what)
        try:
            return self.buf[start : start + length].decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad(f"is corrupt: {what} at byte {start:,} is not UTF-8") from None

    def expect_items(self, count: int, min_size: int, what: str) -> None:
        """Refuse a count the rest of the file cannot hold, before looping over it."""
        if count * min_size > self.size - self.pos:
            raise _Bad(
                f"is truncated or corrupt: {what} claims {count:,} items, more than the "
                f"rest of the file holds"
            )


_MAX_ARRAY_NESTING = 4
_GGML_MAX_DIMS = 4  # llama.cpp refuses tensors with more dimensions


def check_gguf(path: Path, shown: str) -> WeightsInfo:
    with path.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"GGUF":
            what = looks_like(head)
            if what is None:
                if not head:
                    raise WeightsRefused(f"{shown} is empty")
                raise WeightsRefused(
                    f"{shown} is not a GGUF file: it does not start with GGUF's magic bytes"
                )
            raise WeightsRefused(f"{shown} is not a GGUF file: it starts with {what}")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _walk_gguf(buf, path, shown)
            except _Bad as bad:
                raise WeightsRefused(f"{shown} {bad}") from None


def _walk_gguf(buf: mmap.mmap, path: Path, shown: str) -> WeightsInfo:
    from gguf.constants import (
        GGML_QUANT_SIZES,
        GGUF_DEFAULT_ALIGNMENT,
        GGMLQuantizationType,
        GGUFValueType,
    )
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

    cursor = _Cursor(buf, "<")
    cursor.skip(4, "its magic")
    version = cursor.u32("its version")
    if version & 0xFFFF == 0 and version != 0:
        # What a big-endian file's version looks like when read little-endian.
        raise _Bad(
            "is a big-endian GGUF, which llama.cpp cannot load on little-endian machines; "
            "convert the model again without --bigendian"
        )
    if version not in READER_SUPPORTED_VERSIONS:
        supported = " and ".join(str(v) for v in READER_SUPPORTED_VERSIONS)
        raise _Bad(
            f"has GGUF version {version}, and only versions {supported} are supported; convert "
            f"the model again with a current llama.cpp"
        )
    tensor_count = cursor.u64("its tensor count")
    kv_count = cursor.u64("its metadata count")
    cursor.expect_items(kv_count, 13, "its metadata count")  # key length, empty key, type, 1 byte

    scalars: dict[str, tuple[int, Any]] = {}
    keys: set[str] = set()
    for _ in range(kv_count):
        key = cursor.text("a metadata key")
        if key in keys:
            raise _Bad(f"is corrupt: metadata key {printable(key)!r} appears twice")
        keys.add(key)
        vtype = cursor.u32(f"the type of metadata key {printable(key)!r}")
        value = _gguf_value(cursor, vtype, printable(key), 0)
        if value is not None:
            scalars[key] = (vtype, value)

    alignment = GGUF_DEFAULT_ALIGNMENT
    if "general.alignment" in scalars:
        atype, alignment = scalars["general.alignment"]
        if atype != GGUFValueType.UINT32 or alignment <= 0 or alignment & (alignment - 1):
            raise _Bad("is corrupt: general.alignment is not a power of two (a 32-bit integer)")

    cursor.expect_items(tensor_count, 24, "its tensor count")  # name length, dims, type, offset
    tensors: list[tuple[str, int, int]] = []  # name, offset, bytes
    names: set[str] = set()
    for _ in range(tensor_count):
        name = printable(cursor.text("a tensor name"))
        if name in names:
            raise _Bad(f"is corrupt: tensor {name!r} appears twice")
        names.add(name)
        n_dims = cursor.u32(f"the dimensions of tensor {name!r}")
        if n_dims > _GGML_MAX_DIMS:
            raise _Bad(f"is corrupt: tensor {name!r} has {n_dims} dimensions (at most 4)")
        dims = [cursor.u64(f"the dimensions of tensor {name!r}") for _ in range(n_dims)]
        raw_type = cursor.u32(f"the type of tensor {name!r}")
        offset = cursor.u64(f"the offset of tensor {name!r}")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            raise _Bad(
                f"has tensor {name!r} of unknown type {raw_type} (made by a newer llama.cpp, "
                f"or corrupt)"
            ) from None
        elements = 1
        for dim in dims:
            elements *= dim
        if dims and dims[0] % block:
            raise _Bad(
                f"is corrupt: the first dimension of tensor {name!r}, {dims[0]}, is not a multiple "
                f"of its type's block of {block}"
            )
        if offset % alignment:
            raise _Bad(
                f"is corrupt: the data of tensor {name!r} is not aligned to {alignment} bytes"
            )
        tensors.append((name, offset, elements // block * type_size))

    if not tensors:
        raise _Bad("holds no tensors (a vocabulary-only GGUF?): name a model's GGUF file")
    data_start = -(-cursor.pos // alignment) * alignment
    for name, offset, nbytes in tensors:
        end = data_start + offset + nbytes
        if end > cursor.size:
            raise _Bad(
                f"is truncated: the data of tensor {name!r} ends at byte {end:,} but the file has "
                f"{cursor.size:,} bytes (an incomplete download?)"
            )

    def text_of(key: str) -> str | None:
        vtype, value = scalars.get(key, (None, None))
        return value if vtype == GGUFValueType.STRING else None

    architecture = text_of("general.architecture")
    context = scalars.get(f"{architecture}.context_length") if architecture else None
    return WeightsInfo(
        format="gguf",
        path=path,
        size_bytes=cursor.size,
        tensors=len(tensors),
        architecture=architecture,
        name=text_of("general.name"),
        has_tokenizer="tokenizer.ggml.model" in keys,
        context_length=context[1] if context and type(context[1]) is int else None,
    )


# struct formats and sizes of GGUF's scalar value types, by their GGUFValueType number.
_GGUF_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1),
    1: ("b", 1),
    2: ("H", 2),
    3: ("h", 2),
    4: ("I", 4),
    5: ("i", 4),
    6: ("f", 4),
    7: ("?", 1),
    10: ("Q", 8),
    11: ("q", 8),
    12: ("d", 8),
}
_GGUF_STRING = 8
_GGUF_ARRAY = 9


def _gguf_value(cursor: _Cursor, vtype: int, key: str, depth: int) -> Any:
    """Step over one metadata value; returns it when it is a scalar or a string."""
    what = f"the value of metadata key {key!r}"
    if vtype == _GGUF_STRING:
        return cursor.text(what)
    if vtype in _GGUF_SCALARS:
        fmt, size = _GGUF_SCALARS[vtype]
        return cursor.number(fmt, size, what)
    if vtype != _GGUF_ARRAY:
        raise _Bad(f"is corrupt: metadata key {key!r} has unknown value type {vtype}")
    if depth >= _MAX_ARRAY_NESTING:
        raise _Bad(f"is corrupt: metadata key {key!r} nests arrays more than 4 deep")
    item_type = cursor.u32(what)
    count = cursor.u64(what)
    if item_type in _GGUF_SCALARS:
        cursor.skip(count * _GGUF_SCALARS[item_type][1], what)
    elif item_type == _GGUF_STRING:
        cursor.expect_items(count, 8, what)
        # The hot loop: a tokenizer holds hundreds of thousands of strings.
        buf, pos, size = cursor.buf, cursor.pos, cursor.size
        unpack = struct.Struct(cursor.order + "Q").unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise _truncated(what)
            pos += 8 + unpack(buf, pos)[0]
        if pos > size:
            raise _truncated(what)
        cursor.pos = pos
    elif item_type == _GGUF_ARRAY:
        cursor.expect_items(count, 12, what)
        for _ in range(count):
            _gguf_value(cursor, _GGUF_ARRAY, key, depth + 1)
    else:
        raise _Bad(f"is corrupt: metadata key {key!r} holds items of unknown type {item_type}")
    return None

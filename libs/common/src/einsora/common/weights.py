"""Safe weights: a model file is checked before any runtime loads it (issue 12).

Only GGUF and safetensors are accepted: both hold tensors and metadata and no code, while
PyTorch's `.bin`/`.pt`, NumPy's `.npy` and joblib files can hold a Python pickle, which runs
code when it is loaded. A file is judged by its content as well as its name, so a pickle
renamed `model.gguf` is refused, and the refusal says what the file looks like.

GGUF headers are walked here with bounds checks, using the `gguf` package's own tables
(quantization types and block sizes, supported versions), rather than through `GGUFReader`: the
reader trusts the lengths in the file (an array claiming 2**63 items past the end of a file
makes it loop without end) and builds one numpy view per tokenizer entry (25 s for a real
262k-token vocabulary on two cores). Safetensors files go through the `safetensors` package's
own validation; the checks before it only give its refusals words a person can act on.

Tensor data is never read, only the headers, so a tens-of-GB file is checked in well under a
second. Everything here is blocking file IO: async callers run it in a thread.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeGuard

from einsora.common.errors import EinsoraError

ACCEPTED_SUFFIXES = (".gguf", ".safetensors")
REFUSED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")
"""Formats that can hold a pickle: refused by name, whatever their content."""

SAFETENSORS_MAX_HEADER = 100_000_000
"""The safetensors format's own limit on its JSON header."""

MAX_DIRECTORY_ENTRIES = 10_000
"""A model directory holds tens of files; past this it is not one (say, a home directory)."""

_PICKLE = (
    "a Python pickle's bytes (pickle weights can run code when loaded; "
    "convert it to GGUF or safetensors)"
)
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_USER_COLON = re.compile(r"[^:]*:(?![0-9]*$).*")  # "user:secret", as opposed to "host:8080"
# A suffix that names a file type (".onnx", ".json"), as opposed to the dot in a model's
# name ("Qwen2.5-0.5B", "Mistral-7B-v0.3", "Phi-3.5-mini"), which marks a directory.
_FILE_SUFFIX = re.compile(r"\.[a-z][a-z0-9_]{0,9}")


class WeightsRefused(EinsoraError):
    """A model file or directory is not safe or not valid to load; the message says why."""

    code = "weights_refused"


@dataclass(frozen=True)
class WeightsInfo:
    """What a checked model holds, read from its headers.

    For a directory of safetensors, `size_bytes` and `tensors` add up its `.safetensors`
    files, `architecture` is config.json's `model_type` and `context_length` its
    `max_position_embeddings`.
    """

    format: Literal["gguf", "safetensors"]
    path: Path
    size_bytes: int
    tensors: int
    architecture: str | None
    name: str | None
    has_tokenizer: bool
    context_length: int | None


def is_uri(model: str) -> bool:
    """Whether `model` is a URI (scheme://...) rather than a local path."""
    return _URI.match(model) is not None


def redact(uri_or_path: str) -> str:
    """The model's name as safe to log or return: a URI loses its userinfo (user:password@),
    its query string and fragment (signed URLs carry secrets there); a plain path is
    unchanged."""
    if not is_uri(uri_or_path):
        return uri_or_path
    scheme, rest = uri_or_path.split("://", 1)
    # Userinfo ends at the last "@" before the path. Looking up to the first "/" rather than
    # the first "?" or "#" also strips a password holding an unescaped "?" or "#".
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = authority.rpartition("@")[2]
    elif _USER_COLON.fullmatch(authority) and "@" in rest:
        # "user:pa/ss@host": not a host and port, so a password with an unescaped "/".
        # Cutting at the last "@" may drop part of the path, never keep part of a password.
        authority, slash, path = rest.rpartition("@")[2], "", ""
    kept = authority + slash + path
    for mark in "?#":
        kept = kept.partition(mark)[0]
    return f"{scheme}://{kept}"


def check_name(model: str) -> None:
    """Refuse by name alone (no file access): a refused suffix, or neither accepted suffix and
    not a directory-like path (vLLM/MLX take a directory of safetensors). Used by the api at
    launch for paths/URIs that are not on its filesystem. Raises WeightsRefused."""
    shown = redact(model)
    if not model.strip():
        raise WeightsRefused(
            "no model was named: give a .gguf file, a .safetensors file or a directory of "
            "safetensors"
        )
    parts = re.split(r"[/\\]", shown.split("://", 1)[1] if is_uri(model) else model)
    if is_uri(model):
        parts = parts[1:]  # the host's name says nothing about the file
    if not parts or not parts[-1]:
        return  # a directory
    suffix = _suffix(parts[-1])
    if suffix in REFUSED_SUFFIXES:
        _refuse_pickle_suffix(shown, suffix)
    if suffix in ACCEPTED_SUFFIXES or not _FILE_SUFFIX.fullmatch(suffix):
        return
    _refuse_other_suffix(shown, suffix)


def check_file(path: Path) -> WeightsInfo:
    """Validate a local file or directory before a runtime loads it; raises WeightsRefused.

    - `.gguf`: GGUF's magic, a supported version; metadata and tensor infos parse within the
      file; every tensor's data lies within the file (a truncated file is refused).
    - `.safetensors`: the header length is sane, the header is JSON, and the safetensors
      package accepts it (known dtypes; offsets in order, within the file, matching shape ×
      dtype size).
    - a directory: at least one `.safetensors` file, every one checked; a pickle-capable file
      anywhere in it is a refusal; config.json read for model_type.
    - any other suffix, a refused one, or content that does not match the suffix (the
      message says what it looks like): refused.
    """
    shown = redact(str(path))
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            return _check_directory(path, shown)
        if not stat.S_ISREG(info.st_mode):
            raise WeightsRefused(f"{shown} is not a regular file or a directory")
        suffix = _suffix(path.name)
        if suffix in REFUSED_SUFFIXES:
            _refuse_pickle_suffix(shown, suffix, _head_hint(path))
        if suffix == ".gguf":
            return _check_gguf(path, shown)
        if suffix == ".safetensors":
            return _check_safetensors(path, info.st_size, shown)
        _refuse_other_suffix(shown, suffix, _head_hint(path))
    except OSError as exc:
        # Name the path that failed: in a directory it may be one of its files.
        failed = redact(str(exc.filename)) if exc.filename else shown
        if isinstance(exc, FileNotFoundError):
            raise WeightsRefused(f"{failed} does not exist") from None
        if isinstance(exc, PermissionError):
            raise WeightsRefused(f"{failed} cannot be read: permission denied") from None
        raise WeightsRefused(f"{failed} cannot be read: {exc.strerror or exc}") from None


# Names and content sniffing.


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def _refuse_pickle_suffix(shown: str, suffix: str, hint: str = "") -> NoReturn:
    raise WeightsRefused(
        f"{shown} is refused: {suffix} files can hold a Python pickle, which can run code when "
        f"loaded; convert it to GGUF or safetensors{hint}"
    )


def _refuse_other_suffix(shown: str, suffix: str, hint: str = "") -> NoReturn:
    what = f"ends in {suffix}" if suffix else "has no suffix"
    raise WeightsRefused(
        f"{shown} {what}: only .gguf files, .safetensors files and directories of "
        f".safetensors files are accepted{hint}"
    )


def _read_head(path: Path, n: int = 64) -> bytes:
    with path.open("rb") as f:
        return f.read(n)


def _head_hint(path: Path) -> str:
    """For a file refused by its name: a hint when its content is in fact an accepted format."""
    try:
        head = _read_head(path)
    except OSError:
        return ""
    if head[:4] == b"GGUF":
        return " (its content starts like a GGUF file: if it is one, name it .gguf)"
    if _starts_like_safetensors(head):
        return " (its content starts like a safetensors file: if it is one, name it .safetensors)"
    return ""


def _starts_like_safetensors(head: bytes) -> bool:
    if len(head) < 9:
        return False
    length = int.from_bytes(head[:8], "little")
    return 2 <= length <= SAFETENSORS_MAX_HEADER and head[8:9] == b"{"


def _looks_like(head: bytes) -> str | None:
    """What a file that is not the format its name says looks like, from its first bytes."""
    if head[:4] == b"GGUF":
        return "GGUF's magic bytes (it is a GGUF file: name it .gguf)"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return _PICKLE
    if head[:4] == b"PK\x03\x04":
        return (
            "a zip archive's bytes, which is PyTorch's format (it holds a pickle, which can run "
            "code when loaded; convert it to GGUF or safetensors)"
        )
    if head[:6] == b"\x93NUMPY":
        return "a NumPy array's bytes (those can hold a pickle; convert it to safetensors)"
    if head[:8] == b"\x89HDF\r\n\x1a\n":
        return "an HDF5 file's bytes (Keras or TensorFlow weights; convert it to safetensors)"
    if head[:4] in (b"lmgg", b"fmgg", b"tjgg", b"algg"):
        return "a legacy GGML file's magic (from before GGUF; convert it to GGUF with llama.cpp)"
    if head.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer, not the weights (fetch them with `git lfs pull`)"
    if head[:2] == b"\x1f\x8b":
        return "a gzip archive's bytes (unpack it first)"
    if head.lstrip()[:14].lower().startswith((b"<!doctype html", b"<html")):
        return "an HTML page (the download probably failed; fetch the file again)"
    if _starts_like_safetensors(head):
        return "a safetensors header (it is a safetensors file: name it .safetensors)"
    return None


def _printable(text: str, limit: int = 80) -> str:
    """A name read from a file, fit for a message: no control characters, bounded length."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


# GGUF.


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


def _check_gguf(path: Path, shown: str) -> WeightsInfo:
    with path.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"GGUF":
            what = _looks_like(head)
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
            raise _Bad(f"is corrupt: metadata key {_printable(key)!r} appears twice")
        keys.add(key)
        vtype = cursor.u32(f"the type of metadata key {_printable(key)!r}")
        value = _gguf_value(cursor, vtype, _printable(key), 0)
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
        name = _printable(cursor.text("a tensor name"))
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


# Safetensors.


_SAFETENSORS_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
"""Bits per element of the dtypes the safetensors format defines (used to word refusals)."""


def _check_safetensors(path: Path, size: int, shown: str) -> WeightsInfo:
    return WeightsInfo(
        format="safetensors",
        path=path,
        size_bytes=size,
        tensors=_safetensors_tensors(path, size, shown),
        architecture=None,
        name=None,
        has_tokenizer=False,
        context_length=None,
    )


def _safetensors_tensors(path: Path, size: int, shown: str) -> int:
    """Check one safetensors file; returns how many tensors it holds."""
    with path.open("rb") as f:
        head = f.read(64)
        what = None if _starts_like_safetensors(head) else _looks_like(head)
        if what is not None:
            raise WeightsRefused(f"{shown} is not a safetensors file: it starts with {what}")
        if size < 8:
            raise WeightsRefused(
                f"{shown} is truncated: at {size} bytes it is shorter than the 8-byte length "
                f"a safetensors file starts with"
            )
        length = int.from_bytes(head[:8], "little")
        if length > SAFETENSORS_MAX_HEADER:
            raise WeightsRefused(
                f"{shown} is not a valid safetensors file: its header length says {length:,} "
                f"bytes, over the format's limit of 100 MB"
            )
        if length > size - 8:
            raise WeightsRefused(
                f"{shown} is truncated: its header length says {length:,} bytes but only "
                f"{size - 8:,} follow (an incomplete download?)"
            )
        f.seek(8)
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except UnicodeDecodeError:
        raise WeightsRefused(f"{shown} is corrupt: its header is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise WeightsRefused(
            f"{shown} is corrupt: its header is not valid JSON ({exc.msg} at byte {exc.pos:,})"
        ) from None
    if not isinstance(header, dict):
        raise WeightsRefused(f"{shown} is corrupt: its header is not a JSON object")

    from safetensors import SafetensorError, safe_open

    try:
        # mmap-backed: opening reads and validates the header only, never the tensor data.
        with safe_open(str(path), framework="numpy") as opened:
            count = len(list(opened.keys()))
    except SafetensorError as exc:
        reason = _safetensors_diagnosis(header, size - 8 - length)
        raise WeightsRefused(
            f"{shown} {reason or f'fails the safetensors check: {_printable(str(exc), 300)}'}"
        ) from None
    if count == 0:
        raise WeightsRefused(f"{shown} holds no tensors")
    return count


def _safetensors_diagnosis(header: dict[str, Any], data_size: int) -> str | None:
    """Words for why the safetensors package refused `header`; None when none of these fit."""
    spans: list[tuple[int, int, str]] = []
    for raw_name, entry in header.items():
        if raw_name == "__metadata__":
            continue
        name = _printable(raw_name)
        if not isinstance(entry, dict):
            return f"is corrupt: the header entry of tensor {name!r} is not a JSON object"
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _SAFETENSORS_BITS:
            shown_dtype = _printable(str(dtype), 20)
            return f"is corrupt: tensor {name!r} has dtype {shown_dtype!r}, not a safetensors dtype"
        if not _ints(shape) or not _ints(offsets) or len(offsets) != 2:
            return f"is corrupt: tensor {name!r} lacks a valid shape or data_offsets"
        begin, end = offsets
        if end > data_size:
            return (
                f"is truncated or corrupt: the data of tensor {name!r} ends at byte {end:,} of the "
                f"data but the file holds {data_size:,} bytes after its header"
            )
        elements = 1
        for dim in shape:
            elements *= dim
        bits = elements * _SAFETENSORS_BITS[dtype]
        if bits % 8 or bits // 8 != end - begin:
            return (
                f"is corrupt: tensor {name!r} of shape {shape} and dtype {dtype} needs "
                f"{bits / 8:,.0f} bytes but its data_offsets span {end - begin:,}"
            )
        spans.append((begin, end, name))
    covered = 0
    for begin, end, name in sorted(spans):
        if begin != covered:
            return (
                f"is corrupt: the data of tensor {name!r} does not start where the previous one's "
                f"ends (offsets out of order or overlapping)"
            )
        covered = end
    if covered != data_size:
        return (
            f"is truncated or corrupt: its tensors' data covers {covered:,} bytes but the file "
            f"holds {data_size:,} after its header"
        )
    return None


def _ints(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


# Directories of safetensors (vLLM, MLX).


def _check_directory(path: Path, shown: str) -> WeightsInfo:
    for relative in _files_under(path, shown):
        suffix = _suffix(relative.name)
        if suffix in REFUSED_SUFFIXES:
            raise WeightsRefused(
                f"{shown} holds {relative}: {suffix} files can hold a Python pickle, which can "
                f"run code when loaded, and a runtime may load it; remove it from the model "
                f"directory (or convert it to safetensors)"
            )
    entries = sorted(path.iterdir())
    shards = [p for p in entries if _suffix(p.name) == ".safetensors" and p.is_file()]
    if not shards:
        hint = ""
        if any(_suffix(p.name) == ".gguf" for p in entries):
            hint = " (it holds .gguf files: name one of them instead)"
        raise WeightsRefused(
            f"{shown} holds no .safetensors file; a model directory needs its weights as "
            f"safetensors{hint}"
        )
    size = tensors = 0
    for shard in shards:
        shard_size = shard.stat().st_size
        tensors += _safetensors_tensors(shard, shard_size, redact(str(shard)))
        size += shard_size
    present = {p.name for p in entries}
    for index in (p for p in entries if p.name.lower().endswith(".safetensors.index.json")):
        _check_index(index, present, shown)
    config = _read_json(path / "config.json", shown) if "config.json" in present else {}
    model_type = config.get("model_type")
    positions = config.get("max_position_embeddings")
    return WeightsInfo(
        format="safetensors",
        path=path,
        size_bytes=size,
        tensors=tensors,
        architecture=model_type if isinstance(model_type, str) else None,
        name=None,
        has_tokenizer=bool({"tokenizer.json", "tokenizer.model"} & present),
        context_length=positions if type(positions) is int else None,
    )


def _files_under(path: Path, shown: str) -> Iterator[Path]:
    """Every file below `path`, relative to it, without following links into other trees."""
    seen = 0
    for root, _dirs, files in os.walk(path, onerror=_raise):
        for name in files:
            seen += 1
            if seen > MAX_DIRECTORY_ENTRIES:
                raise WeightsRefused(
                    f"{shown} holds more than {MAX_DIRECTORY_ENTRIES:,} files, which no model "
                    f"directory does; name the directory with the model's files"
                )
            yield Path(root, name).relative_to(path)


def _raise(exc: OSError) -> NoReturn:
    raise exc


def _read_json(path: Path, shown: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WeightsRefused(f"{shown}: {path.name} is not valid JSON") from None
    if not isinstance(value, dict):
        raise WeightsRefused(f"{shown}: {path.name} is not a JSON object")
    return value


def _check_index(index: Path, present: set[str], shown: str) -> None:
    """A sharded model's index names its shards: each must be there."""
    weight_map = _read_json(index, shown).get("weight_map")
    if not isinstance(weight_map, dict):
        raise WeightsRefused(f"{shown}: {index.name} has no weight_map")
    for shard in sorted({str(v) for v in weight_map.values()}):
        if shard not in present:
            raise WeightsRefused(
                f"{shown}: {index.name} names {_printable(shard)}, which is missing "
                f"(an incomplete download?)"
            )

"""Safetensors headers, through the `safetensors` package's own validation; the checks before it
only give its refusals words a person can act on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeGuard

from einsora.common.weights.info import SAFETENSORS_MAX_HEADER, WeightsInfo, WeightsRefused
from einsora.common.weights.sniff import looks_like, printable, starts_like_safetensors

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


def check_safetensors(path: Path, size: int, shown: str) -> WeightsInfo:
    return WeightsInfo(
        format="safetensors",
        path=path,
        size_bytes=size,
        tensors=safetensors_tensors(path, size, shown),
        architecture=None,
        name=None,
        has_tokenizer=False,
        context_length=None,
    )


def safetensors_tensors(path: Path, size: int, shown: str) -> int:
    """Check one safetensors file; returns how many tensors it holds."""
    with path.open("rb") as f:
        head = f.read(64)
        what = None if starts_like_safetensors(head) else looks_like(head)
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
            f"{shown} {reason or f'fails the safetensors check: {printable(str(exc), 300)}'}"
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
        name = printable(raw_name)
        if not isinstance(entry, dict):
            return f"is corrupt: the header entry of tensor {name!r} is not a JSON object"
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _SAFETENSORS_BITS:
            shown_dtype = printable(str(dtype), 20)
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

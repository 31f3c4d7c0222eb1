"""Judging a file by its name and its first bytes: a pickle renamed `model.gguf` is refused,
and the refusal says what the file looks like."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from einsora.common.weights.info import SAFETENSORS_MAX_HEADER, WeightsRefused

_PICKLE = (
    "a Python pickle's bytes (pickle weights can run code when loaded; "
    "convert it to GGUF or safetensors)"
)


def suffix_of(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def refuse_pickle_suffix(shown: str, suffix: str, hint: str = "") -> NoReturn:
    raise WeightsRefused(
        f"{shown} is refused: {suffix} files can hold a Python pickle, which can run code when "
        f"loaded; convert it to GGUF or safetensors{hint}"
    )


def refuse_other_suffix(shown: str, suffix: str, hint: str = "") -> NoReturn:
    what = f"ends in {suffix}" if suffix else "has no suffix"
    raise WeightsRefused(
        f"{shown} {what}: only .gguf files, .safetensors files and directories of "
        f".safetensors files are accepted{hint}"
    )


def _read_head(path: Path, n: int = 64) -> bytes:
    with path.open("rb") as f:
        return f.read(n)


def head_hint(path: Path) -> str:
    """For a file refused by its name: a hint when its content is in fact an accepted format."""
    try:
        head = _read_head(path)
    except OSError:
        return ""
    if head[:4] == b"GGUF":
        return " (its content starts like a GGUF file: if it is one, name it .gguf)"
    if starts_like_safetensors(head):
        return " (its content starts like a safetensors file: if it is one, name it .safetensors)"
    return ""


def starts_like_safetensors(head: bytes) -> bool:
    if len(head) < 9:
        return False
    length = int.from_bytes(head[:8], "little")
    return 2 <= length <= SAFETENSORS_MAX_HEADER and head[8:9] == b"{"


def looks_like(head: bytes) -> str | None:
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
    if starts_like_safetensors(head):
        return "a safetensors header (it is a safetensors file: name it .safetensors)"
    return None


def printable(text: str, limit: int = 80) -> str:
    """A name read from a file, fit for a message: no control characters, bounded length."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"

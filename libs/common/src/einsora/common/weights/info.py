"""What a checked model holds, the refusal every check raises, and the formats accepted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from einsora.common.errors import EinsoraError

ACCEPTED_SUFFIXES = (".gguf", ".safetensors")
REFUSED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")
"""Formats that can hold a pickle: refused by name, whatever their content."""

SAFETENSORS_MAX_HEADER = 100_000_000
"""The safetensors format's own limit on its JSON header."""

MAX_DIRECTORY_ENTRIES = 10_000
"""A model directory holds tens of files; past this it is not one (say, a home directory)."""


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

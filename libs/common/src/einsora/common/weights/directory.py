"""Directories of safetensors (vLLM, MLX): every shard checked, no pickle-capable file anywhere
in them, the index consistent, config.json read for the architecture."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from einsora.common.weights.info import (
    MAX_DIRECTORY_ENTRIES,
    REFUSED_SUFFIXES,
    WeightsInfo,
    WeightsRefused,
)
from einsora.common.weights.names import redact
from einsora.common.weights.safetensors_header import safetensors_tensors
from einsora.common.weights.sniff import printable, suffix_of


def check_directory(path: Path, shown: str) -> WeightsInfo:
    for relative in _files_under(path, shown):
        suffix = suffix_of(relative.name)
        if suffix in REFUSED_SUFFIXES:
            raise WeightsRefused(
                f"{shown} holds {relative}: {suffix} files can hold a Python pickle, which can "
                f"run code when loaded, and a runtime may load it; remove it from the model "
                f"directory (or convert it to safetensors)"
            )
    entries = sorted(path.iterdir())
    shards = [p for p in entries if suffix_of(p.name) == ".safetensors" and p.is_file()]
    if not shards:
        hint = ""
        if any(suffix_of(p.name) == ".gguf" for p in entries):
            hint = " (it holds .gguf files: name one of them instead)"
        raise WeightsRefused(
            f"{shown} holds no .safetensors file; a model directory needs its weights as "
            f"safetensors{hint}"
        )
    size = tensors = 0
    for shard in shards:
        shard_size = shard.stat().st_size
        tensors += safetensors_tensors(shard, shard_size, redact(str(shard)))
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
                f"{shown}: {index.name} names {printable(shard)}, which is missing "
                f"(an incomplete download?)"
            )

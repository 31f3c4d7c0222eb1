"""The one entry for a local file or directory: which check it gets, and what a failed read says."""

from __future__ import annotations

import stat
from pathlib import Path

from einsora.common.weights.directory import check_directory
from einsora.common.weights.gguf_header import check_gguf
from einsora.common.weights.info import REFUSED_SUFFIXES, WeightsInfo, WeightsRefused
from einsora.common.weights.names import redact
from einsora.common.weights.safetensors_header import check_safetensors
from einsora.common.weights.sniff import (
    head_hint,
    refuse_other_suffix,
    refuse_pickle_suffix,
    suffix_of,
)


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
            return check_directory(path, shown)
        if not stat.S_ISREG(info.st_mode):
            raise WeightsRefused(f"{shown} is not a regular file or a directory")
        suffix = suffix_of(path.name)
        if suffix in REFUSED_SUFFIXES:
            refuse_pickle_suffix(shown, suffix, head_hint(path))
        if suffix == ".gguf":
            return check_gguf(path, shown)
        if suffix == ".safetensors":
            return check_safetensors(path, info.st_size, shown)
        refuse_other_suffix(shown, suffix, head_hint(path))
    except OSError as exc:
        # Name the path that failed: in a directory it may be one of its files.
        failed = redact(str(exc.filename)) if exc.filename else shown
        if isinstance(exc, FileNotFoundError):
            raise WeightsRefused(f"{failed} does not exist") from None
        if isinstance(exc, PermissionError):
            raise WeightsRefused(f"{failed} cannot be read: permission denied") from None
        raise WeightsRefused(f"{failed} cannot be read: {exc.strerror or exc}") from None

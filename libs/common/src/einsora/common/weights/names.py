"""Model names and URIs: which are URIs, what is safe to show of them, and what a name alone
refuses (no file access: the api checks launches for paths not on its filesystem)."""

from __future__ import annotations

import re

from einsora.common.weights.info import ACCEPTED_SUFFIXES, REFUSED_SUFFIXES, WeightsRefused
from einsora.common.weights.sniff import refuse_other_suffix, refuse_pickle_suffix, suffix_of

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_USER_COLON = re.compile(r"[^:]*:(?![0-9]*$).*")  # "user:secret", as opposed to "host:8080"
# A suffix that names a file type (".onnx", ".json"), as opposed to the dot in a model's
# name ("Qwen2.5-0.5B", "Mistral-7B-v0.3", "Phi-3.5-mini"), which marks a directory.
_FILE_SUFFIX = re.compile(r"\.[a-z][a-z0-9_]{0,9}")


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
    suffix = suffix_of(parts[-1])
    if suffix in REFUSED_SUFFIXES:
        refuse_pickle_suffix(shown, suffix)
    if suffix in ACCEPTED_SUFFIXES or not _FILE_SUFFIX.fullmatch(suffix):
        return
    refuse_other_suffix(shown, suffix)

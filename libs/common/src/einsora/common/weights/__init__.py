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

The package: `check` (the one entry for a local file or directory), `names` (URIs, redaction,
what a name alone refuses), `sniff` (a file judged by its name and first bytes), `gguf_header`,
`safetensors_header` and `directory` (each format's checks) and `info` (what a check returns,
and its refusal). Callers use only what this module exports.
"""

from __future__ import annotations

from einsora.common.weights.check import check_file
from einsora.common.weights.info import (
    ACCEPTED_SUFFIXES,
    MAX_DIRECTORY_ENTRIES,
    REFUSED_SUFFIXES,
    SAFETENSORS_MAX_HEADER,
    WeightsInfo,
    WeightsRefused,
)
from einsora.common.weights.names import check_name, is_uri, redact

__all__ = [
    "ACCEPTED_SUFFIXES",
    "MAX_DIRECTORY_ENTRIES",
    "REFUSED_SUFFIXES",
    "SAFETENSORS_MAX_HEADER",
    "WeightsInfo",
    "WeightsRefused",
    "check_file",
    "check_name",
    "is_uri",
    "redact",
]

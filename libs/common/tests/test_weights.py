"""Safe weights: real GGUF and safetensors files made with their own writers are accepted;
pickles, renamed pickles, zips, truncated and corrupt files are refused with a reason."""

from __future__ import annotations

import json
import pickle
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from einsora.common.weights import (
    WeightsRefused,
    check_file,
    check_name,
    is_uri,
    redact,
)


def make_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny")
    writer.add_context_length(2048)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<s>", "</s>", "hello", "world"])
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make_safetensors(path: Path) -> Path:
    save_file(
        {"embed": np.zeros((4, 8), dtype=np.float32), "norm": np.ones(8, dtype=np.float16)},
        str(path),
    )
    return path


def raw_safetensors(path: Path, header: Mapping[str, object], data: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def a_pickle() -> bytes:
    return pickle.dumps({"weight": [0.0, 1.0, 2.0]}, protocol=pickle.HIGHEST_PROTOCOL)


def refusal(path: Path) -> str:
    with pytest.raises(WeightsRefused) as caught:
        check_file(path)
    assert caught.value.code == "weights_refused"
    return caught.value.message


# Accepted.


def test_a_valid_gguf_is_accepted_with_what_its_metadata_says(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "tiny.gguf")
    info = check_file(path)
    assert info.format == "gguf"
    assert info.path == path
    assert info.size_bytes == path.stat().st_size
    assert info.tensors == 2
    assert info.architecture == "llama"
    assert info.name == "tiny"
    assert info.has_tokenizer
    assert info.context_length == 2048


def test_the_gguf_check_agrees_with_the_gguf_packages_reader(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "tiny.gguf")
    info = check_file(path)
    reader = gguf.GGUFReader(path)
    assert info.tensors == len(reader.tensors)
    assert info.architecture == reader.fields["general.architecture"].contents()
    assert info.context_length == reader.fields["llama.context_length"].contents()


def test_a_valid_safetensors_file_is_accepted(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "model.safetensors")
    info = check_file(path)
    assert (info.format, info.tensors, info.size_bytes) == ("safetensors", 2, path.stat().st_size)
    assert info.architecture is None
    assert not info.has_tokenizer


def test_a_directory_of_safetensors_is_accepted_with_its_config(tmp_path: Path) -> None:
    model = tmp_path / "Qwen2.5-0.5B"
    model.mkdir()
    first = make_safetensors(model / "model-00001-of-00002.safetensors")
    save_file(
        {"head": np.zeros(3, dtype=np.float32)}, str(model / "model-00002-of-00002.safetensors")
    )
    index = {
        "weight_map": {
            "embed": first.name,
            "norm": first.name,
            "head": "model-00002-of-00002.safetensors",
        }
    }
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    (model / "config.json").write_text(
        json.dumps({"model_type": "qwen2", "max_position_embeddings": 32768})
    )
    (model / "tokenizer.json").write_text("{}")
    info = check_file(model)
    assert info.format == "safetensors"
    assert info.tensors == 3
    assert info.size_bytes == sum(p.stat().st_size for p in model.glob("*.safetensors"))
    assert info.architecture == "qwen2"
    assert info.context_length == 32768
    assert info.has_tokenizer


# Pickles and other code-carrying formats.


def test_a_real_pickle_is_refused_by_its_name(tmp_path: Path) -> None:
    path = tmp_path / "model.pkl"
    path.write_bytes(a_pickle())
    message = refusal(path)
    assert ".pkl files can hold a Python pickle" in message
    assert str(path) in message


@pytest.mark.parametrize("suffix", [".gguf", ".safetensors"])
def test_a_pickle_renamed_to_an_accepted_suffix_is_refused_as_a_pickle(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"model{suffix}"
    path.write_bytes(a_pickle())
    message = refusal(path)
    fmt = "GGUF" if suffix == ".gguf" else "safetensors"
    assert f"is not a {fmt} file: it starts with a Python pickle's bytes" in message
    assert "can run code when loaded" in message


def test_a_zip_renamed_to_safetensors_is_refused_as_pytorchs_format(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", a_pickle())
    message = refusal(path)
    assert "is not a safetensors file: it starts with a zip archive's bytes" in message
    assert "PyTorch" in message


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".pkl"])
def test_pickle_capable_suffixes_are_refused_whatever_the_content(
    tmp_path: Path, suffix: str
) -> None:
    path = make_safetensors(tmp_path / f"pytorch_model{suffix}")
    message = refusal(path)
    assert f"{suffix} files can hold a Python pickle" in message
    assert "name it .safetensors" in message  # the content is fine: renaming is the fix


def test_a_gguf_named_safetensors_is_refused_and_said_to_be_gguf(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "tiny.gguf").rename(tmp_path / "tiny.safetensors")
    message = refusal(path)
    assert "is not a safetensors file: it starts with GGUF's magic bytes" in message


def test_a_safetensors_named_gguf_is_refused_and_said_to_be_safetensors(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "model.gguf")
    message = refusal(path)
    assert "is not a GGUF file: it starts with a safetensors header" in message


def test_other_suffixes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07")
    assert "ends in .onnx: only .gguf files" in refusal(path)


# Truncated and corrupt files.


def test_a_safetensors_cut_inside_its_json_header_is_refused(tmp_path: Path) -> None:
    path = make_safetensors(tmp_path / "model.safetensors")
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    path.write_bytes(path.read_bytes()[: 8 + length // 2])
    message = refusal(path)
    assert "is truncated: its header length says" in message


def test_a_safetensors_whose_offsets_point_past_the_end_is_refused(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [250], "data_offsets": [8, 1008]},
    }
    path = raw_safetensors(tmp_path / "model.safetensors", header, b"\0" * 16)
    message = refusal(path)
    assert "the data of tensor 'b' ends at byte 1,008" in message
    assert "holds 16 bytes after its header" in message


def test_a_safetensors_with_an_unknown_dtype_is_refused(tmp_path: Path) -> None:
    header = {"a": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 8]}}
    path = raw_safetensors(tmp_path / "model.safetensors", header, b"\0" * 8)
    assert "tensor 'a' has dtype 'Q4_K', not a safetensors dtype" in refusal(path)


def test_a_safetensors_whose_shape_does_not_match_its_bytes_is_refused(tmp_path: Path) -> None:
    header = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
    path = raw_safetensors(tmp_path / "model.safetensors", header, b"\0" * 8)
    assert "needs 12 bytes but its data_offsets span 8" in refusal(path)


def test_a_gguf_cut_inside_its_tensor_data_is_refused(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "tiny.gguf")
    last = gguf.GGUFReader(path).tensors[-1]
    path.write_bytes(path.read_bytes()[: last.data_offset + 4])
    message = refusal(path)
    assert f"is truncated: the data of tensor '{last.name}' ends at byte" in message


def test_a_gguf_cut_inside_its_metadata_is_refused(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "tiny.gguf")
    tokens = gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"]
    path.write_bytes(path.read_bytes()[: tokens.offset + 40])
    message = refusal(path)
    assert (
        "is truncated: the file ends inside the value of metadata key 'tokenizer.ggml.tokens'"
        in message
    )


def test_a_gguf_with_an_unsupported_version_is_refused(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "tiny.gguf")
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 99)
    path.write_bytes(bytes(data))
    assert "has GGUF version 99, and only versions 2 and 3 are supported" in refusal(path)


@pytest.mark.parametrize(
    ("item_type", "expected"),
    [(0, "is truncated: the file ends inside"), (8, "claims 1,099,511,627,776 items")],
)
def test_a_gguf_array_longer_than_the_file_is_refused_not_looped_over(
    tmp_path: Path, item_type: int, expected: str
) -> None:
    # GGUFReader loops on an array of 2**63 bytes past the end; the check must stop at once.
    count = 2**63 if item_type == 0 else 2**40
    key = b"tokenizer.ggml.tokens"
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + struct.pack("<Q", len(key)) + key
    path = tmp_path / "crafted.gguf"
    path.write_bytes(header + struct.pack("<IIQ", 9, item_type, count) + b"\0" * 64)
    assert expected in refusal(path)


def test_an_empty_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.touch()
    assert "is empty" in refusal(path)


# Directories and paths.


def test_a_directory_holding_a_pytorch_bin_is_refused_naming_it(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    make_safetensors(model / "model.safetensors")
    (model / "pytorch_model.bin").write_bytes(a_pickle())
    message = refusal(model)
    assert "holds pytorch_model.bin: .bin files can hold a Python pickle" in message


def test_a_directory_without_safetensors_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    make_gguf(model / "tiny.gguf")
    message = refusal(model)
    assert "holds no .safetensors file" in message
    assert "it holds .gguf files" in message


def test_a_directory_whose_index_names_a_missing_shard_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    make_safetensors(model / "model-00001-of-00002.safetensors")
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "names model-00002-of-00002.safetensors, which is missing" in refusal(model)


def test_a_directory_with_a_corrupt_shard_names_the_shard(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(a_pickle())
    assert f"{model / 'model.safetensors'} is not a safetensors file" in refusal(model)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.gguf"
    assert refusal(path) == f"{path} does not exist"


# Names and URIs.


def test_redact_removes_userinfo_query_and_fragment() -> None:
    shown = redact("https://user:pw@host/x.gguf?sig=abc#f")
    assert shown == "https://host/x.gguf"
    assert "pw" not in shown
    assert "sig" not in shown


@pytest.mark.parametrize(
    "uri",
    [
        "s3://key:se?cret@bucket/m.gguf",
        "s3://key:se#cret@bucket/m.gguf",
        "s3://key:se/cret@bucket/m.gguf",
        "s3://key:se/c?ret@bucket/m.gguf?X-Amz-Signature=abc",
    ],
)
def test_redact_strips_a_password_holding_unescaped_delimiters(uri: str) -> None:
    shown = redact(uri)
    assert shown == "s3://bucket/m.gguf"
    assert "se" not in shown.replace("s3", "")


def test_redact_keeps_a_port_and_an_at_sign_in_the_path() -> None:
    assert redact("https://host:8080/@org/x.gguf?sig=abc") == "https://host:8080/@org/x.gguf"


def test_redact_leaves_plain_paths_alone() -> None:
    assert redact("/models/a@b/x.gguf?") == "/models/a@b/x.gguf?"


def test_is_uri() -> None:
    assert is_uri("https://host/x.gguf")
    assert is_uri("s3://bucket/model")
    assert not is_uri("/models/x.gguf")
    assert not is_uri("models/x.gguf")
    assert not is_uri("C:\\models\\x.gguf")


@pytest.mark.parametrize(
    "model",
    [
        "/models/tiny.gguf",
        "https://host/tiny.GGUF?sig=abc",
        "/models/model.safetensors",
        "/models/Qwen2.5-0.5B-Instruct",
        "Mistral-7B-Instruct-v0.3",
        "/models/llama/",
        "hf://Qwen/Qwen2.5-0.5B",
        "https://models.example.com",
    ],
)
def test_check_name_accepts_accepted_suffixes_and_directories(model: str) -> None:
    check_name(model)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("/models/pytorch_model.bin", ".bin files can hold a Python pickle"),
        ("https://u:pw@host/model.pt?sig=abc", ".pt files can hold a Python pickle"),
        ("/models/consolidated.00.PTH", ".pth files can hold a Python pickle"),
        ("/models/model.onnx", "ends in .onnx: only .gguf files"),
        ("  ", "no model was named"),
    ],
)
def test_check_name_refuses_by_name(model: str, expected: str) -> None:
    with pytest.raises(WeightsRefused) as caught:
        check_name(model)
    assert expected in caught.value.message
    assert "pw" not in caught.value.message
    assert "sig" not in caught.value.message

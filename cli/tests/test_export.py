"""Redaction in `einsora export`: every secret replaced, every replacement listed."""

from einsora.cli.export import REDACTED, redact


def test_secrets_are_replaced_and_listed() -> None:
    spec = {
        "command": ["serve", "--port", "$PORT"],
        "env": {"HF_TOKEN": "hf_abcdefghijklmnop", "MODE": "fast"},
        "model": "s3://user:hunter2@bucket.example.org:9000/model.gguf",
        "api_key": "sk-abcdefghijkl",
        "notes": "tsk_abcdefghijklmnopqrstu",
    }
    clean, found = redact({"spec": spec}, "$.inputs")
    assert clean["spec"]["env"]["HF_TOKEN"] == REDACTED
    assert clean["spec"]["env"]["MODE"] == "fast"
    assert clean["spec"]["api_key"] == REDACTED
    assert clean["spec"]["notes"] == REDACTED
    assert "hunter2" not in clean["spec"]["model"]
    assert clean["spec"]["model"].startswith("s3://user:REDACTED@bucket.example.org:9000/")
    assert clean["spec"]["command"] == spec["command"]
    paths = {f["path"] for f in found}
    assert paths == {
        "$.inputs.spec.env.HF_TOKEN",
        "$.inputs.spec.api_key",
        "$.inputs.spec.notes",
        "$.inputs.spec.model",
    }


def test_nothing_to_redact_means_an_empty_list() -> None:
    clean, found = redact({"kind": "notebook", "class": "cpu-1c-2g"})
    assert found == []
    assert clean == {"kind": "notebook", "class": "cpu-1c-2g"}

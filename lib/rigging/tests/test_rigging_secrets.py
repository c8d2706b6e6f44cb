"""What counts as a secret, and redaction of known secret values in text, streams, command lines and logs."""

from __future__ import annotations

import io
import json
import logging

import pytest

from rigging.log import get_logger, setup_logging
from rigging.secrets import (
    REDACTED,
    RedactingStream,
    SecretNames,
    SecretNamesError,
    redact,
    redact_argv,
    secret_values,
    split_secrets,
)

KEY = "wandb-0123456789abcdef"


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
                                  "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "DB_PASSWORD", "OPENAI_API_KEY", "CLIENT_SECRET_ID",
                                  "wandb_api_key"])
def test_known_names_and_patterns_are_secrets(name):
    assert name in SecretNames.from_environment({})


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "GOOGLE_APPLICATION_CREDENTIALS", "MARIN_PREFIX", "TOKENIZERS_PARALLELISM",
                                  "MARIN_SECRET_NAMES", "HF_HOME"])
def test_settings_and_paths_are_not_secrets(name):
    assert name not in SecretNames.from_environment({})


def test_users_name_more_secrets_and_those_are_named_explicitly():
    names = SecretNames.from_environment({"MARIN_SECRET_NAMES": "LICENSE_KEY, myorg_*"})
    assert "LICENSE_KEY" in names and "MYORG_SIGNING" in names and "OTHER" not in names
    assert names.is_named("MYORG_SIGNING") and names.is_named("HF_TOKEN")
    assert "GITHUB_TOKEN" in names and not names.is_named("GITHUB_TOKEN")  # a pattern only: secret, not forwarded


def test_a_malformed_setting_is_refused_naming_the_entry():
    with pytest.raises(SecretNamesError, match=r"MARIN_SECRET_NAMES lists 'MY-KEY'.*commas"):
        SecretNames.from_environment({"MARIN_SECRET_NAMES": "GOOD_NAME,MY-KEY"})
    lenient = SecretNames.from_environment({"MARIN_SECRET_NAMES": "GOOD_NAME,MY-KEY"}, strict=False)
    assert "GOOD_NAME" in lenient


def test_split_secrets_keeps_names_apart_from_other_variables():
    env = {"WANDB_API_KEY": KEY, "WANDB_PROJECT": "demo", "MARIN_SECRET_NAMES": "LICENSE", "LICENSE": "abc"}
    public, secret = split_secrets(env)
    assert public == {"WANDB_PROJECT": "demo", "MARIN_SECRET_NAMES": "LICENSE"}
    assert secret == {"WANDB_API_KEY": KEY, "LICENSE": "abc"}  # the env's own setting counts


def test_redact_replaces_known_values_in_text_and_bytes_and_leaves_short_ones():
    environ = {"WANDB_API_KEY": KEY, "HF_TOKEN": "short", "HOME": "/root/not-a-secret"}
    values = secret_values(environ)
    assert values == (KEY,)
    assert redact(f"key={KEY}; home=/root/not-a-secret; short", values) == f"key={REDACTED}; home=/root/not-a-secret; short"
    assert redact(f"[{KEY}]".encode(), values) == f"[{REDACTED}]".encode()


def test_a_value_containing_another_is_redacted_whole():
    assert redact("abcdefgh-ijklmnop", ["abcdefgh", "abcdefgh-ijklmnop"]) == REDACTED


def test_the_keys_of_a_credentials_file_are_known_values(tmp_path):
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
    pem = f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"
    path = tmp_path / "sa.json"
    path.write_text(json.dumps({"type": "service_account", "private_key_id": "0123456789abcdef", "private_key": pem,
                                "client_email": "runner@project.iam.gserviceaccount.com"}))
    values = secret_values({"GOOGLE_APPLICATION_CREDENTIALS": str(path)})
    assert redact(path.read_text(), values).count(REDACTED) == 2  # the key id, and the key's line in the JSON
    assert body not in redact(pem, values) and "client_email" in redact(path.read_text(), values)
    assert secret_values({"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "missing.json")}) == ()


def test_the_process_environments_values_follow_its_changes(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    assert KEY not in secret_values()
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    assert KEY in secret_values()
    monkeypatch.setenv("MARIN_SECRET_NAMES", "MYORG_*")
    monkeypatch.setenv("MYORG_LOGIN", "myorg-login-value")
    assert "myorg-login-value" in secret_values()
    path = tmp_path / "sa.json"
    path.write_text(json.dumps({"private_key_id": "first-key-id-0123"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    assert "first-key-id-0123" in secret_values()
    path.write_text(json.dumps({"private_key_id": "second-key-id-456789"}))  # a rotated key: read again
    assert "second-key-id-456789" in secret_values() and "first-key-id-0123" not in secret_values()
    monkeypatch.delenv("WANDB_API_KEY")
    assert KEY not in secret_values()


def test_a_stream_redacts_a_secret_split_across_pieces_and_holds_back_no_more_than_it_must():
    stream = RedactingStream([KEY])
    text = f"start {KEY} middle {KEY[:5]}x end {KEY[:7]}".encode()
    out = b"".join(stream.feed(text[i:i + 3]) for i in range(0, len(text), 3))
    assert out == f"start {REDACTED} middle {KEY[:5]}x end ".encode()  # the last piece may yet become the key
    assert stream.flush() == KEY[:7].encode() and stream.flush() == b""
    assert RedactingStream([]).feed(b"untouched") == b"untouched"


def test_a_command_line_keeps_no_known_value_and_no_value_of_an_option_named_like_a_secret():
    environ = {"WANDB_API_KEY": KEY}
    argv = ["train.py", "--set", f"wandb.key={KEY}", "--hf-token", "hf_abc", "--set", "wandb.api_key=x",
            "--password=hunter2", "--eos-token", "</s>", "--steps", "10"]
    assert redact_argv(argv, environ) == ("train.py", "--set", f"wandb.key={REDACTED}", "--hf-token", REDACTED, "--set",
                                          f"wandb.api_key={REDACTED}", f"--password={REDACTED}", "--eos-token", "</s>",
                                          "--steps", "10")


def test_marins_log_handler_redacts_known_values(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    try:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        stream = io.StringIO()
        setup_logging("INFO", stream=stream)
        get_logger("marin.test").info("logging in with %s", KEY)
        assert stream.getvalue().rstrip().endswith(f"logging in with {REDACTED}")
        monkeypatch.setenv("MARIN_SECRET_NAMES", "NOT A-NAME")
        with pytest.raises(SecretNamesError):
            setup_logging("INFO")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)

"""A prefix whose storage this Python cannot reach is named, with the setting that chose it and the fix."""

import sys

import pytest

from rigging.config.discovery import ConfigError, PrefixUnusableError, discover_config
from rigging.filesystem import FilesystemUnavailableError, check_protocol, filesystem


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    return monkeypatch


def _hide(monkeypatch, package: str, protocol: str) -> None:
    """Make ``package`` unimportable here, as on a machine without it (the test extras install it)."""
    from fsspec.registry import _registry as registered_classes

    monkeypatch.setitem(sys.modules, package, None)  # import then raises ImportError
    monkeypatch.delitem(registered_classes, protocol, raising=False)  # a class registered earlier


def test_an_unknown_protocol_in_marin_prefix_names_the_variable(tmp_path, clean_env):
    clean_env.setenv("MARIN_PREFIX", "bogus://x")
    with pytest.raises(PrefixUnusableError) as caught:
        discover_config(cwd=tmp_path)
    message = str(caught.value)
    assert "MARIN_PREFIX" in message and "'bogus://x'" in message
    assert "unknown" in message.lower() and "bogus" in message
    assert isinstance(caught.value, ConfigError)


@pytest.mark.parametrize(
    ("url", "package"), [("gs://bucket/marin", "gcsfs"), ("s3://bucket/marin", "s3fs"), ("az://box/marin", "adlfs")]
)
def test_a_cloud_prefix_without_its_filesystem_package_says_what_to_install(tmp_path, clean_env, url, package):
    _hide(clean_env, package, url.split("://")[0])
    clean_env.setenv("MARIN_PREFIX", url)
    with pytest.raises(PrefixUnusableError) as caught:
        discover_config(cwd=tmp_path)
    message = str(caught.value)
    assert "MARIN_PREFIX" in message and f"pip install {package}" in message


def test_the_message_names_the_file_or_argument_that_chose_the_prefix(tmp_path, clean_env):
    (tmp_path / "marin.yaml").write_text("prefix: bogus://from-yaml\n")
    with pytest.raises(PrefixUnusableError, match="marin.yaml"):
        discover_config(cwd=tmp_path)
    with pytest.raises(PrefixUnusableError, match="argument"):
        discover_config(prefix="bogus://explicit", cwd=tmp_path)


def test_usable_prefixes_pass_and_the_check_can_be_skipped(tmp_path, clean_env):
    assert discover_config(prefix="memory://ok", cwd=tmp_path).prefix == "memory://ok"
    assert discover_config(prefix=f"file://{tmp_path}/out", cwd=tmp_path).prefix == str(tmp_path / "out")
    clean_env.setenv("MARIN_PREFIX", "bogus://x")
    # Callers that only want another setting (the cluster) need not reach the prefix's storage.
    assert discover_config(cwd=tmp_path, check_prefix=False).prefix == "bogus://x"


def test_the_filesystem_helpers_explain_an_unusable_url(monkeypatch):
    with pytest.raises(FilesystemUnavailableError, match="unknown"):
        check_protocol("bogus://somewhere/file.jsonl")
    with pytest.raises(ValueError, match="bogus"):  # still a ValueError for callers that catch that
        filesystem("bogus://somewhere/file.jsonl")
    check_protocol("memory://fine")
    check_protocol("/a/local/path")
    _hide(monkeypatch, "gcsfs", "gs")
    with pytest.raises(ImportError, match="pip install gcsfs"):
        filesystem("gs://bucket/file")

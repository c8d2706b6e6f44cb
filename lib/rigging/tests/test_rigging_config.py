import threading
from pathlib import Path

import pytest

from rigging.config.discovery import ConfigError, discover_config


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    monkeypatch.delenv("MARIN_LOG_LEVEL", raising=False)
    return monkeypatch


def test_default_prefix_is_local_folder_in_cwd(tmp_path, clean_env):
    config = discover_config(cwd=tmp_path)
    assert config.prefix == str(tmp_path.resolve() / "marin-outputs")
    assert config.source_of("prefix") == "default"


def test_precedence_argument_env_yaml_pyproject(tmp_path, clean_env):
    project = tmp_path / "project"
    nested = project / "a" / "b"
    nested.mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.marin]\nprefix = "from-pyproject"\nlog_level = "debug"\n')
    assert discover_config(cwd=nested).prefix == str((project / "from-pyproject").resolve())
    assert discover_config(cwd=nested).log_level == "DEBUG"

    (project / "a" / "marin.yaml").write_text("prefix: memory://from-yaml\n")
    config = discover_config(cwd=nested)
    assert config.prefix == "memory://from-yaml"
    assert config.log_level == "DEBUG"  # yaml did not set it; pyproject still applies

    clean_env.setenv("MARIN_PREFIX", "memory://bucket/from-env")
    assert discover_config(cwd=nested).prefix == "memory://bucket/from-env"
    assert discover_config(cwd=nested).source_of("prefix") == "env:MARIN_PREFIX"

    assert discover_config(prefix="memory://explicit", cwd=nested).prefix == "memory://explicit"


def test_default_prefix_sits_next_to_project_file(tmp_path, clean_env):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    assert discover_config(cwd=sub).prefix == str(tmp_path.resolve() / "marin-outputs")


def test_unknown_setting_and_bad_yaml_are_reported(tmp_path, clean_env):
    (tmp_path / "marin.yaml").write_text("prefx: oops\n")
    with pytest.raises(ConfigError, match="prefx"):
        discover_config(cwd=tmp_path)
    (tmp_path / "marin.yaml").write_text("- just a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        discover_config(cwd=tmp_path)
    with pytest.raises(ConfigError, match="bogus"):
        discover_config(cwd=Path("/"), bogus=1)


@pytest.mark.parametrize("name, content, words", [
    ("marin.yaml", "log_level: " + "9" * 5000 + "\n", "line 1: an integer of 5,000 digits"),
    ("marin.yaml", "cluster: 2024-13-45\n", "'2024-13-45' cannot be read as a date"),
    ("marin.yaml", b"prefix: caf\xe9\n", "is not UTF-8 text (byte 11)"),
    ("marin.yaml", "prefix: " + "x" * (2 << 20), "config files are limited to 1,048,576 bytes"),
    ("marin.yaml", "prefix: [a\n", "is not valid YAML: expected ',' or ']'"),
    ("marin.yaml", "log_level: 10\n", "'log_level' must be text, got 10 (int)"),
    ("pyproject.toml", "[tool.marin]\nlog_level = " + "9" * 5000 + "\n", "cannot be read as TOML"),
    ("pyproject.toml", b"[tool.marin]\nprefix = 'caf\xe9'\n", "is not UTF-8 text"),
])
def test_a_settings_file_that_cannot_be_read_is_a_one_line_config_error(tmp_path, clean_env, name, content, words):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as error:
        discover_config(cwd=tmp_path)
    message = str(error.value)
    assert str(path) in message and words in message and "\n" not in message, message


def test_a_settings_file_that_is_not_a_regular_file_is_refused_not_skipped(tmp_path, clean_env):
    import os

    fifo = tmp_path / "marin.yaml"
    os.mkfifo(fifo)  # opening it to read would wait for a writer
    outcome: list[BaseException | None] = []

    def discover() -> None:
        try:
            discover_config(cwd=tmp_path)
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=discover, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():  # it waits for a writer: be one, so that the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=30)
        pytest.fail("discover_config waited on a FIFO named marin.yaml")
    assert isinstance(outcome[0], ConfigError), outcome
    assert "marin.yaml is not a regular file (a FIFO)" in str(outcome[0])
    (tmp_path / "marin.yaml").unlink()
    (tmp_path / "marin.yaml").symlink_to(tmp_path / "moved.yaml")
    with pytest.raises(ConfigError, match=r"marin\.yaml is a link to a file that does not exist"):
        discover_config(cwd=tmp_path)

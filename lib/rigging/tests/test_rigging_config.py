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

"""Where process 0's jax.distributed coordinator listens: only as widely as the other processes need."""

from __future__ import annotations

import jax
import pytest

from levanter import distributed
from levanter.distributed import distributed_config_from_env, initialize_distributed


def _env(address: str, **extra: str) -> dict[str, str]:
    return {"IRIS_COORDINATOR_ADDRESS": address, "IRIS_NUM_REPLICAS": "2", "IRIS_REPLICA_INDEX": "0", **extra}


@pytest.mark.parametrize("address", ["127.0.0.1:8476", "localhost:8476", "[::1]:8476"])
def test_a_loopback_coordinator_listens_on_loopback_only(address):
    assert distributed_config_from_env(_env(address)).coordinator_bind_address == address


def test_a_coordinator_other_hosts_reach_keeps_jax_default():
    assert distributed_config_from_env(_env("10.0.0.2:8476")).coordinator_bind_address is None


def test_an_explicit_bind_address_wins():
    env = _env("10.0.0.2:8476", JAX_COORDINATOR_BIND_ADDRESS="10.0.0.2:8476")
    assert distributed_config_from_env(env).coordinator_bind_address == "10.0.0.2:8476"


def test_the_bind_address_reaches_jax_distributed_initialize(monkeypatch):
    calls = []
    monkeypatch.setattr(distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed, "_backend_started", lambda: False)
    monkeypatch.setattr(distributed, "_platforms_include_cpu", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "local_device_count", lambda: 1)
    monkeypatch.setattr(jax, "device_count", lambda: 2)
    assert initialize_distributed(distributed_config_from_env(_env("127.0.0.1:8476")))
    (call,) = calls
    assert call["coordinator_address"] == "127.0.0.1:8476"
    assert call["coordinator_bind_address"] == "127.0.0.1:8476"

"""``marin serve`` refuses, in one line and before saying it serves, a prefix folder that does not
exist and a port it cannot listen on; otherwise the server answers on the socket it checked."""

import socket

import pytest
import uvicorn

from marin import cli


@pytest.fixture
def no_server(monkeypatch):
    """Starting a server fails the test (instead of serving until killed)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the server was started")

    monkeypatch.setattr(uvicorn, "run", refuse)
    monkeypatch.setattr(uvicorn.Server, "run", refuse)


def test_a_prefix_folder_that_does_not_exist_is_refused(tmp_path, no_server, capsys):
    (tmp_path / "marin-outputs").mkdir()
    assert cli.main(["serve", "--prefix", str(tmp_path / "marin-ouputs"), "--port", "0"]) == 2
    captured = capsys.readouterr()
    assert f"there is no folder {tmp_path / 'marin-ouputs'}" in captured.err
    assert "on http://" not in captured.out


def test_a_port_in_use_is_refused_before_saying_it_serves(tmp_path, no_server, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert cli.main(["serve", "--prefix", str(tmp_path), "--port", str(port)]) == 2
    captured = capsys.readouterr()
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in captured.err
    assert "--port N" in captured.err and "Traceback" not in captured.err
    assert "on http://" not in captured.out


def test_the_server_is_given_the_socket_that_was_checked(tmp_path, no_server, monkeypatch, capsys):
    given = []
    # uvicorn.Config sets up logging handlers on the test's captured stderr; the server is not started.
    monkeypatch.setattr(uvicorn, "Config", lambda app, **options: options)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: given.extend(sockets or []))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert cli.main(["serve", "--prefix", str(tmp_path), "--port", str(port)]) == 0
    assert f"on http://127.0.0.1:{port}/" in capsys.readouterr().out
    assert len(given) == 1 and given[0].getsockname() == ("127.0.0.1", port)
    given[0].close()

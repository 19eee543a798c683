"""server/launch.py: a server that cannot start is one clear error, with its log kept; the port is free."""

import socket

import pytest

from specserve.server.launch import ServerProcess, ServerStartError, free_port


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_server_that_cannot_start_is_one_line_and_keeps_its_log(tmp_path):
    log = tmp_path / "logs" / "server.log"
    srv = ServerProcess(["--model", str(tmp_path / "no-such-model")], log_path=log, startup_timeout=300)
    with pytest.raises(ServerStartError) as caught:
        srv.start()
    message = str(caught.value)
    assert message.startswith("`specserve serve` exited with ") and str(log) in message
    assert "\n" not in message  # one line: the CLI prints it as `specserve: error: ...`
    assert "no-such-model" in caught.value.log_tail  # the server said why, and the log has it
    assert srv.proc.poll() is not None and log.is_file()

"""`--address ray://...`: a connection whose per-client server fails to start on the head is tried again;
any other failure is raised at once (no pause, no second try)."""
from __future__ import annotations

import pytest

from gtep.orchestration.jobs import connect_client

START_FAILED = ConnectionAbortedError("Initialization failure from server:\nRuntimeError: Starting Ray client "
                                      "server failed. See ray_client_server_23000.err for detailed logs.")


class FlakyProxy:
    """ray.init(address='ray://...') that fails the first `failures` times with `error`."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error


def test_a_client_server_that_fails_to_start_is_tried_again():
    proxy = FlakyProxy(failures=2, error=START_FAILED)
    connect_client(proxy, attempts=3, pause_s=0)
    assert proxy.calls == 3


def test_the_last_failure_is_raised_when_every_attempt_fails():
    proxy = FlakyProxy(failures=5, error=START_FAILED)
    with pytest.raises(ConnectionAbortedError, match="Starting Ray client server failed"):
        connect_client(proxy, attempts=3, pause_s=0)
    assert proxy.calls == 3


@pytest.mark.parametrize("error", [ConnectionAbortedError("Initialization failure from server: version mismatch"),
                                   ConnectionError("ray client connection timeout")])
def test_other_connection_errors_are_not_retried(error):
    proxy = FlakyProxy(failures=1, error=error)
    with pytest.raises(type(error)):
        connect_client(proxy, attempts=3, pause_s=0)
    assert proxy.calls == 1

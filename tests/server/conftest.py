import pytest

from tests.server.live_server import LiveServer

API_KEY = "sk-deltaserve-test"
MODEL = "smollm2"


@pytest.fixture(scope="session")
def server():
    """One live server for the server tests, with an API key and two served names."""
    yield from serving(LiveServer("--served-model-name", MODEL, "demo", api_key=API_KEY))


def serving(live: LiveServer):
    """Yields the live server, then stops it: it must exit cleanly with no traceback in its log."""
    try:
        yield live
        log = live.read_log()
        assert live.stop() == 0, log
        # bad input is answered with 4xx, never by a failure in the server
        assert "Traceback" not in log, log
    finally:
        live.cleanup()

import pytest

from tests.server.live_server import LiveServer

API_KEY = "sk-deltaserve-test"
MODEL = "smollm2"


@pytest.fixture(scope="session")
def server():
    """One live server for the server tests, with an API key and two served names."""
    live = LiveServer("--served-model-name", MODEL, "demo", api_key=API_KEY)
    try:
        yield live
        log = live.read_log()
        assert live.stop() == 0, log
        # bad input is answered with 4xx, never by a failure in the server
        assert "Traceback" not in log, log
    finally:
        live.cleanup()

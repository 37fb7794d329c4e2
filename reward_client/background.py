"""Run an ASGI app (the reference server) on a loopback port in a background thread.

    with BackgroundServer(create_app("tok")) as srv:
        cfg = RemoteConfig(srv.url + ENQUEUE_PATH, srv.url + PULL_PATH, token="tok")

Used by the tests and by the benchmark to time client <-> server round trips.
"""
from __future__ import annotations

import socket
import threading
import time


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 20.0):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{host}:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._server.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"reward-server-{self.port}", daemon=True)
        self._start_timeout_s = start_timeout_s

    def start(self) -> BackgroundServer:
        self._thread.start()
        end = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"reward server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10.0)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

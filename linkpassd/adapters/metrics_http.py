"""The /metrics HTTP endpoint of linkpassd and linkpass-aggregator, bounded.

prometheus_client's own server starts a thread per connection with no cap
and no read timeout: a local unprivileged user holding idle connections
drove linkpassd to its open-file limit, which disabled the control API and
reloads and stopped health.json being written. This is the same exposition
(prometheus_client's WSGI app on wsgiref) with bounds:
- at most `max_connections` at once; the next is answered 503 and closed
  without a thread;
- `read_timeout_s` for each read and write of a connection, and
  `deadline_s` for the whole connection (a client trickling a byte at a time
  is cut off), after which its socket is shut down.
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

MAX_CONNECTIONS = 16  # a Prometheus or two, an operator's curl: far above what scrapes need
READ_TIMEOUT_S = 5.0
DEADLINE_S = 15.0
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 30\r\n"
        b"Connection: close\r\n\r\ntoo many metrics connections\r\n")


class _Handler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_S  # StreamRequestHandler.setup() puts it on the socket

    def log_message(self, format, *args):
        """Scrapes are not logged."""


class BoundedWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 64  # the listen backlog (socketserver's 5 made a burst of clients wait on SYN retries)
    max_connections = MAX_CONNECTIONS
    deadline_s = DEADLINE_S

    def server_bind(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self.refused = 0  # connections answered 503 (tests read it)
        super().server_bind()

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            try:
                request.settimeout(0.2)
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        cutoff = threading.Timer(self.deadline_s, _cut, (request,))
        cutoff.daemon = True
        cutoff.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            cutoff.cancel()
            self._slots.release()


def _cut(request: socket.socket) -> None:
    try:
        request.shutdown(socket.SHUT_RDWR)  # wakes the handler's blocked read or write
    except OSError:
        pass


def serve(host: str, port: int, registry: CollectorRegistry, *, max_connections: int = MAX_CONNECTIONS,
          deadline_s: float = DEADLINE_S) -> tuple[BoundedWSGIServer, threading.Thread]:
    """Serve `registry` on host:port from a thread; (server, thread). OSError
    when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(BoundedWSGIServer):
        address_family = family

    Server.max_connections = max_connections
    Server.deadline_s = deadline_s
    httpd = make_server(host, port, make_wsgi_app(registry), Server, handler_class=_Handler)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread

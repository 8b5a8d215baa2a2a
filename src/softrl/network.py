"""Waiting on a network address (an S3 endpoint, a Ray cluster): what is waited for is said after a
few seconds, and the wait ends in one line after a bounded time (`SOFTRL_NETWORK_TIMEOUT` seconds,
30 unless set). A refused connection ends it at once: nothing listens there. A local Ray is started
on the loopback address, not on the machine's network address, which Ray would pick."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

SAY_AFTER = 3.0  # seconds of waiting before saying what for
PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, no flags, stream 0
LOCAL_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class NetworkError(ConnectionError):
    """Nothing answered at an address in time (one line, naming the address and the setting)."""


def limit() -> float:
    """Seconds to wait for a network address before giving up."""
    raw = os.environ.get("SOFTRL_NETWORK_TIMEOUT", "30")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < 1e6:
        raise NetworkError(f"SOFTRL_NETWORK_TIMEOUT={raw!r}: not a number of seconds between 0 and 1e6")
    return seconds


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def waited(what: str, attempt: Callable[[float], str | None], log: Callable[[str], None] = say) -> None:
    """Call `attempt(seconds left)` (None: answered; else what went wrong, and whether it is worth
    another try: a text starting "refused" is not) until it answers, saying after SAY_AFTER seconds
    that it waits for `what`, and raising NetworkError after `limit()` seconds."""
    started, until, said = time.monotonic(), limit(), False
    while True:
        waited_for = time.monotonic() - started
        # a first attempt ends when it is time to say what is waited for; later ones every 2 s
        problem = attempt(max(0.1, min(until - waited_for, 2.0 if said else SAY_AFTER - waited_for)))
        if problem is None:
            return
        waited_for = time.monotonic() - started
        if problem.startswith("refused"):
            raise NetworkError(f"{what}: {problem}")
        if not said and waited_for >= SAY_AFTER:
            log(f"waiting for {what} (up to {until:g} s; SOFTRL_NETWORK_TIMEOUT sets it)")
            said = True
        if waited_for >= until:
            raise NetworkError(f"{what}: {problem} after {waited_for:.0f} s")
        time.sleep(min(0.5, until - waited_for))


def http_answer(url: str) -> Callable[[float], str | None]:
    """An attempt for `waited`: any HTTP answer from `url`'s server (an error status is an answer)."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection

    def attempt(timeout: float) -> str | None:
        connection = kind(parts.hostname or "", parts.port, timeout=timeout)
        try:
            connection.request("HEAD", "/")
            connection.getresponse()
            return None
        except ConnectionRefusedError:
            return "refused: nothing listens there"
        except ssl.SSLError:
            return None  # a TLS handshake came back: a server is there (its certificate is Lance's business)
        except (TimeoutError, socket.timeout):
            return "no answer"
        except (OSError, http.client.HTTPException) as e:
            return f"no answer ({type(e).__name__}: {str(e)[:100]})"
        finally:
            connection.close()
    return attempt


def grpc_answer(host: str, port: int) -> Callable[[float], str | None]:
    """An attempt for `waited`: an HTTP/2 server's first frame (SETTINGS) after a client's preface, as
    every gRPC server (Ray's GCS, its client server) sends it."""
    def attempt(timeout: float) -> str | None:
        try:
            with socket.create_connection((host, port), timeout=timeout) as connection:
                connection.sendall(HTTP2_PREFACE + EMPTY_SETTINGS)
                frame = b""
                while len(frame) < 9:
                    got = connection.recv(9 - len(frame))
                    if not got:
                        return "refused: the server closed the connection (not a Ray cluster?)"
                    frame += got
            return None if frame[3] == 4 else "refused: not a gRPC server (not a Ray cluster?)"
        except ConnectionRefusedError:
            return "refused: nothing listens there"
        except (TimeoutError, socket.timeout):
            return "no answer"
        except OSError as e:
            return f"no answer ({str(e)[:100] or type(e).__name__})"
    return attempt


_answered: set[str] = set()  # endpoints that answered once in this process


def configured_endpoint() -> tuple[str | None, str]:
    """(the S3 endpoint the standard AWS variables name, None for AWS itself; the variable that names it),
    as boto3 and the AWS CLI read them."""
    for key in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(key):
            return os.environ[key], key
    return None, "AWS_ENDPOINT_URL"


def s3_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")


def s3_endpoint() -> tuple[str, str]:
    """(the S3 endpoint's URL, AWS's own where none is named; the setting that names it)."""
    endpoint, key = configured_endpoint()
    if endpoint is None:
        region = s3_region()
        endpoint = f"https://s3.{region}.amazonaws.com" if region else "https://s3.amazonaws.com"
    return endpoint, key


def wait_for_s3(uri: str, log: Callable[[str], None] = say) -> None:
    """Before the first read of an s3:// URI in this process: its endpoint answers, or NetworkError."""
    endpoint, key = s3_endpoint()
    if endpoint in _answered or any(os.environ.get(k) for k in PROXIES):
        return  # through a proxy the server is not reached directly: Lance's bounded requests say the rest
    waited(f"{uri}: the S3 server at {endpoint} ({key})", http_answer(endpoint), log)
    _answered.add(endpoint)


def s3_timeouts() -> dict[str, str]:
    """Lance's object-store options that bound each request and its retries (a server that stops answering
    mid-run ends the run in one line instead of hanging it)."""
    seconds = limit()
    return {"connect_timeout": f"{max(1, int(seconds))}s", "timeout": f"{max(10, int(4 * seconds))}s",
            "client_max_retries": "3", "client_retry_timeout": str(max(10, int(2 * seconds)))}


def on_loopback(address: str | None) -> bool:
    """A local Ray (None) or a cluster's address on this machine's loopback."""
    if address is None:
        return True
    host = address.removeprefix("ray://").rpartition(":")[0] or address
    return host in ("127.0.0.1", "localhost", "[::1]")


def ray_module(address: str | None):
    """The `ray` module (ImportError without it), for a local Ray (address None) or a cluster at `address`;
    on loopback set to stay there (Ray would swap 127.0.0.1 for the machine's network address) and,
    started here, to report no usage. (Where softrl's own processes listen, the learner group's and the
    weights' channels, is the runtime's choice: on loopback only for a Ray it started.)"""
    local = on_loopback(address)
    if local:
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)
    import ray
    from ray._private import ray_constants

    if local:
        ray_constants.ENABLE_RAY_CLUSTER = False  # in case Ray was imported before the variable was set
    return ray


def start_or_join_ray(ray, address: str | None, setting: str, log: Callable[[str], None] = say,
                      **init: Any) -> None:
    """`ray.init` on a local Ray (address None) or the cluster at `address` (host:port, ray://host:port
    or "auto"), whose gRPC server must answer within `limit()` seconds first: `setting` names where
    the address came from. (Ray itself retries a silent address for minutes.)"""
    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if address and port.isdigit():
        waited(f"the Ray cluster at {address} ({setting})", grpc_answer(host.strip("[]"), int(port)), log)
    ray.init(address=address, **init)

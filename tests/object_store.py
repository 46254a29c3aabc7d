"""A real S3-compatible server for tests: `moto_server` started on a free localhost port, the
AWS_* variables pointing at it, the bucket `pools` (boto3 uploads; alcli reads it by s3:// with
s3fs, or by http:// with aiohttp, as moto serves plain path-style HTTP too)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """moto_server on a free port, the AWS_* variables pointing at it; the bucket `pools`."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in (*ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "moto_server failed"
                time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="pools")
        yield client
    finally:
        server.kill()
        server.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            import s3fs
            s3fs.S3FileSystem.clear_instance_cache()
        except ImportError:
            pass


def upload(client, local: Path, key: str) -> str:
    client.upload_file(str(local), "pools", key)
    return f"s3://pools/{key}"

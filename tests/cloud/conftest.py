"""An S3-compatible server on loopback (moto's server mode), started once per session by the
tests themselves and ended by its PID; each test that needs it gets a new bucket and the
AWS_* environment that points every client (s3fs, boto3, smerge's reader) at it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    exe = shutil.which("moto_server") or os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(exe):
        pytest.fail("moto_server missing: install the test extra (pip install -e '.[test]')")
    port = _free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not start on port {port}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """``(bucket, fs)``: a fresh bucket on the loopback server and an s3fs filesystem on it."""
    import boto3
    import s3fs

    from smerge.datasets import remote

    env = {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials", "AWS_CONFIG_FILE": "/nonexistent/config",
           "BOTO_CONFIG": "/nonexistent/boto",
           "SMERGE_REMOTE_TIMEOUT": "30"}  # a loaded machine (tests of the timeout set their own)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # no credentials from the machine running the tests (a CI's role, container or web identity)
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "SMERGE_ANON", "AWS_ROLE_ARN",
              "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    s3fs.S3FileSystem.clear_instance_cache()
    remote._kind.cache_clear()
    fs = s3fs.S3FileSystem(key="testing", secret="testing",
                           client_kwargs={"endpoint_url": s3_server, "region_name": "us-east-1"})
    yield bucket, fs
    s3fs.S3FileSystem.clear_instance_cache()
    remote._kind.cache_clear()

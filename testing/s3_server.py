"""A real S3 API on loopback for tests and benchmarks: moto's server in its own process, with fsspec's s3
filesystem pointed at it (in this process through fsspec's config, in the processes it starts through the
environment, as a user's FSSPEC_S3 would)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from typing import Iterator

from evolforge.testing.net import free_port, wait_up

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@contextlib.contextmanager
def moto_s3(bucket: str = "evolforge", environment: bool = False) -> Iterator[str]:
    """Start moto_server, create `bucket`, point fsspec's s3 at it; yields the endpoint URL. With `environment`,
    the credentials and FSSPEC_S3 are also set in os.environ (for worker processes started meanwhile), and
    restored after."""
    import boto3
    import fsspec
    import s3fs

    venv_exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    exe = venv_exe if os.path.exists(venv_exe) else shutil.which("moto_server")
    if exe is None:
        raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], env={**os.environ, **CREDENTIALS},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved_conf = dict(fsspec.config.conf.get("s3", {}))
    saved_env = {k: os.environ.get(k) for k in [*CREDENTIALS, "FSSPEC_S3"]}
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, timeout=30)
        fsspec.config.conf["s3"] = {"endpoint_url": url, "key": "testing", "secret": "testing",
                                    "client_kwargs": {"region_name": "us-east-1"}}
        if environment:
            os.environ.update(CREDENTIALS)
            os.environ["FSSPEC_S3"] = json.dumps({"endpoint_url": url, "client_kwargs": {"region_name": "us-east-1"}})
        s3fs.S3FileSystem.clear_instance_cache()
        boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=bucket)
        yield url
    finally:
        fsspec.config.conf["s3"] = saved_conf
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()
        proc.kill()
        proc.wait()

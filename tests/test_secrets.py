"""Credentials in URLs never reach what alcli writes (issue 37, item 2): runs of the real CLI with
a secret planted in each URL form (s3://KEY:SECRET@bucket, http://user:p@ss@host with an '@' in the
password, a presigned URL's query), against a real S3 server (moto_server); every file each run
writes (its folder and its temporary folder) and its stdout and stderr are searched for the
secret, in successful and in failing runs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402

from alcli.files.redact import redacted, remember
from alcli.selection.export import model_version_from
from object_store import free_port, store, upload  # noqa: F401 - `store` is a fixture

KEY, SECRET = "AKIAPLANTED7", "Planted/Secret+Key99"


def run_alcli(folder: Path, *args) -> subprocess.CompletedProcess:
    """`python -m alcli ARGS` in `folder`, its temporary files in `folder/tmp`, verbose."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(folder / "tmp"), "PYTHONWARNINGS": "default",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "alcli", *map(str, args)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


def leaks(folder: Path, result, secrets) -> list[str]:
    """Where any of `secrets` appears: in stdout, stderr, or a file under `folder` (any bytes)."""
    found = [f"{stream}: {s}" for stream in ("stdout", "stderr") for s in secrets
             if s in getattr(result, stream)]
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {s}" for s in secrets if s.encode() in data]
        if any(s in path.name for s in secrets):
            found.append(f"file name {path}")
    return found


def test_redacted_drops_userinfo_to_the_last_at_and_the_query():
    assert redacted("see http://user:p@ss@host:9/a/b.pt?X-Amz-Signature=abc&y=1 now") \
        == "see http://host:9/a/b.pt now"
    assert redacted("s3://k:s@bkt/x.parquet and gs://bkt/y") == "s3://bkt/x.parquet and gs://bkt/y"
    assert model_version_from("https://h/b/best.pt?X-Amz-Signature=abc") == "best.pt"
    remember("s3://KEYID:Very/Secret@bkt/x")  # quoted later without its scheme, as s3fs does
    assert "Secret" not in redacted("Failed to head path 'KEYID:Very/Secret@bkt/x'")


def test_no_secret_from_any_url_form_reaches_a_file_or_stderr(in_ws, tmp_path, store):
    model = upload(store, in_ws.model, "ckpt/model.pt")
    upload(store, in_ws.manifest, "m/manifest.csv")
    for rel, (path, _) in in_ws.images.items():
        upload(store, path, f"m/pool/{rel}")
    endpoint = store.meta.endpoint_url
    v4 = boto3.client("s3", endpoint_url=endpoint, config=Config(signature_version="s3v4"))
    presigned = v4.generate_presigned_url("get_object", {"Bucket": "pools", "Key": "ckpt/model.pt"})
    query = urlsplit(presigned).query
    signed = [parse_qs(query)["X-Amz-Signature"][0], parse_qs(query)["X-Amz-Credential"][0],
              query.partition("X-Amz-Credential=")[2].partition("&")[0]]  # decoded and as sent
    assert len(signed[0]) > 20
    at_password = "p@ssPlanted@42"
    with_user = endpoint.replace("://", f"://user:{at_password}@")
    pool = [in_ws.pool, "--labels-from-folders", "-c", in_ws.config]
    runs = [  # (what, the secrets planted, the arguments, should it succeed)
        ("s3 key in the pool", [SECRET, f"{KEY}:{SECRET}"],
         ["score", f"s3://{KEY}:{SECRET}@pools/m/manifest.csv", "-m", in_ws.model, "-c",
          in_ws.config, "-o", "a.csv"], False),
        ("s3 key in the model", [SECRET],
         ["score", *pool, "-m", f"s3://{KEY}:{SECRET}@pools/ckpt/model.pt", "-o", "b.csv"], False),
        ("'@' in the password", [at_password, "ssPlanted"],
         ["score", f"{with_user}/pools/m/manifest.csv", "-m", f"{with_user}/pools/ckpt/model.pt",
          "-c", in_ws.config, "-o", "c.csv", "-v", "--log-format", "json"], True),
        ("'@' in the password, no server", [at_password, "ssPlanted"],
         ["score", *pool, "-m", f"http://user:{at_password}@127.0.0.1:{free_port()}/m.pt",
          "-o", "e.csv"], False),
        ("presigned model", signed,
         ["score", *pool, "-m", presigned, "-o", "f.csv", "-v"], True),
        ("presigned model, Label Studio", signed,
         ["select", "f.csv", "-n", "3", "--no-diverse", "-f", "labelstudio", "-o", "tasks.json"],
         True),
        ("presigned, wrong key", signed,
         ["score", *pool, "-m", presigned.replace("ckpt/model.pt", "ckpt/nope.pt"), "-o",
          "g.csv"], False),
    ]
    folder = tmp_path / "runs"
    for what, secrets, args, succeeds in runs:
        result = run_alcli(folder, *args)
        assert (result.returncode == 0) == succeeds, (what, result.stderr)
        if succeeds is False:
            assert "Traceback" not in result.stderr and \
                result.stderr.strip().startswith("alcli: error: "), (what, result.stderr)
        assert leaks(folder, result, secrets) == [], what
    assert (folder / "c.csv.meta.json").is_file() and (folder / "tasks.json").is_file()
    assert "model.pt" in (folder / "tasks.json").read_text()  # model_version: the file's name

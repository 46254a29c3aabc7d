"""Pools and checkpoints in an object store (issue 20): a real S3-compatible server (`moto_server`,
started here on localhost) holds a Parquet pool, WebDataset shards and the checkpoint; scored by
s3:// URL through the CLI they give the local files' table byte for byte, a kill -9 resumes from
the store, and a missing, forbidden or unreachable bucket is one sentence."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from typer.testing import CliRunner

from alcli.cli import app
from cli_errors import assert_one_error
from interrupted import kill_when_saved, start_score
from object_store import free_port, store, upload  # noqa: F401 - `store` is a fixture
from test_sources import bytes_table, random_png_table, rows, score, write_parquet, write_shards

pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")  # tables compared byte for byte


def test_parquet_shards_and_checkpoint_by_url_give_the_local_tables(in_ws, tmp_path, store):
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    shards = write_shards(in_ws, tmp_path / "wds")
    for shard in shards:
        upload(store, shard, f"wds/{shard.name}")
    model = upload(store, in_ws.model, "ckpt/model.pt")
    local = rows(score(in_ws, table, "--id-column", "id", "-o", "-"))
    url = upload(store, table, "tables/pool.parquet")
    assert rows(score(in_ws, url, "--id-column", "id", "-o", "-")) == local
    assert rows(score(in_ws, "s3://pools/tables/", "--id-column", "id", "-m", model,
                      "-o", "-")) == local  # a folder of tables, and the checkpoint, by URL
    local_shards = rows(score(in_ws, tmp_path / "wds" / "pool-{000000..000002}.tar", "-o", "-"))
    out = tmp_path / "scores.csv"
    score(in_ws, "s3://pools/wds/pool-{000000..000002}.tar", "-m", model, "-o", out)
    assert rows(out) == local_shards
    # two loader workers, each a forked process that connects anew
    assert rows(score(in_ws, url, "--id-column", "id", "--workers", "2", "-o", "-")) == local
    assert rows(score(in_ws, "s3://pools/wds/pool-{000000..000002}.tar", "--workers", "2",
                      "-o", "-")) == local_shards
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    assert meta["pool_path"] == "s3://pools/wds/pool-{000000..000002}.tar"
    assert meta["model_file"] == model and "testing" not in json.dumps(meta)
    # over plain HTTP(S), a password in the URL is used, never shown nor kept
    http = store.meta.endpoint_url.replace("://", "://user:secret@") + "/pools/tables/pool.parquet"
    score(in_ws, http, "--id-column", "id", "-o", out)
    assert rows(out) == local
    meta = Path(f"{out}.meta.json").read_text()
    assert "secret" not in meta and "/pools/tables/pool.parquet" in meta


def test_parquet_with_paths_relative_to_a_remote_table(in_ws, tmp_path, store):
    """The image column holds paths; the files are beside the table, in the bucket."""
    names = sorted(in_ws.images)
    for rel in names:
        upload(store, in_ws.images[rel][0], f"rel/files/{rel}")
    table = write_parquet(tmp_path / "paths.parquet", {
        "id": names, "image": [f"files/{n}" for n in names],
        "label": [in_ws.images[n][1] for n in names]})
    url = upload(store, table, "rel/paths.parquet")
    local = rows(score(in_ws, bytes_table(in_ws, tmp_path / "pool.parquet"), "--id-column", "id",
                       "-o", "-"))
    assert rows(score(in_ws, url, "--id-column", "id", "-o", "-")) == local


def test_kill_and_resume_from_the_object_store_equal_the_uninterrupted_run(in_ws, tmp_path, store):
    n = 300
    table = random_png_table(tmp_path / "big.parquet", n, 5, 128)
    url = upload(store, table, "big/big.parquet")
    model = upload(store, in_ws.model, "big/model.pt")
    full, out = tmp_path / "full.csv", tmp_path / "resumed.csv"
    partial = Path(f"{out}.partial")

    def start(dest, *more):
        return start_score(in_ws.root, url, "-m", model, "-c", "config.yaml", "-b", "8",
                           "--id-column", "id", "-o", dest, "-q", "--checkpoint-every", "32", *more)
    saved = kill_when_saved(start(out), partial, 80)
    assert 0 < saved < n
    second = start(out, "--resume")
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert f"resuming: {saved} examples" in err
    reference = runner.invoke(app, ["score", url, "-m", model, "-c", "config.yaml", "-b", "8",
                                    "--id-column", "id", "-o", str(full), "-q"])
    assert reference.exit_code == 0, reference.stderr  # uninterrupted, in this process
    assert out.read_text() == full.read_text()


def test_missing_forbidden_and_unreachable_stores_are_one_sentence(in_ws, tmp_path, store,
                                                                   monkeypatch):
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    upload(store, table, "tables/pool.parquet")
    upload(store, table, "other/pool.bin")
    store.create_bucket(Bucket="locked")
    store.upload_file(str(table), "locked", "pool.parquet")
    store.put_bucket_policy(Bucket="locked", Policy=json.dumps({"Statement": [{
        "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": ["arn:aws:s3:::locked", "arn:aws:s3:::locked/*"]}]}))
    for url, culprit in (("s3://pools/tables/nope.parquet", "s3://pools/tables/nope.parquet does not exist"),
                         ("s3://no-such-bucket/pool.parquet", "there is no such bucket"),
                         ("s3://pools/wds/nope-{0..1}.tar", "shard s3://pools/wds/nope-0.tar does not exist"),
                         ("s3://locked/pool.parquet", "s3://locked/pool.parquet: access denied"),
                         ("s3://pools/other/", "s3://pools/other holds no .parquet files")):
        assert_one_error(score(in_ws, url, "-o", "-", ok=False), culprit, url)
    assert_one_error(score(in_ws, "pool", "--labels-from-folders", "-m", "s3://pools/no.pt",
                           "-o", "-", ok=False), "model s3://pools/no.pt does not exist", "model")
    out = "s3://pools/out.csv"
    assert_one_error(score(in_ws, table, "-o", out, ok=False),
                     f"option --output {out} is an object-store URL", "remote output")
    assert not Path("s3:").exists()  # no local folder made for it
    import s3fs
    s3fs.S3FileSystem.clear_instance_cache()  # a new endpoint: a new connection
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    assert_one_error(score(in_ws, "s3://pools/tables/pool.parquet", "-o", "-", ok=False),
                     "Could not connect to the endpoint URL", "unreachable")
    s3fs.S3FileSystem.clear_instance_cache()


def test_an_image_manifest_by_url_gives_the_local_manifests_table(in_ws, tmp_path, store):
    """A .csv manifest in the store, its images beside it there (paths relative to it)."""
    for rel, (path, _) in in_ws.images.items():
        upload(store, path, f"manifest/pool/{rel}")
    url = upload(store, in_ws.manifest, "manifest/manifest.csv")
    local = rows(score(in_ws, in_ws.manifest, "-o", "-"))
    remote_rows = rows(score(in_ws, url, "-o", "-"))
    assert remote_rows == local and len(local) == len(in_ws.images)
    store.delete_object(Bucket="pools", Key=f"manifest/pool/{sorted(in_ws.images)[0]}")
    gone = score(in_ws, url, "-o", "-")  # an image missing in the store: an error row, not a stop
    assert [r["id"] for r in rows(gone)] == [r["id"] for r in local if r["id"] != sorted(in_ws.images)[0]]

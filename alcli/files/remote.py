"""Pools and checkpoints in object stores: `s3://`, `gs://`, `az://` and `http(s)://` URLs, read
through fsspec (s3fs, gcsfs, adlfs, aiohttp). Credentials and endpoints come from where each
store's own tools look (for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws,
AWS_ENDPOINT_URL(_S3) or `endpoint_url` in ~/.aws/config for S3-compatible servers); a URL is
shown, and kept in .meta.json, without any `user:password@` it holds.

A remote file is a `Remote` (the filesystem and its path); pools keep it as they keep a local
Path, and it pickles into DataLoader workers, which open their own connections. Checkpoints are
copied once into a temporary folder (removed at exit) and loaded from there.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from ..errors import AlcliError, PoolError, first_line

# scheme -> the package that reads it (fsspec picks the implementation) and alcli's extra for it
SCHEMES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"),
           "gcs": ("gcsfs", "gcs"), "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"),
           "abfss": ("adlfs", "azure"), "http": ("aiohttp", "http"), "https": ("aiohttp", "http")}
URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
TAR_BLOCK = 8 << 20  # bytes fetched at once when a tar is read in order


class Remote:
    """A file or folder in an object store: its fsspec filesystem and its path (no scheme)."""

    def __init__(self, fs, path: str):
        self._fs, self.path = fs, path

    @property
    def fs(self):
        """The filesystem, made anew in a forked process (a DataLoader worker), as fsspec's
        asynchronous ones serve only the process that made them."""
        if getattr(self._fs, "_pid", os.getpid()) != os.getpid():
            self._fs = type(self._fs)(**self._fs.storage_options)
        return self._fs

    def __eq__(self, other) -> bool:
        return isinstance(other, Remote) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __str__(self) -> str:
        return shown(self.fs.unstrip_protocol(self.path))

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rpartition("/")[2]


def is_url(spec) -> bool:
    m = URL.match(spec) if isinstance(spec, str) else None
    return m is not None and m.group(1).lower() in SCHEMES


def shown(text) -> str:
    """`text` with the `user:password@` of any URL in it left out."""
    return USERINFO.sub(r"\1", str(text))


def locate(url: str, error=PoolError) -> Remote:
    """The filesystem and path of `url`; one sentence when the package reading it is missing."""
    scheme = URL.match(url).group(1).lower()
    try:
        import fsspec
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError:
        package, extra = SCHEMES[scheme]
        raise error(f"{shown(url)}: reading {scheme}:// URLs needs {package}; pip install "
                    f"'alcli[{extra}]'") from None
    except Exception as err:  # noqa: BLE001 - a malformed URL, a bad option in the environment
        raise error(f"{shown(url)} cannot be opened ({shown(first_line(err))})") from None
    return Remote(fs, path)


@contextlib.contextmanager
def reading(what: str, url, error=PoolError):
    """Whatever the store raises while `what` at `url` is read -> one sentence."""
    try:
        yield
    except AlcliError:
        raise
    except Exception as err:  # noqa: BLE001 - unreachable endpoint, timeout, bad reply
        raise_store_error(what, url, err, error)
        raise error(f"cannot read {what} {shown(url)} ({shown(first_line(err))})") from None


def raise_store_error(what: str, url, err: Exception, error=PoolError) -> None:
    """One sentence for a missing, forbidden or unreachable `url` (a URL or Remote); nothing for
    the errors of reading a file's content (OSError, ValueError), nor, but a missing one, for a
    local file."""
    local = not isinstance(url, Remote) and not is_url(url)
    cause = err.__cause__
    if isinstance(err, FileNotFoundError) and isinstance(cause, OSError) \
            and not isinstance(cause, FileNotFoundError):  # fsspec's http: unreachable, as this
        raise error(f"cannot read {what} {shown(url)} ({shown(str(cause) or first_line(cause))})") \
            from None
    if isinstance(err, FileNotFoundError):
        bucket = not local and "bucket" in str(err).lower()
        raise error(f"{what} {shown(url)} does not exist"
                    + (" (there is no such bucket)" if bucket else "")) from None
    if local:
        return
    if isinstance(err, PermissionError):
        raise error(f"{what} {shown(url)}: access denied ({shown(first_line(err))}); check the "
                    f"credentials the store's tools use (for S3: AWS_ACCESS_KEY_ID, AWS_PROFILE, "
                    f"~/.aws)") from None
    if not isinstance(err, (OSError, ValueError)):  # the store's own: unreachable, timed out
        raise error(f"cannot read {what} {shown(url)} ({shown(first_line(err))})") from None


# --- files: a local Path or a Remote --------------------------------------------------------

def open_binary(file, block: int | None = None):
    """`file` opened for reading; a Remote fetches exactly the ranges read, or, given `block`,
    `block` bytes ahead (for reading in order)."""
    if isinstance(file, Remote):
        if block is None:
            return file.fs.open(file.path, "rb", cache_type="none")
        return file.fs.open(file.path, "rb", block_size=block, cache_type="readahead")
    return open(file, "rb")


def size(file) -> int:
    return file.fs.size(file.path) if isinstance(file, Remote) else file.stat().st_size


def kind(file) -> str:
    """'file', 'directory' (or another kind); FileNotFoundError when there is nothing."""
    if isinstance(file, Remote):
        return file.fs.info(file.path)["type"]
    if not file.exists():
        raise FileNotFoundError(str(file))
    return "file" if file.is_file() else "directory" if file.is_dir() else "other"


def read_bytes(file) -> bytes:
    return file.fs.cat_file(file.path) if isinstance(file, Remote) else file.read_bytes()


def join(folder, relative: str):
    if isinstance(folder, Remote):
        return Remote(folder.fs, f"{folder.path.rstrip('/')}/{relative}")
    return folder / relative


def parent(file):
    if isinstance(file, Remote):
        return Remote(file.fs, file.path.rstrip("/").rpartition("/")[0])
    return file.parent


def files_under(folder: Remote, suffix: str) -> list[Remote]:
    """The files named *suffix under `folder` (subfolders included), sorted."""
    found = folder.fs.find(folder.path)
    return [Remote(folder.fs, p) for p in sorted(found) if p.lower().endswith(suffix)]


# --- checkpoints ----------------------------------------------------------------------------

_copies: dict[str, Path] = {}


def local_copy(url: str, error) -> Path:
    """The file or folder at `url`, copied once per process into a temporary folder."""
    if url not in _copies:
        remote = locate(url, error)
        with reading("model", url, error):
            folder = Path(tempfile.mkdtemp(prefix="alcli-model-"))
            atexit.register(shutil.rmtree, folder, True)
            target = folder / (remote.name or "model")
            if remote.fs.isdir(remote.path):
                remote.fs.get(remote.path.rstrip("/") + "/", str(target), recursive=True)
            else:
                remote.fs.get_file(remote.path, str(target))
        _copies[url] = target
    return _copies[url]

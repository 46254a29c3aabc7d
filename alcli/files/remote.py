"""Pools and checkpoints in object stores: `s3://`, `gs://`, `az://` and `http(s)://` URLs, read
through fsspec (s3fs, gcsfs, adlfs, aiohttp). Credentials and endpoints come from where each
store's own tools look (for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws,
AWS_ENDPOINT_URL(_S3) or `endpoint_url` in ~/.aws/config for S3-compatible servers); a URL is
shown, and kept in .meta.json, without the `user:password@` and the query it holds (redact.py).
An http(s) server gets HTTP_TIMEOUT seconds to accept and to send each next part of a reply.

A remote file is a `Remote` (the filesystem and its path); pools keep it as they keep a local
Path, and it pickles into DataLoader workers, which open their own connections. Checkpoints are
copied once into a temporary folder alcli-model-PID-* (removed at exit; one a killed process
left is removed when the next run loads a model: sweep_stale_copies) and loaded from there.
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
from .redact import redacted, remember

# scheme -> the package that reads it (fsspec picks the implementation) and alcli's extra for it
SCHEMES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"),
           "gcs": ("gcsfs", "gcs"), "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"),
           "abfss": ("adlfs", "azure"), "http": ("aiohttp", "http"), "https": ("aiohttp", "http")}
URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
TAR_BLOCK = 8 << 20  # bytes fetched at once when a tar is read in order
HTTP_TIMEOUT = 60.0  # seconds an http(s) server may take to accept, or to send the next bytes
COPY_PREFIX = "alcli-model-"  # temporary copies of remote checkpoints: alcli-model-PID-XXXX


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
    """`text` without the user-info and query of any URL in it, nor any secret a URL opened held."""
    return redacted(text)


def locate(url: str, error=PoolError) -> Remote:
    """The filesystem and path of `url`; one sentence when the package reading it is missing."""
    scheme = URL.match(url).group(1).lower()
    remember(url)
    try:
        import fsspec
        fs, path = fsspec.core.url_to_fs(url, **_options(scheme))
    except ImportError:
        package, extra = SCHEMES[scheme]
        raise error(f"{shown(url)}: reading {scheme}:// URLs needs {package}; pip install "
                    f"'alcli[{extra}]'") from None
    except Exception as err:  # noqa: BLE001 - a malformed URL, a bad option in the environment
        raise error(f"{shown(url)} cannot be opened ({shown(first_line(err))})") from None
    return Remote(fs, path)


def _options(scheme: str) -> dict:
    """Storage options: for http(s), a timeout on connecting and on each read (aiohttp waits
    for ever on a server that accepts and never answers); S3 and the others have their own."""
    if scheme not in ("http", "https"):
        return {}
    import aiohttp
    return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_connect=HTTP_TIMEOUT,
                                                               sock_read=HTTP_TIMEOUT)}}


def _timed_out(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from, is a timeout."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, TimeoutError):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


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
    if not local and _timed_out(err):
        raise error(f"{what} {shown(url)}: the server did not answer within {HTTP_TIMEOUT:g} "
                    f"seconds") from None
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
    """The file or folder at `url`, copied once per process into a temporary folder named with
    this process's id (so that sweep_stale_copies knows when its owner is gone)."""
    if url not in _copies:
        remote = locate(url, error)
        with reading("model", url, error):
            folder = Path(tempfile.mkdtemp(prefix=f"{COPY_PREFIX}{os.getpid()}-"))
            atexit.register(shutil.rmtree, folder, True)
            name = remote.name.partition("?")[0] if "http" in remote.fs.protocol else remote.name
            target = folder / (name or "model")
            if remote.fs.isdir(remote.path):
                remote.fs.get(remote.path.rstrip("/") + "/", str(target), recursive=True)
            else:
                remote.fs.get_file(remote.path, str(target))
        _copies[url] = target
    return _copies[url]


def sweep_stale_copies() -> list[Path]:
    """Remove the temporary copies whose process is gone (killed before its exit handler ran)
    -> the folders removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{COPY_PREFIX}*-*"):
        pid = folder.name[len(COPY_PREFIX):].partition("-")[0]
        if pid.isdigit() and folder.is_dir() and not folder.is_symlink() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True

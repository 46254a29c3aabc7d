"""Image folder pools: every image under a folder (recursive, sorted), ids relative to it;
--labels-from-folders takes the class subfolders as labels."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import PoolError, first_line
from .common import IMAGE_EXTS, Pool, PoolKind, PoolOptions, image_pool, names_source


def _is_folder(spec, opts: PoolOptions) -> bool:
    return isinstance(spec, str) and Path(spec).is_dir()


def _files_under(spec: str):
    """A row's id is its path relative to the folder."""
    return lambda i: str(Path(spec) / i)


KIND = PoolKind("image folder", _is_folder, lambda spec, opts, stdin: from_directory(spec, opts),
                options=("labels_from_folders", "class_names"), files_of=_files_under)


def from_directory(spec: str, opts: PoolOptions) -> Pool:
    """Every image under the folder (recursive, sorted); ids are paths relative to it.

    Every entry named like an image is listed, so one that is not a readable image file (a
    directory, a dangling link, a FIFO, a corrupt file) becomes an error row rather than vanishing.
    Links to folders are followed (as `find -L` does), except into a folder already open above."""
    root = Path(spec)
    files = sorted(_image_entries(root), key=lambda p: p.relative_to(root).as_posix())
    classes: dict[str, int] = {}
    by_name = None
    if opts.labels_from_folders:  # ImageFolder's convention: sorted class subfolders
        top = _folder_key(root)
        folders = sorted(e.name for e in os.scandir(root) if _folder_key(e) not in (None, top))
        by_name = _folders_by_name(root, folders, opts)
        classes = by_name or {name: i for i, name in enumerate(folders)}
    rows = []
    for p in files:
        rel = p.relative_to(root).as_posix()
        label = -1
        if opts.labels_from_folders:
            if "/" not in rel:
                raise PoolError(f"with --labels-from-folders every image must be in a class folder, "
                                f"but {p} is directly in {root}")
            label = classes[rel.split("/", 1)[0]]
        rows.append((rel, p, label))
    pool = image_pool(str(root), rows, opts)
    if opts.labels_from_folders:
        pool.classes = opts.class_names if by_name else list(classes)
        pool.classes_from = names_source(opts.class_names_file) if by_name else None
    return pool


def _image_entries(root: Path) -> list[Path]:
    """The entries named like images under `root`, walked with a stack (no depth limit), following
    links to folders but not into one open above (a link loop such as `loop -> .`)."""
    found = []
    stack = [(root, frozenset({_folder_key(root)}))]  # (folder, the folders open above and at it)
    while stack:
        folder, above = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as err:
            raise PoolError(f"folder {folder} in pool {root} cannot be read ({first_line(err)})") from None
        for entry in entries:
            path = folder / entry.name
            if path.suffix.lower() in IMAGE_EXTS:
                found.append(path)
            key = _folder_key(entry)
            if key is not None and key not in above:
                stack.append((path, above | {key}))
    return found


def _folder_key(entry: os.DirEntry | Path) -> tuple[int, int] | None:
    """(device, inode) of a folder, links followed; None for anything else."""
    try:
        if not entry.is_dir():
            return None
        st = entry.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _folders_by_name(root: Path, folders: list[str], opts: PoolOptions) -> dict[str, int] | None:
    """Class folders -> the index of their name among the known class names; None when there
    are none, or when the model's names (id2label) do not name every folder (then the folders,
    sorted, are the classes). A folder a --class-names file does not name is an error."""
    names = opts.class_names
    if not names:
        return None
    missing = [f for f in folders if f not in names]
    if not missing:
        return {f: names.index(f) for f in folders}
    if opts.class_names_file is None:
        return None
    raise PoolError(f"class folder {root / missing[0]} is not one of the {len(names)} class names "
                    f"in {opts.class_names_file}")

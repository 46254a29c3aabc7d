"""Pool sources on real files: folders, manifests, stdin paths, tensor files; transforms."""
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from alcli.files.config import Transform
from alcli.errors import ConfigError, PoolError
from alcli.pools import open_pool
from alcli.pools.common import PoolOptions, collate, image_transform
from alcli.pools.tensors import tensor_pool

NORM = Transform(normalize={"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]})


def opts(**kw):
    return PoolOptions(**{"transform": NORM, "channels": 3, **kw})


def test_folder_is_recursive_sorted_and_keyed_by_relative_path(workspace):
    pool = open_pool(str(workspace.pool), opts())
    assert pool.ids == sorted(workspace.images) and not pool.has_labels
    item = pool[pool.ids.index("a/img00.png")]
    assert item.error is None and item.label == -1 and item.input.dtype == torch.uint8
    model_input = pool.to_float(item.input[None])[0]  # on the device, in the runner
    assert torch.allclose(model_input, workspace.image_input("a/img00.png").float(), atol=1e-6)


def test_labels_from_folders_follow_imagefolder(workspace):
    pool = open_pool(str(workspace.pool), opts(labels_from_folders=True))
    labels = {pool.ids[i]: pool[i].label for i in range(len(pool))}
    assert labels == {k: v[1] for k, v in workspace.images.items()}  # a=0, b=1, c=2 (c/deep too)
    assert pool.has_labels


def test_labels_from_folders_needs_class_folders(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "loose.png")
    with pytest.raises(PoolError, match="loose.png is directly in"):
        open_pool(str(tmp_path), opts(labels_from_folders=True))


def test_manifests(workspace, tmp_path):
    pool = open_pool(str(workspace.manifest), opts())
    assert pool.ids == [r for r in workspace.images] and pool.has_labels
    jl = tmp_path / "m.jsonl"
    first, second = list(workspace.images.values())[:2]
    jl.write_text(json.dumps({"path": str(first[0]), "id": "one"}) + "\n\n"
                  + json.dumps({"path": str(second[0]), "label": 4}) + "\n")
    pool = open_pool(str(jl), opts())
    assert pool.ids == ["one", str(second[0])]
    assert [pool[0].label, pool[1].label] == [-1, 4]


@pytest.mark.parametrize("name, text, needle", [
    ("a.csv", "file,label\nx.png,1\n", "has no 'path' column"),
    ("b.csv", "path,label\nx.png,one\n", "line 2: label 'one' is not a class index"),
    ("c.csv", "path,label\nx.png,-2\n", "line 2: label -2 is negative"),
    ("d.csv", "path,id\nx.png,k\ny.png,k\n", "has the id 'k' twice"),
    ("e.csv", "path\n", "holds no images"),
    ("f.jsonl", '{"path": "x.png"}\nnot json\n', "line 2 is not valid JSON"),
    ("g.jsonl", '{"id": "x"}\n', "line 1 has no path"),
])
def test_manifest_errors_name_file_and_line(tmp_path, name, text, needle):
    (tmp_path / name).write_text(text)
    with pytest.raises(PoolError, match=needle) as err:
        open_pool(str(tmp_path / name), opts())
    assert name in str(err.value)


def test_stdin_paths(workspace):
    paths = [str(p) for p, _ in workspace.images.values()]
    pool = open_pool("-", opts(), stdin=io.StringIO("\n" + "\n".join(paths[:3]) + "\n\n"))
    assert pool.ids == paths[:3]
    with pytest.raises(PoolError, match="holds no images"):
        open_pool("-", opts(), stdin=io.StringIO(""))


def test_tensor_files(tmp_path):
    x = torch.arange(24, dtype=torch.float32).view(4, 1, 2, 3)
    torch.save(x, tmp_path / "a.pt")
    torch.save({"x": x, "y": torch.tensor([0, 1, -1, 2]), "ids": ["w", "x", "y", "z"]}, tmp_path / "b.pt")
    np.save(tmp_path / "c.npy", x.numpy())
    np.savez(tmp_path / "d.npz", x=x.numpy(), ids=np.array([10, 11, 12, 13]))
    np.savez(tmp_path / "e.npz", x.numpy())  # one unnamed array
    a, b, c, d, e = (open_pool(str(tmp_path / n), opts()) for n in ("a.pt", "b.pt", "c.npy", "d.npz", "e.npz"))
    assert a.ids == c.ids == e.ids == ["0", "1", "2", "3"] and not a.has_labels
    assert b.ids == ["w", "x", "y", "z"] and b.has_labels and b[2].label == -1
    assert d.ids == ["10", "11", "12", "13"]
    for pool in (a, b, c, d, e):
        assert torch.equal(pool[1].input, x[1])  # tensor pools are model inputs as they are


@pytest.mark.parametrize("data, needle", [
    ({"y": torch.zeros(2)}, "must hold a tensor or a dict with 'x'"),
    ({"x": torch.zeros(3, 2), "y": torch.zeros(2, dtype=torch.long)}, "'y' has 2 entries but 'x' has 3"),
    ({"x": torch.zeros(2, 2), "y": torch.zeros(2)}, "integer class indices"),
    ({"x": torch.zeros(2, 2), "ids": ["a", "a"]}, "has the id 'a' twice"),
    ({"x": torch.zeros(0, 2)}, "holds no examples"),
])
def test_tensor_file_errors(tmp_path, data, needle):
    torch.save(data, tmp_path / "p.pt")
    with pytest.raises(PoolError, match=needle):
        open_pool(str(tmp_path / "p.pt"), opts())


def test_unknown_pool_kinds(tmp_path):
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(PoolError, match="is not a folder, an image"):
        open_pool(str(tmp_path / "notes.md"), opts())
    (tmp_path / "notes.txt").write_text("x")  # a text pool, which needs the model's tokenizer
    with pytest.raises(PoolError, match="needs a tokenizer: pass --model a Hugging Face model directory"):
        open_pool(str(tmp_path / "notes.txt"), opts())
    with pytest.raises(PoolError, match="does not exist"):
        open_pool(str(tmp_path / "missing"), opts())
    with pytest.raises(ConfigError, match="--labels-from-folders needs a directory"):
        open_pool(str(tmp_path / "notes.txt"), opts(labels_from_folders=True))


def test_channels_follow_the_model(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    img = Image.fromarray(rgb, "RGB")
    t1 = image_transform(Transform(), 1)
    gray = t1.to_float(t1(img))
    assert gray.shape == (1, 5, 7)
    assert torch.allclose(gray[0], torch.from_numpy(np.asarray(img.convert("L"), np.float32) / 255))
    three = image_transform(Transform(), 3)(img.convert("L"))  # grayscale file, colour model
    assert three.shape == (3, 5, 7) and torch.equal(three[0], three[2])
    forced = image_transform(Transform(grayscale=True), 3)(img)
    assert torch.equal(forced[0], forced[1])
    with pytest.raises(PoolError, match="5-channel inputs"):
        image_transform(Transform(), 5)
    with pytest.raises(ConfigError, match="transform.normalize has 3 mean/std values"):
        image_transform(NORM, 1)


def test_resize_crop_normalize_values():
    arr = np.random.default_rng(2).integers(0, 256, (10, 20, 3), dtype=np.uint8)
    img = Image.fromarray(arr, "RGB")
    t = Transform(resize=8, center_crop=[6, 4],
                  normalize={"mean": [0.1, 0.2, 0.3], "std": [0.5, 0.25, 0.2]})
    tf = image_transform(t, 3)
    stored = tf(img)  # what the DataLoader's workers hand over: uint8
    assert stored.dtype == torch.uint8
    out = tf.to_float(stored[None])[0]
    resized = np.asarray(img.resize((16, 8), Image.BILINEAR), np.float32) / 255  # shorter side 8
    crop = resized[1:7, 6:10]                                                    # centre 6x4
    expected = (torch.from_numpy(crop).permute(2, 0, 1) - torch.tensor([0.1, 0.2, 0.3]).view(3, 1, 1)) \
        / torch.tensor([0.5, 0.25, 0.2]).view(3, 1, 1)
    assert out.shape == (3, 6, 4) and torch.allclose(out, expected, atol=1e-6)


def test_unreadable_images_become_errors_not_exceptions(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"nope")
    Image.new("RGB", (3, 3)).save(tmp_path / "good.png")
    Image.new("RGB", (4, 4)).save(tmp_path / "other.png")
    pool = open_pool(str(tmp_path), opts(transform=Transform()))
    batch = collate([pool[i] for i in range(3)])
    assert batch.ids == ["good.png"]  # other.png has another shape, bad.png cannot be read
    messages = dict(batch.errors)
    assert "cannot read image" in messages["bad.png"] and "transform.resize" in messages["other.png"]


def test_in_memory_tensor_pool():
    pool = tensor_pool(np.zeros((3, 2), np.float32), [1, 0, 2], ids=["p", "q", "r"])
    batch = collate([pool[i] for i in range(3)])
    assert batch.ids == ["p", "q", "r"] and batch.labels.tolist() == [1, 0, 2]
    assert batch.inputs.shape == (3, 2)

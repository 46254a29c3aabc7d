"""Settings: defaults < YAML < flags; unknown keys and wrong types name the key."""
import os

import pytest
import torch

from alcli.errors import ConfigError
from alcli.files.config import KEYS, Settings, Transform, duration_seconds, load_settings
from alcli.score.runner import default_workers


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults():
    s = load_settings()
    assert (s.strategy, s.method, s.batch_size, s.device, s.workers, s.format) == ("egl", "auto", 64, "auto", None, "csv")
    # workers: none on the CPU (they would compete with the compute threads), one per core on CUDA
    assert default_workers(torch.device("cpu")) == 0
    assert default_workers(torch.device("cuda")) == min(os.cpu_count(), 8)
    assert s.transform == Transform() and s.layers is None and s.arch_kwargs == {}


def test_yaml_overrides_defaults_and_flags_override_yaml(tmp_path):
    cfg = write(tmp_path, """
        model: runs/ckpt.pt
        arch: torchvision:resnet18
        arch_kwargs: {num_classes: 10}
        transform: {resize: 36, center_crop: 32, grayscale: false,
                    normalize: {mean: [0.49, 0.48, 0.45], std: [0.25, 0.24, 0.26]}}
        strategy: gradnorm
        batch_size: 16
        layers: fc
    """.replace("\n        ", "\n"))
    s = load_settings(cfg, {"batch_size": 8, "strategy": None, "seed": 5})
    assert s.model == str(tmp_path / "runs/ckpt.pt") and s.arch_kwargs == {"num_classes": 10}
    assert s.transform.resize == 36 and s.transform.center_crop == 32
    assert s.transform.normalize == {"mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26]}
    assert s.strategy == "gradnorm"   # None means "flag not given"
    assert s.batch_size == 8 and s.seed == 5
    assert s.layers == ["fc"]          # a single pattern becomes a list


def test_every_option_has_a_key():
    assert set(KEYS) == {f for f in Settings.__dataclass_fields__ if f != "sources"}
    for flag_key in ("trust_checkpoint", "labels_from_folders", "top_classes", "batch_size", "budget"):
        assert flag_key in KEYS


@pytest.mark.parametrize("text, needle", [
    ("batch_sise: 3", "key 'batch_sise' in"),
    ("batch_size: 0", "key 'batch_size'"),
    ("batch_size: many", "key 'batch_size'"),
    ("batch_size: true", "key 'batch_size'"),
    ("strategy: best", "key 'strategy'"),
    ("method: fast", "key 'method'"),
    ("device: gpu", "key 'device'"),
    ("trust_checkpoint: yes please", "key 'trust_checkpoint'"),
    ("arch_kwargs: [1, 2]", "key 'arch_kwargs'"),
    ("layers: []", "key 'layers'"),
    ("transform: {resize: [1, 2, 3]}", "key 'transform.resize'"),
    ("transform: {colour: red}", "unknown key 'colour'"),
    ("transform: {normalize: {mean: [0.5]}}", "key 'transform.normalize'"),
    ("transform: {normalize: {mean: [0.5, 0.5], std: [1]}}", "key 'transform.normalize'"),
    ("transform: {normalize: {mean: [0.5], std: [0]}}", "key 'transform.normalize'"),
    ("top_classes: -1", "key 'top_classes'"),
    ("checkpoint_every: 0", "key 'checkpoint_every'"),
    ("checkpoint_every: 10 parsecs", "key 'checkpoint_every'"),
    ("checkpoint_every: 0s", "key 'checkpoint_every'"),
    ("checkpoint_every: true", "key 'checkpoint_every'"),
    ("- a list", "must hold a mapping"),
    ("model: [unclosed", "not valid YAML at line"),
])
def test_bad_config_values_name_the_key_and_file(tmp_path, text, needle):
    cfg = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert needle in str(err.value) and str(cfg) in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_flag_values_name_the_option():
    with pytest.raises(ConfigError, match="option --batch-size"):
        load_settings(None, {"batch_size": -1})
    with pytest.raises(ConfigError, match="option --top-classes"):
        load_settings(None, {"top_classes": -1})


def test_checkpoint_every_takes_examples_or_a_duration():
    assert Settings().checkpoint_every == "30s"
    for given, kept, seconds in (("2048", 2048, None), (64, 64, None), ("30s", "30s", 30.0),
                                 ("5m", "5m", 300.0), ("1.5 h", "1.5 h", 5400.0),
                                 ("250ms", "250ms", 0.25)):
        value = load_settings(None, {"checkpoint_every": given}).checkpoint_every
        assert value == kept
        if seconds is not None:
            assert duration_seconds(value) == seconds
    with pytest.raises(ConfigError, match="option --checkpoint-every.*duration"):
        load_settings(None, {"checkpoint_every": "-3s"})


def test_python_keywords_are_named_as_arguments():
    with pytest.raises(ConfigError, match="argument batch_sise= is not a known setting"):
        load_settings(None, {"batch_sise": 2}, flag_names=False)


def test_missing_and_empty_config(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")
    assert load_settings(write(tmp_path, "")) == Settings()


def test_size_forms(tmp_path):
    s = load_settings(write(tmp_path, "transform: {resize: [40, 30], center_crop: 28}\n"))
    assert s.transform.resize == [40, 30] and s.transform.center_crop == 28


def test_config_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    (tmp_path / "cfg").mkdir()
    cfg = write(tmp_path / "cfg", "model: ../m.pt\npool: imgs\noutput: '-'\nexclude: [a.txt, /abs/b.txt]\n"
                "contact_sheet: out/sheet.png\nembeddings_file: e.npz\nimage_dir: imgs\nscores: s.csv\n")
    monkeypatch.chdir(tmp_path / "cfg")  # even from the config's own folder: `cfg/..` is normalised
    s = load_settings("c.yaml")
    assert (s.model, s.pool, s.output) == ("../m.pt", "imgs", "-")
    monkeypatch.chdir(tmp_path)
    s = load_settings("cfg/c.yaml", {"scores": "mine.csv"})
    assert (s.model, s.pool, s.output) == ("m.pt", "cfg/imgs", "-")
    assert s.exclude == ["cfg/a.txt", "/abs/b.txt"]
    assert (s.contact_sheet, s.embeddings_file, s.image_dir) == ("cfg/out/sheet.png", "cfg/e.npz", "cfg/imgs")
    assert s.scores == "mine.csv"  # flags stay relative to the working directory


def test_a_config_typo_gets_did_you_mean(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, "batch_sise: 3\n"))
    assert "did you mean 'batch_size'?" in str(err.value) and "strategy" not in str(err.value)


def test_integers_beyond_the_platform_size_are_a_config_error():
    with pytest.raises(ConfigError, match="batch-size must be an integer <="):
        load_settings(None, {"batch_size": 99999999999999999999})

"""Hugging Face end to end: `alcli score POOL -m DIR` with a save_pretrained directory (config.json,
model.safetensors, tokenizer / image processor), text pools (.txt, .jsonl, .csv) and an image
pool, checked against a float64 per-example loop in which every text is tokenized alone, without
padding (so the batch's padding and attention masks are checked too)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from typer.testing import CliRunner

from cli_errors import assert_one_error
from conftest import score_in as cli
from conftest import parse_csv

pytest.importorskip("transformers")
import hf_models  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
TEXTS = ["the cat sat on the mat", "a dog ran fast", "big red bird flew away and then stopped",
         "small", "the blue bird sat on a big mat and then flew away"]
MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]


@pytest.fixture(scope="module")
def hf_ws(tmp_path_factory):
    from transformers import ViTImageProcessor
    root = tmp_path_factory.mktemp("hf_ws")
    torch.manual_seed(0)
    for name in ("bert", "gpt2", "distilbert"):
        tok = hf_models.tokenizer(root / name, token_types=name == "bert")
        getattr(hf_models, name)(len(hf_models.VOCAB)).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    hf_models.vit().save_pretrained(root / "vit")
    ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=MEAN, image_std=STD).save_pretrained(root / "vit")
    (root / "texts.txt").write_text("\n".join(TEXTS[:3]) + "\n\n" + "\n".join(TEXTS[3:]) + "\n")
    with open(root / "texts.jsonl", "w") as f:
        for i, text in enumerate(TEXTS):
            f.write(json.dumps({"id": f"t{i}", "text": text, "label": i % 3}) + "\n")
    (root / "texts.csv").write_text("id,sentence\n" + "".join(f'c{i},"{t}"\n' for i, t in enumerate(TEXTS)))
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.png")
    return root


def oracle_model(directory: Path):
    """The saved model read back independently, in float64."""
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification
    auto = AutoModelForImageClassification if directory.name == "vit" else AutoModelForSequenceClassification
    return auto.from_pretrained(directory, local_files_only=True).double().eval()


def tokens_alone(directory: Path, text: str, max_length: int = 64) -> dict:
    from transformers import BertTokenizerFast
    tok = BertTokenizerFast.from_pretrained(directory, local_files_only=True)
    return dict(tok([text], truncation=True, max_length=max_length, return_tensors="pt"))


def egl_oracle(model, inputs: dict | torch.Tensor) -> tuple[float, float]:
    """(egl score, confidence) of one example: sum_c p(c) ||d CE(logits, c) / d params||."""
    params = [p for p in model.parameters()]
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    p = torch.softmax(out.logits, 1)[0]
    norms = []
    for c in range(p.shape[0]):
        loss = F.cross_entropy(out.logits, torch.tensor([c]))
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        norms.append(torch.sqrt(sum(g.square().sum() for g in grads if g is not None)))
    return float(sum(p[c] * norms[c] for c in range(p.shape[0])).detach()), float(p.max().detach())


@pytest.mark.parametrize("name", ["bert", "gpt2", "distilbert"])
def test_text_pool_scored_with_the_directorys_model_and_tokenizer(hf_ws, name):
    result = cli(hf_ws, "texts.txt", "-m", name, "-b", "3", "-s", "egl")
    # the K classes go through one vmapped backward: no op in it may lack a batching rule (torch's
    # "performance drop" warning; the fused attention kernels' backwards have none)
    assert "batching rule" not in result.stderr
    rows = parse_csv(result.stdout)
    ids = {"1": TEXTS[0], "2": TEXTS[1], "3": TEXTS[2], "5": TEXTS[3], "6": TEXTS[4]}  # line numbers
    assert {r["id"] for r in rows} == set(ids)
    model = oracle_model(hf_ws / name)
    for r in rows:
        score, conf = egl_oracle(model, tokens_alone(hf_ws / name, ids[r["id"]]))
        assert float(r["score"]) == pytest.approx(score, rel=1e-4), r["id"]
        assert float(r["confidence"]) == pytest.approx(conf, rel=1e-5)


def test_jsonl_labels_and_ids_truncation_at_max_length(hf_ws):
    rows = parse_csv(cli(hf_ws, "texts.jsonl", "-m", "bert", "-b", "2", "-s", "gradnorm",
                         "--max-length", "4").stdout)
    model = oracle_model(hf_ws / "bert")
    params = list(model.parameters())
    assert {r["id"] for r in rows} == {f"t{i}" for i in range(5)}
    for r in rows:
        i = int(r["id"][1:])
        assert int(r["label"]) == i % 3
        inputs = tokens_alone(hf_ws / "bert", TEXTS[i], max_length=4)
        assert inputs["input_ids"].shape[1] <= 4
        loss = F.cross_entropy(model(**inputs).logits, torch.tensor([i % 3]))
        norm = torch.sqrt(sum(g.square().sum() for g in torch.autograd.grad(loss, params)))
        assert float(r["score"]) == pytest.approx(float(norm), rel=1e-4)
        assert float(r["loss"]) == pytest.approx(float(loss.detach()), rel=1e-4)


def test_csv_text_column_and_every_engine_method_agree(hf_ws):
    base = {r["id"]: float(r["score"]) for r in parse_csv(cli(hf_ws, "texts.csv", "-m", "bert",
                                                              "--text-column", "sentence").stdout)}
    assert set(base) == {f"c{i}" for i in range(5)}
    loop = {r["id"]: float(r["score"]) for r in parse_csv(cli(
        hf_ws, "texts.csv", "-m", "bert", "--text-column", "sentence", "--method", "loop").stdout)}
    assert loop == pytest.approx(base, rel=1e-5)
    missing = cli(hf_ws, "texts.csv", "-m", "bert", ok=False)  # no 'text' column, no 'path' column
    assert_one_error(missing, "no 'path' column", "a csv without the text column")


def test_image_pool_uses_the_image_processors_size_and_mean_std(hf_ws):
    rows = parse_csv(cli(hf_ws, "images", "-m", "vit", "-b", "2", "-s", "egl").stdout)
    model = oracle_model(hf_ws / "vit")
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    assert len(rows) == 5
    for r in rows:
        pixels = torch.from_numpy(np.array(Image.open(hf_ws / "images" / r["id"]))).permute(2, 0, 1)
        x = ((pixels.double() / 255 - mean) / std)[None]
        score, conf = egl_oracle(model, x)
        assert float(r["score"]) == pytest.approx(score, rel=1e-4), r["id"]


def test_hugging_face_errors_are_one_sentence(hf_ws, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.txt").write_text("hello\n")  # the pool first: a missing one is said before the model
    assert_one_error(cli(tmp_path, "x.txt", "-m", "empty", ok=False), "holds no config.json",
                     "a directory that is not a model")
    torch.save(torch.nn.Linear(2, 3).state_dict(), tmp_path / "m.pt")
    assert_one_error(cli(tmp_path, "x.txt", "-m", "m.pt", "--arch", "torch.nn:Linear", "--arch-kwargs",
                         '{"in_features": 2, "out_features": 3}', ok=False),
                     "needs a tokenizer", "a text pool without a Hugging Face model")
    assert_one_error(cli(hf_ws, "texts.txt", "-m", "vit", ok=False), "holds none",
                     "a text pool with a model directory without a tokenizer")
    assert_one_error(cli(hf_ws, "texts.txt", "-m", "bert", "--arch", "timm:resnet18", ok=False),
                     "leave out --arch", "--arch with a model directory")
    (tmp_path / "bad.jsonl").write_text('{"text": "a cat"}\n{"id": "x"}\n')
    assert_one_error(cli(tmp_path, tmp_path / "bad.jsonl", "-m", hf_ws / "bert", ok=False),
                     "line 2 has no text in column 'text'", "a jsonl line without text")


def test_subprocess_offline_and_without_transformers(hf_ws):
    """A real process (HF_HUB_OFFLINE set by alcli itself); and without the package, one sentence."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HF_HUB_OFFLINE", None)
    proc = subprocess.run([sys.executable, "-m", "alcli", "score", "texts.txt", "-m", "bert", "-q",
                           "-s", "entropy", "-o", "-"], cwd=hf_ws, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(parse_csv(proc.stdout)) == 5 and proc.stderr == ""
    blocked = "import sys; sys.modules['transformers'] = None; from alcli.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", blocked, "score", "texts.txt", "-m", "bert", "-q"],
                          cwd=hf_ws, env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("alcli: error: Hugging Face model directories need the "
                                   "transformers package; pip install 'alcli[hf]'")


def test_text_batches_are_padded_to_a_multiple_of_8_within_max_length(tmp_path):
    """Fewer different lengths for the engine (each new one costs its layout probe); never past
    max_length; the extra columns are padding with a zero attention mask."""
    from alcli.files.hf import Tokenize
    tok = hf_models.tokenizer(tmp_path / "tok")
    texts = ["the cat sat", "a dog ran fast and then stopped"]  # 5 and 9 tokens with [CLS] [SEP]
    enc = Tokenize(tok, 64, None)(texts)
    plain = tok(texts, padding="longest", return_tensors="pt")
    assert plain["input_ids"].shape[1] == 9 and enc["input_ids"].shape[1] == 16
    assert torch.equal(enc["input_ids"][:, :9], plain["input_ids"])
    assert (enc["input_ids"][:, 9:] == tok.pad_token_id).all() and (enc["attention_mask"][:, 9:] == 0).all()
    assert Tokenize(tok, 10, None)(texts)["input_ids"].shape[1] == 10  # capped at max_length
    assert Tokenize(tok, 64, None)(["one two three four five six"])["input_ids"].shape[1] == 8

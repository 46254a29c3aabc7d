"""Writes the Label Studio exports beside this file, for tests/test_names.py. Not a test.

Each `*-json.json` is a project's JSON export ("all tasks", so an unlabeled task and one whose
annotation was cancelled are in it), written here in the shape Label Studio 1.x writes; the
JSON-MIN, CSV and TSV exports are made from it by Label Studio's own converter
(`pip install label-studio-converter`, the library Label Studio exports with):

    python tests/data/labelstudio/make_exports.py

Two projects: `images` (tasks from `alcli select -f labelstudio` on the tests' workspace pool,
one imported by hand with only its image) and `texts` (tasks of the text pool texts.txt, whose
ids are line numbers, as Label Studio's task ids are: a match by task id would exclude the wrong
rows; one task imported by hand with only its text).
"""
import json
import tempfile
from pathlib import Path

from label_studio_converter import Converter

HERE = Path(__file__).resolve().parent
STAMP = "2026-01-05T10:00:00.000000Z"
TEXTS = ["the cat sat on the mat", "a dog ran fast", "big red bird flew away and then stopped",
         "small", "the blue bird sat on a big mat and then flew away",
         "the big dog and the small cat ran away fast and then the red bird flew on and on",
         "a slow cat", "the bird sat"]
CONFIG = """<View>
  <{tag} name="{obj}" value="${obj}"/>
  <Choices name="label" toName="{obj}">{choices}</Choices>
</View>"""


def annotation(n: int, task: int, choice: str, cancelled: bool = False, who: int = 1) -> dict:
    return {"id": n, "completed_by": who,
            "result": [] if cancelled else [{"value": {"choices": [choice]}, "id": f"r{n}",
                                             "from_name": "label", "to_name": "", "type": "choices",
                                             "origin": "manual"}],
            "was_cancelled": cancelled, "ground_truth": False, "created_at": STAMP,
            "updated_at": STAMP, "draft_created_at": None, "lead_time": 4.5 + n,
            "prediction": {}, "result_count": 0, "unique_id": f"u{n}", "import_id": None,
            "last_action": None, "bulk_created": False, "task": task, "project": 1,
            "updated_by": who, "parent_prediction": None, "parent_annotation": None,
            "last_created_by": None}


def task(task_id: int, data: dict, annotations: list[dict], obj: str) -> dict:
    for a in annotations:
        for r in a["result"]:
            r["to_name"] = obj
    return {"id": task_id, "annotations": annotations, "file_upload": None, "drafts": [],
            "predictions": [], "data": data, "meta": {}, "created_at": STAMP,
            "updated_at": STAMP, "inner_id": task_id, "total_annotations": len(annotations),
            "cancelled_annotations": sum(a["was_cancelled"] for a in annotations),
            "total_predictions": 0, "comment_count": 0, "unresolved_comment_count": 0,
            "last_comment_updated_at": None, "project": 1, "updated_by": 1, "comment_authors": []}


def alcli_data(obj: str, value: str, alcli_id: str, rank: int, pred: str) -> dict:
    return {obj: value, "alcli_id": alcli_id, "alcli_rank": rank, "alcli_score": 1.0 / rank,
            "alcli_pred": pred}


def images() -> list[dict]:
    d = lambda i, r, p: alcli_data("image", i, i, r, p)  # noqa: E731 - no --image-root: image = id
    return [task(101, d("a/img00.png", 1, "a"), [annotation(1, 101, "a")], "image"),
            task(102, d("b/img01.png", 2, "c"), [annotation(2, 102, "b"),
                                                 annotation(3, 102, "b", who=2)], "image"),
            task(103, d("c/img02.png", 3, "c"), [], "image"),
            task(104, d("a/img03.png", 4, "b"), [annotation(4, 104, "", cancelled=True)], "image"),
            task(105, {"image": "b/img04.png"}, [annotation(5, 105, "b")], "image"),
            task(106, d("c/img05.jpg", 6, "a"), [annotation(6, 106, "c")], "image")]


def texts() -> list[dict]:
    d = lambda n, r: alcli_data("text", TEXTS[n - 1], str(n), r, "sports")  # noqa: E731
    return [task(1, d(4, 1), [annotation(1, 1, "science")], "text"),
            task(2, d(7, 2), [annotation(2, 2, "sports")], "text"),
            task(3, d(1, 3), [], "text"),
            task(4, d(2, 4), [annotation(3, 4, "", cancelled=True)], "text"),
            task(5, {"text": TEXTS[5]}, [annotation(4, 5, "politics")], "text"),
            task(6, d(8, 5), [annotation(5, 6, "sports"), annotation(6, 6, "science", who=2)],
                 "text")]


def main() -> None:
    (HERE / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    for name, tasks, tag, obj, choices in (("images", images(), "Image", "image", "abc"),
                                           ("texts", texts(), "Text", "text",
                                            ["sports", "politics", "science"])):
        full = HERE / f"{name}-json.json"
        full.write_text(json.dumps(tasks, indent=2, ensure_ascii=False) + "\n")
        config = CONFIG.format(tag=tag, obj=obj,
                               choices="".join(f'<Choice value="{c}"/>' for c in choices))
        conv = Converter(config=config, project_dir=None, download_resources=False)
        with tempfile.TemporaryDirectory() as tmp:
            for fmt, out in (("JSON_MIN", f"{name}-json-min.json"), ("CSV", f"{name}.csv"),
                             ("TSV", f"{name}.tsv")):
                conv.convert(str(full), tmp, fmt, is_dir=False)
                made = Path(tmp) / ("result.json" if fmt == "JSON_MIN" else "result.csv")
                (HERE / out).write_bytes(made.read_bytes())
                made.unlink()


if __name__ == "__main__":
    main()

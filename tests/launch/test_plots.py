"""loss.png read back: two panels, the smoothed loss over the faint raw one, accuracies on a 0-1 axis."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from launch.plots import describe_run, plot_loss, smooth


def _colour_share(image: np.ndarray, rgb: tuple[int, int, int], tol: int = 40) -> float:
    pixels = (image[..., :3] * 255).astype(int)
    return float((np.abs(pixels - np.array(rgb)).sum(-1) < tol).mean())


@pytest.fixture
def run_dir(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for step in range(1, 201):
        record = {"step": step, "loss": 11.0 * np.exp(-step / 80) + 4 + rng.normal(0, 0.4)}
        if step % 50 == 0:
            record.update(eval_mlm_accuracy=0.05 + step / 2000, eval_nsp_accuracy=0.5 + step / 1000)
        lines.append(json.dumps(record))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"model": {"preset": "tiny", "fields": {}}, "schedule": {"total_steps": 200}, "data": {"global_batch_size": 32}}))
    return tmp_path


def test_smoothing_is_debiased_and_follows_the_trend():
    assert smooth([5.0, 5.0, 5.0]) == pytest.approx([5.0, 5.0, 5.0])  # no pull towards 0 at the start
    noisy = [10 - i / 10 + (1 if i % 2 else -1) for i in range(100)]
    smoothed = smooth(noisy)
    assert np.std(np.diff(smoothed)) < 0.2 * np.std(np.diff(noisy))
    # The window follows the curve's length: on 60 points it stays near the trend's end, where a fixed
    # 0.9 (ten points) lagged by 0.9 here.
    falling = [10 - i / 10 for i in range(60)]
    assert abs(smooth(falling)[-1] - falling[-1]) < 0.25 < abs(smooth(falling, 0.9)[-1] - falling[-1])


def test_loss_png_has_both_panels_and_is_titled_with_what_was_trained(run_dir, tmp_path):
    import matplotlib.image

    png = plot_loss(run_dir, tmp_path / "out" / "loss.png")
    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 600 and image.shape[1] >= 800  # 7x6 inches at 120 dpi
    assert image[..., :3].std() > 0.05, "blank image"
    assert _colour_share(image, (31, 119, 180)) > 0.002  # the smoothed loss (tab:blue)
    # The raw loss, faint behind it: tab:blue at alpha 0.3 over white (0.0003 of the pixels without it).
    assert _colour_share(image, (188, 214, 233), tol=30) > 0.0015
    assert _colour_share(image, (255, 127, 14)) > 0.0005  # held-out MLM accuracy (tab:orange)
    assert _colour_share(image, (44, 160, 44)) > 0.0005  # held-out NSP accuracy (tab:green)
    # The title is what was trained: the default draws the same pixels as that text given as the title, and
    # another title draws other pixels (so the title is drawn at all).
    assert describe_run(run_dir) == "BERT tiny (L2/H64), 200 steps x 32 sequences"
    said = matplotlib.image.imread(plot_loss(run_dir, tmp_path / "said.png",
                                             title="pre-training: BERT tiny (L2/H64), 200 steps x 32 sequences"))
    other = matplotlib.image.imread(plot_loss(run_dir, tmp_path / "other.png", title="pre-training: something else"))
    assert np.array_equal(image, said) and not np.array_equal(image, other)


def test_accuracy_axis_is_zero_to_one(run_dir, tmp_path):
    """A 0.05 -> 0.15 MLM accuracy must sit low in its panel, not stretched to its full height."""
    import matplotlib.image

    image = matplotlib.image.imread(plot_loss(run_dir, tmp_path / "loss.png"))
    orange = np.abs((image[..., :3] * 255).astype(int) - [255, 127, 14]).sum(-1) < 40
    rows = np.nonzero(orange)[0]  # one entry per orange pixel: the curve outweighs its legend marker
    assert rows.size and np.median(rows) > image.shape[0] * 0.8  # near the bottom of the lower panel

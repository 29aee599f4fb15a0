"""What a fine-tuning run shows while it trains: TensorBoard scalars, a log history, a learning curve.

`TrainingHistory` is fed by the training loop: `step(...)` per optimizer step (loss, lr) and
`epoch(...)` per epoch with the dev metrics of that epoch's evaluation. It writes, in OUT/:
- `tensorboard/`: `train/loss`, `train/lr` per step, `dev/<metric>` (`test/<metric>` for a labelled test
  split) and `train/epoch_loss` per epoch;
- `log_history.json`: one record per epoch (epoch, step, train loss, lr, dev metrics), rewritten
  atomically after every epoch, like transformers' `trainer_state.json` `log_history`;
- `learning_curve.png`: the smoothed training loss per step and the dev metric per epoch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.atomic_write import write_text_atomic


class TrainingHistory:
    def __init__(self, out: Path, metric: str, tensorboard: bool = True) -> None:
        self.out, self.metric = Path(out), metric
        self.steps: list[tuple[int, float]] = []
        self.records: list[dict[str, Any]] = []
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tensorboard"))

    def step(self, step: int, loss: float, lr: float) -> None:
        self.steps.append((step, loss))
        if self.writer is not None:
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/lr", lr, step)

    def epoch(self, epoch: int, step: int, train_loss: float, lr: float, dev: dict[str, float]) -> None:
        numbers = {k: v for k, v in dev.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.records.append({"epoch": epoch, "step": step, "train_loss": train_loss, "lr": lr, **numbers})
        if self.writer is not None:
            self.writer.add_scalar("train/epoch_loss", train_loss, step)
            for key, value in numbers.items():
                if not key.endswith("eval_examples"):
                    # A labelled test split's scores (`test_f1`) are test's, not dev's: never a dev curve to pick by.
                    tag = f"test/{key.removeprefix('test_')}" if key.startswith("test_") else f"dev/{key}"
                    self.writer.add_scalar(tag, value, step)
            self.writer.flush()
        write_text_atomic(self.out / "log_history.json", json.dumps(self.records, indent=2) + "\n", durable=False)

    def close(self) -> Path | None:
        if self.writer is not None:
            self.writer.close()
        return self.plot() if self.steps else None

    def plot(self) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from launch.plots import smooth

        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        steps, losses = zip(*self.steps)
        ax.plot(steps, losses, lw=0.8, alpha=0.3, color="tab:blue")
        ax.plot(steps, smooth(losses), lw=1.8, color="tab:blue", label="train loss (smoothed)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("train loss")
        ax.grid(alpha=0.3)
        handles = ax.get_lines()[1:]
        scored = [r for r in self.records if isinstance(r.get(self.metric), (int, float))]
        if scored:
            dev = ax.twinx()
            handles += dev.plot([r["step"] for r in scored], [r[self.metric] for r in scored], "o-",
                                color="tab:orange", label=f"dev {self.metric} (per epoch)")
            dev.set_ylabel(f"dev {self.metric}")
            values = [r[self.metric] for r in scored]
            dev.set_ylim(min(0.0, min(values)), max(1.0, max(values) * 1.05))  # scores in [0, 1], or in percent
        ax.legend(handles=handles, loc="center right", frameon=False)
        ax.set_title(f"fine-tuning: {self.out.name}", fontsize="medium")
        fig.tight_layout()
        png = self.out / "learning_curve.png"
        fig.savefig(png)
        plt.close(fig)
        return png

"""Per-step metrics on rank 0: `RUN/metrics.jsonl`, TensorBoard, a progress bar and a log line.

metrics.jsonl holds one JSON object per optimizer step logged: at least `step` and `loss` (a
full-precision float, so two runs can be compared bit for bit), plus mlm/nsp accuracy, lr,
grad_norm, loss_scale, sequences/s, tokens/s, mfu (when a peak is configured), eta_s, and the held-out
MLM accuracy on evaluation steps. On resume the file is cut back to the checkpoint's step (a last
line torn by a crash is dropped), so it always describes one consistent run.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from pipeline.atomic_write import write_text_atomic

log = logging.getLogger(__name__)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl. A last line cut short (a crash or a full disk mid-write) is
    dropped with a warning; any other line that is not a JSON object names the file and line."""
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if not any(rest.strip() for rest in lines[number:]):
                log.warning("%s: its last line was cut short by an interrupted write; dropped it", path)
                break
            raise ValueError(f"{path} line {number} is not JSON ({err.msg}); remove that line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path} line {number} is not a JSON object; remove that line")
        records.append(record)
    return records


def truncate_after(path: Path, step: int) -> None:
    """Drop records of steps after `step` (they belong to work lost when the run stopped), and a torn last
    line; the file is replaced atomically, so a crash here never loses the history."""
    if not path.is_file():
        return
    keep = [r for r in read_records(path) if r.get("step", 0) <= step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass a run directory written by `bertpipe pretrain --out`")
    return read_records(path)


# bf16 dense tensor-core peaks from the vendors' spec sheets (TFLOP/s, without sparsity).
# More specific names first: the first key found in the device name wins (an H100 PCIe is not an SXM).
SPEC_PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H200": 989.0, "H800": 989.0,
                    "A100": 312.0, "A10": 125.0, "L40S": 362.0, "L40": 181.0, "L4": 121.0}


def spec_peak_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of a GPU from its name (`torch.cuda.get_device_name()`), None if unknown."""
    return next((v for k, v in SPEC_PEAK_TFLOPS.items() if k in device_name), None)


def flops_per_token(num_params: int, layers: int, hidden: int, seq_len: float) -> float:
    """Training FLOPs per token: 6N for the matmuls (fwd + bwd) + 12 L H S for attention (PaLM, app. B)."""
    return 6.0 * num_params + 12.0 * layers * hidden * seq_len


class MetricsWriter:
    """Writes on rank 0 only; other ranks get a writer that does nothing."""

    def __init__(self, run_dir: Path, *, enabled: bool, tensorboard: bool, progress_bar: bool,
                 start_step: int, total_steps: int) -> None:
        self.enabled = enabled
        self._file = None
        self._tb = None
        self._bar = None
        if not enabled:
            return
        path = run_dir / "metrics.jsonl"
        truncate_after(path, start_step)
        self._file = open(path, "a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start_step + 1)
        if progress_bar and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        if not math.isfinite(record["loss"]):
            clean["loss"] = str(record["loss"])  # JSON has no NaN; keep it visible, not silently null
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        step = record["step"]
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"pretrain/{key}", value, step)
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record.get('lr', 0):.2e}")
        else:
            extra = "".join(f" {name} {record[key]:.4f}" for key, name in
                            (("eval_mlm_accuracy", "eval_mlm_acc"), ("eval_mlm_accuracy_at_mask", "at_[MASK]"))
                            if key in record)
            log.info("step %d loss %.4f mlm_acc %.4f nsp_acc %.4f lr %.3e %.1f seq/s eta %.0fs%s", step,
                     record["loss"], record.get("mlm_accuracy", float("nan")), record.get("nsp_accuracy", float("nan")),
                     record.get("lr", float("nan")), record.get("sequences_per_s", 0.0), record.get("eta_s", 0.0), extra)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()

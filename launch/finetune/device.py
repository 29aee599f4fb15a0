"""The one device picker of fine-tuning and feature extraction (`--device`)."""

from __future__ import annotations

import torch


def pick_device(name: str) -> torch.device:
    """auto: CUDA when a device is visible, else CPU; cpu; cuda or cuda:N (refused without CUDA)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} was asked for but no CUDA device is visible; use --device cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device {name!r} is not a device ({err}); use auto, cpu or cuda[:N]") from None

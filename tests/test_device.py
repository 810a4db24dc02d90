"""`--device` resolution (perencode.device)."""

import pytest
import torch

from perencode.device import resolve_device
from perencode.errors import UserError


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA device"):
            resolve_device("cuda")


def test_cuda_index_beyond_device_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(UserError, match=r"only 1 CUDA device\(s\) \(cuda:0..cuda:0\)"):
        resolve_device("cuda:3")

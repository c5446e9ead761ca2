"""train.precision: GPU-only faster arithmetic, opt-in, recorded; refused on a CPU in one line."""
import json

import pytest
import torch

from groupfel.emulator.training import PRECISIONS, autocast, set_precision
from groupfel.experiments.cli import main

from conftest import write_toml


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_a_cpu_run_refuses_gpu_precision_in_one_line_before_any_work(tmp_path, tiny_dict, capsys, precision):
    tiny_dict["train"]["precision"] = precision
    cfg = write_toml(tmp_path, tiny_dict, "c.toml")
    assert main(["run", str(cfg), "--output", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("groupfel: error: train.precision:") and "\n" not in err and "fp32" in err
    assert not (tmp_path / "out").exists()


def test_the_modes_set_tf32_and_autocast_as_documented():
    """What each mode turns on, on a CUDA device (the flags are plain settings: a CPU-only torch
    holds them too), and that fp32 leaves TF32 off and autocast disabled."""
    cuda, saved = torch.device("cuda"), (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        for precision in PRECISIONS:
            set_precision(cuda, precision)
            assert torch.backends.cuda.matmul.allow_tf32 == torch.backends.cudnn.allow_tf32 == (precision == "tf32")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    with pytest.raises(ValueError, match="needs a CUDA device"):
        set_precision(torch.device("cpu"), "bf16")
    set_precision(torch.device("cpu"), "fp32")   # the default: nothing to set on a CPU
    # the step's context, shown on the CPU's autocast (a run refuses bf16 there; the context is the same)
    a = torch.ones(4, 4)
    for precision in PRECISIONS:
        with autocast(torch.device("cpu"), precision):
            assert torch.mm(a, a).dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)


def test_precision_is_in_the_manifest(tmp_path, tiny_dict, capsys):
    cfg = write_toml(tmp_path, {**tiny_dict, "train": {**tiny_dict["train"], "rounds": 1}}, "c.toml")
    assert main(["run", str(cfg), "--output", str(tmp_path / "out"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "covg-esrcov" / "manifest.json").read_text())
    assert manifest["config"]["train"]["precision"] == "fp32"

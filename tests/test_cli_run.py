"""``tcmlir run FILE --check`` (the README's first command), end to end: it passes on the
examples, and a planted wrong result (a shifted value, a NaN) makes it say MISMATCH and exit 1."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tcmlir import api
from tcmlir.cli import main

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
MATMUL = os.path.join(EXAMPLES, "matmul.tc")


def test_run_check_in_a_subprocess():
    """The README's command, through ``python -m tcmlir``, on the host."""
    proc = subprocess.run(
        [sys.executable, "-m", "tcmlir", "run", MATMUL, "--sizes", "M=33,K=17,N=9",
         "--target", "cpu", "--repeat", "1", "--check"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matmul on cpu" in proc.stdout
    assert "check against the numpy reference" in proc.stdout and "OK" in proc.stdout


@pytest.mark.parametrize("example,sizes", [("softmax.tc", "N=7,D=13"), ("layers.tc", None)])
def test_run_check_on_the_examples(example, sizes, capsys):
    path = os.path.join(EXAMPLES, example)
    argv = ["run", path, "--target", "cpu", "--repeat", "1", "--check"]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.count("def ") > 1:
        argv += ["--name", text.split("def ", 2)[1].split("(", 1)[0].strip()]
    if sizes:
        argv += ["--sizes", sizes]
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "OK" in out.out


@pytest.mark.parametrize("plant", ["shift", "nan", "one-element"])
def test_run_check_reports_a_planted_mismatch(plant, monkeypatch, capsys):
    real_launch = api.Kernel.launch

    def wrong_launch(self, *inputs, **kwargs):
        out = np.array(real_launch(self, *inputs, **kwargs), copy=True)
        if plant == "shift":
            out += 1
        elif plant == "nan":
            out.flat[0] = np.nan
        else:
            out.flat[-1] *= 1.01
        return out

    monkeypatch.setattr(api.Kernel, "launch", wrong_launch)
    code = main(["run", MATMUL, "--sizes", "M=5,K=4,N=3", "--target", "cpu", "--repeat", "1",
                 "--check"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "MISMATCH" in out

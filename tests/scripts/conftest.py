"""The scripts' `main` run in this process, and a folder of small text files to train on."""

import pytest
import torch

from tests.helpers import load_script


@pytest.fixture(scope="module")
def train_lm():
    return load_script("train_lm")


@pytest.fixture(scope="module")
def train_sets():
    return load_script("train_sets")


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """train.txt (200 lines of 12 words out of 40), and files no run can train on: empty, blank, too short, binary,
    not UTF-8."""
    folder = tmp_path_factory.mktemp("texts")
    g = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(40)]
    lines = [" ".join(words[int(i)] for i in torch.randint(0, 40, (12,), generator=g)) for _ in range(200)]
    (folder / "train.txt").write_text("\n".join(lines) + "\n")
    (folder / "empty.txt").write_text("")
    (folder / "blank.txt").write_text("\n \n\n")
    (folder / "short.txt").write_text("w1 w2 w3\n")
    (folder / "binary.bin").write_bytes(b"w1 w2\n" + bytes(range(256)) * 4)
    (folder / "latin1.txt").write_bytes("w1 w2\ncaf\u00e9 w3\n".encode("latin-1"))
    return folder

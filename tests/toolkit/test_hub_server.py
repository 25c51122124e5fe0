"""The real huggingface_hub client and transformers against `LocalHub` (tests/toolkit/hub_server.py), on 127.0.0.1 only.

huggingface_hub reads HF_ENDPOINT when it is imported, so every client runs in a subprocess whose environment points
it at the local hub (`LocalHub.client_env`), each with its own empty HF_HOME.
"""

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.toolkit.hub_server import LocalHub


TIMEOUT = 50  # seconds per client subprocess


def run_client(hub, hf_home, script, *args, cwd=None):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        env=hub.client_env(hf_home),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"client failed:\n{result.stdout}\n{result.stderr[-6000:]}"
    return result.stdout


@pytest.fixture
def hub(tmp_path):
    with LocalHub(tmp_path / "hub") as hub:
        yield hub


UPLOAD = """
    import json, sys
    from huggingface_hub import HfApi
    api = HfApi()
    assert api.whoami()["name"] == "user"
    url = api.create_repo("user/tiny")
    assert url.repo_id == "user/tiny", url
    api.create_repo("user/tiny", exist_ok=True)  # 409 -> fine
    info = api.upload_folder(folder_path=sys.argv[1], repo_id="user/tiny", commit_message="first")
    again = api.upload_folder(folder_path=sys.argv[1], repo_id="user/tiny")  # nothing changed -> no new commit
    meta = {s.rfilename: s.lfs is not None for s in api.model_info("user/tiny", files_metadata=True).siblings}
    print(json.dumps({"oid": info.oid, "again": again.oid, "files": sorted(api.list_repo_files("user/tiny")),
                      "lfs": meta}))
"""

DOWNLOAD = """
    import json, sys
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    path = snapshot_download("user/tiny")
    errors = {}
    for name, call in {
        "file": lambda: hf_hub_download("user/tiny", "missing.json"),
        "repo": lambda: hf_hub_download("user/nothing", "config.json"),
        "revision": lambda: hf_hub_download("user/tiny", "notes.txt", revision="nope"),
    }.items():
        try:
            call()
        except (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError) as e:
            errors[name] = type(e).__name__
    pinned = hf_hub_download("user/tiny", "notes.txt", revision=sys.argv[1])
    print(json.dumps({"path": path, "errors": errors, "pinned": pinned}))
"""


def test_upload_folder_then_snapshot_download(hub, tmp_path):
    folder = tmp_path / "upload"
    (folder / "sub").mkdir(parents=True)
    files = {
        "notes.txt": b"hello hub\n",
        "sub/config.json": json.dumps({"a": 1, "b": [1, 2]}).encode(),
        "model.safetensors": torch.randn(500_000, generator=torch.Generator().manual_seed(0)).numpy().tobytes(),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    assert len(files["model.safetensors"]) == 2_000_000

    up = json.loads(run_client(hub, tmp_path / "home_up", UPLOAD, folder).splitlines()[-1])
    assert up["again"] == up["oid"]
    assert up["files"] == sorted([".gitattributes", *files])
    assert up["lfs"] == {
        ".gitattributes": False,
        "notes.txt": False,
        "sub/config.json": False,
        "model.safetensors": True,
    }
    assert ("PUT", f"/_lfs/{hashlib.sha256(files['model.safetensors']).hexdigest()}") in hub.requests

    down = json.loads(run_client(hub, tmp_path / "home_down", DOWNLOAD, up["oid"]).splitlines()[-1])
    snapshot = Path(down["path"])  # in the fresh HF_HOME, named after the commit
    assert snapshot.is_relative_to(tmp_path / "home_down") and snapshot.name == up["oid"]
    for name, data in files.items():
        assert (snapshot / name).read_bytes() == data, name
    assert down["errors"] == {
        "file": "RemoteEntryNotFoundError",  # a subclass of EntryNotFoundError
        "repo": "RepositoryNotFoundError",
        "revision": "RevisionNotFoundError",
    }
    assert Path(down["pinned"]).read_bytes() == files["notes.txt"]


PUSH = """
    import sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).eval()
    commit = model.push_to_hub("user/gpt")
    input_ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        logits = model(input_ids).logits
    torch.save({"input_ids": input_ids, "logits": logits}, sys.argv[1])
    print(commit.oid)
"""

LOAD = """
    import sys, torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("user/gpt").eval()
    saved = torch.load(sys.argv[1])
    with torch.no_grad():
        logits = model(saved["input_ids"]).logits
    torch.save(logits, sys.argv[2])
    print(type(model).__name__)
"""


@pytest.mark.slow
def test_transformers_push_to_hub_then_from_pretrained(hub, tmp_path):
    commit = run_client(hub, tmp_path / "home_push", PUSH, tmp_path / "pushed.pt").split()[-1]
    assert len(commit) == 40
    out = run_client(hub, tmp_path / "home_load", LOAD, tmp_path / "pushed.pt", tmp_path / "loaded.pt")
    assert out.split()[-1] == "GPT2LMHeadModel"
    pushed = torch.load(tmp_path / "pushed.pt")
    assert torch.equal(torch.load(tmp_path / "loaded.pt"), pushed["logits"])
    # the weights went through the LFS upload; the load resolved `main` to the pushed commit, then fetched from it
    assert any(method == "PUT" and path.startswith("/_lfs/") for method, path in hub.requests)
    assert ("GET", f"/user/gpt/resolve/{commit}/model.safetensors") in hub.requests

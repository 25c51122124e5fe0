"""The README is what users run: its install and test commands are CI's, its Python examples run as written, and
the package stays loadable as remote code (flat, sibling imports only)."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def ci_command(label):
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return lines[lines.index(f"# README {label}:") + 1].strip()


@pytest.mark.parametrize("label", ["install", "test"])
def test_ci_runs_the_readme_commands(label):
    command = ci_command(label)
    assert f"```bash\n{command}\n```" in README, command


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_runs_as_written(tmp_path, index):
    code = python_blocks()[index]
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]


MODELING_IMPORTS = {"torch", "transformers"} | set(sys.stdlib_module_names)
# the toolkit for your own scripts (never imported by the modeling files) may also use what installing transformers
# brings along
TOOLKIT_IMPORTS = MODELING_IMPORTS | {"tokenizers", "tqdm"}
TOOLKIT = {"language_modeling.py", "training.py", "set_tasks.py", "__init__.py"}


def test_package_is_flat_and_imports_only_torch_transformers_and_siblings():
    """What a checkpoint carries (configuration_*/modeling_* and every sibling they import) needs torch, transformers
    and the standard library only; the toolkit modules may use the standard library and what transformers installs, and no modeling file
    imports them."""
    package = ROOT / "hf_settransformer"
    assert not [p for p in package.rglob("*.py") if p.parent != package]
    for path in package.glob("*.py"):
        allowed = TOOLKIT_IMPORTS if path.name in TOOLKIT else MODELING_IMPORTS
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: must be a sibling module, and a modeling file never reaches the toolkit
                    assert node.level == 1 and (package / f"{node.module}.py").exists(), (path.name, node.module)
                    assert path.name in TOOLKIT or f"{node.module}.py" not in TOOLKIT, (path.name, node.module)
                    continue
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert roots <= allowed, (path.name, roots - allowed)

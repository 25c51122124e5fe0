"""The README is what users run: its install and test commands are CI's, its Python examples run as written, and
the package stays loadable as remote code (flat, sibling imports only)."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [ROOT / "README.md", *DOCS]


def ci_command(label):
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return lines[lines.index(f"# README {label}:") + 1].strip()


@pytest.mark.parametrize("label", ["install", "test"])
def test_ci_runs_the_readme_commands(label):
    command = ci_command(label)
    assert f"```bash\n{command}\n```" in README, command


def test_the_readme_is_documentation_with_the_test_command_at_the_top():
    lines = README.splitlines()
    assert len(lines) <= 400, len(lines)
    assert lines.index(ci_command("test")) < 60


def test_docs_stay_a_reference():
    """docs/ is a reference a user reads: tables tied to results files, protocols and commands, design facts. The story
    of how runs went stays out of it (results/ holds the runs, CHANGELOG.md what changed), so the folder stays short."""
    words = {path.name: len(path.read_text().split()) for path in DOCS}
    assert sum(words.values()) <= 9500, (
        f"docs/*.md hold {sum(words.values())} words (at most 9,500): docs are a reference (tables, protocols, "
        f"commands, design facts), not a narrative; what changed goes to CHANGELOG.md. Per file: {words}")


OWN_SCRIPT = (ROOT / "docs" / "training.md", "## Use the pieces in your own script")
# the README's objective entry is written against the OBJECTIVES table (hf_settransformer/toolkit/objectives.py);
# tests/toolkit/test_objectives.py runs it (and trains and evaluates the head it declares), not this file
OBJECTIVE_ENTRY = "<!-- objective-entry -->"


def python_blocks(path, section=None):
    """A document's Python blocks; `section`: only those under that heading (until the next heading); the block after
    the objective-entry marker is left out."""
    text = path.read_text()
    if section:
        text = text[text.index(section) :]
        text = text[: text.index("\n#", len(section))]
    if OBJECTIVE_ENTRY in text:
        start = text.index(OBJECTIVE_ENTRY)
        block = text.index("```python\n", start)
        text = text[:start] + text[text.index("```\n", block + 10) + 4 :]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def run_python(code, folder):
    env = dict(os.environ, HF_MODULES_CACHE=str(folder / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


OTHER_BLOCKS = [
    pytest.param(code, id=f"{path.relative_to(ROOT)}-{i}")
    for path in DOCUMENTS
    for i, code in enumerate(python_blocks(path))
    if code not in python_blocks(*OWN_SCRIPT)
]


@pytest.mark.slow
@pytest.mark.parametrize("code", OTHER_BLOCKS)
def test_readme_python_runs_as_written(tmp_path, code):
    """Every Python block of the README and of docs/ (the own-script one aside: the next test) runs as written."""
    run_python(code, tmp_path)


@pytest.mark.slow
def test_readme_own_training_script_runs_and_a_second_run_only_loads(tmp_path):
    """The Trainer script of about 30 lines (docs/training.md), with the package's windows, evaluation and resumption,
    run as written on the text it makes itself; run again in the same folder, it resumes from its final checkpoint,
    trains no further step and measures the same perplexity."""
    (code,) = python_blocks(*OWN_SCRIPT)
    assert len(code.strip().splitlines()) <= 35
    first, again = (run_python(code, tmp_path).split("held-out perplexity ")[1] for _ in range(2))
    assert ", 80 steps," in first and ", 80 steps," in again and (tmp_path / "my-lm" / "checkpoint-80").is_dir()
    assert first.split(" tokens,")[0] == again.split(" tokens,")[0]  # the same perplexity over the same tokens


def heading_anchors(text):
    """GitHub's anchors of a Markdown text's headings: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    }


def test_every_relative_link_of_the_documentation_resolves():
    """Every relative link (and image) of the README and docs/*.md names a file of the repository, and its anchor,
    when it has one, a heading of that file."""
    checked = 0
    for path in [*DOCUMENTS, ROOT / "CHANGELOG.md"]:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            name, _, anchor = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            assert linked.is_file(), f"{path.relative_to(ROOT)}: {target} does not exist"
            if anchor:
                anchors = heading_anchors(linked.read_text())
                assert anchor in anchors, f"{path.relative_to(ROOT)}: {target}: no such heading ({sorted(anchors)})"
            checked += 1
    assert checked > 20


# huggingface_hub: installed with transformers (its configs' `@strict` dataclasses come from there)
MODELING_IMPORTS = {"torch", "transformers", "huggingface_hub"} | set(sys.stdlib_module_names)
# the toolkit for your own scripts (never imported by the modeling files) may also use what installing transformers
# brings along
TOOLKIT_IMPORTS = MODELING_IMPORTS | {"tokenizers", "tqdm", "huggingface_hub", "safetensors"}


def required_imports(tree):
    """The import statements of a module's AST, less those inside a `try` (an optional accelerator such as triton,
    whose ImportError is caught): transformers' remote-code loader does not require those either."""
    if isinstance(tree, ast.Try):
        return
    if isinstance(tree, (ast.Import, ast.ImportFrom)):
        yield tree
    for child in ast.iter_child_nodes(tree):
        yield from required_imports(child)


def test_model_side_is_flat_and_imports_only_torch_transformers_and_siblings():
    """What a checkpoint carries (the flat files of `hf_settransformer/`: configuration_*/modeling_* and every sibling
    they import) needs torch, transformers and the standard library only (an optional import inside a `try` aside),
    and never reaches the toolkit; the toolkit (`hf_settransformer/toolkit/`, one level down, nothing deeper) may
    also use what transformers installs, and imports the model side relatively (`from ..x import y`)."""
    package = ROOT / "hf_settransformer"
    toolkit = package / "toolkit"
    assert {p.parent for p in package.rglob("*.py")} == {package, toolkit}
    for path in [*package.glob("*.py"), *toolkit.glob("*.py")]:
        in_toolkit = path.parent == toolkit
        allowed = TOOLKIT_IMPORTS if in_toolkit else MODELING_IMPORTS
        for node in required_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: a sibling module, or from the toolkit a model-side module one level up
                    assert node.level in ((1, 2) if in_toolkit else (1,)), (path.name, node.level, node.module)
                    folder = path.parent if node.level == 1 else package
                    assert node.module and (folder / f"{node.module}.py").exists(), (path.name, node.module)
                    continue
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert roots <= allowed, (path.name, roots - allowed)


def toolkit_modules():
    """Every module of `hf_settransformer.toolkit`, imported."""
    import importlib

    folder = ROOT / "hf_settransformer" / "toolkit"
    return [importlib.import_module(f"hf_settransformer.toolkit.{path.stem}")
            for path in sorted(folder.glob("*.py")) if path.stem != "__init__"]


def test_the_toolkit_exports_at_most_30_names_each_its_modules_own():
    """`hf_settransformer.toolkit` exports what a script of your own needs (the objectives table, the training and
    evaluation entry points, what the README and docs/training.md show), at most 30 names, each importable and the very
    object its module defines; the rest is imported from its module. `hf_settransformer` itself exports the model side
    only: models, configurations, blocks and registries."""
    import hf_settransformer as hfst
    from hf_settransformer import toolkit

    assert len(toolkit.__all__) <= 30 and len(set(toolkit.__all__)) == len(toolkit.__all__), toolkit.__all__
    assert not set(hfst.__all__) & set(toolkit.__all__)
    star = {}
    exec("from hf_settransformer.toolkit import *", star)
    assert set(toolkit.__all__) <= set(star)
    modules = toolkit_modules()
    for name in toolkit.__all__:
        obj = star[name]
        owners = [m for m in modules if getattr(m, name, None) is obj]
        if hasattr(obj, "__module__"):  # a class or function: the module that defines it
            owners = [m for m in owners if m.__name__ == obj.__module__]
        assert owners, f"toolkit.{name} is no toolkit module's own"


def test_every_public_toolkit_name_says_what_it_does():
    """What a toolkit module defines without a leading underscore, class or function, has a docstring."""
    import inspect

    for module in toolkit_modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if obj.__module__ == module.__name__:  # defined here, not imported
                assert obj.__doc__ and len(obj.__doc__.split()) >= 5, f"{module.__name__}.{name} has no docstring"


CARRIED = """
import json, sys
sys.modules["hf_settransformer"] = None  # the code must come with the checkpoint
from transformers import AutoModelForCausalLM
for path in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    print("loaded", type(model).__name__)
"""


@pytest.mark.slow
def test_a_checkpoint_carries_only_modeling_files_and_loads_without_the_package(tmp_path):
    """save_pretrained copies the modeling file of the model and every sibling it imports: none of them may be a
    toolkit module (training, language modeling, set tasks, data collator), and what it carries imports torch,
    transformers, the standard library and the other carried files only. Loaded in a process where
    hf_settransformer cannot be imported."""
    from tests.helpers import FAMILIES, family_classes, tiny_config
    from transformers import AutoModelForCausalLM

    folders = []
    for family in FAMILIES:
        config = tiny_config(family)
        model = family_classes(config)[AutoModelForCausalLM](config)
        folder = tmp_path / family
        model.save_pretrained(folder)
        carried = {path.name for path in folder.glob("*.py")}
        assert f"modeling_{family}.py" in carried and f"configuration_{family}.py" in carried, carried
        toolkit_files = {p.name for p in (ROOT / "hf_settransformer" / "toolkit").glob("*.py")} - {"__init__.py"}
        assert not carried & toolkit_files, carried
        for name in carried:
            for node in required_imports(ast.parse((folder / name).read_text())):
                if isinstance(node, ast.ImportFrom) and node.level:
                    assert f"{node.module}.py" in carried, (family, name, node.module)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                    assert {n.split(".")[0] for n in names} <= MODELING_IMPORTS, (family, name, names)
        folders.append(str(folder))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", CARRIED, *folders], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("loaded ") == len(FAMILIES)


# In a clean interpreter: import what the model side subclasses and registers with (transformers' base classes, the
# gradient-checkpointing layer, the Auto classes), then the package, and print what the package added.
IMPORTS_ADDED = """
import sys
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM,
                          AutoModelForSequenceClassification, GenerationMixin, PreTrainedConfig, PreTrainedModel)
from transformers.modeling_layers import GradientCheckpointingLayer
before = set(sys.modules)
import hf_settransformer
print(sorted(name for name in set(sys.modules) - before if name.partition(".")[0] != "hf_settransformer"))
"""


def test_importing_the_package_imports_nothing_its_transformers_base_classes_do_not():
    """`import hf_settransformer`'s time is torch, transformers and `torch._dynamo` (about a third of it), which
    transformers 5.23 imports with `PreTrainedModel` (`modeling_utils` -> `integrations.hub_kernels` ->
    `integrations.flash_attention` -> `generation.continuous_batching`, whose `@torch.compiler.disable` imports it);
    `masking_utils` comes with `GenerationMixin` and `GradientCheckpointingLayer`. A package whose models subclass
    them cannot avoid either (nor triton, `torch._inductor` and flex attention, which come with them too). What is
    avoidable is anything more: the toolkit and what it pulls in (`datasets`, ...), a compiler stage such as
    `torch._inductor.compile_fx`, or `masking_utils` itself once transformers stops importing it."""
    result = subprocess.run([sys.executable, "-c", IMPORTS_ADDED], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout


def entry_points():
    """The scripts and benchmarks a user runs (those with a `__main__` block), by module name."""
    files = [*(ROOT / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    return {path.stem: path for path in files if '__name__ == "__main__"' in path.read_text()}


def test_no_script_imports_a_script():
    """What two entry points share lives in the toolkit (or a helper module beside them that is no script): a script
    importing another script runs its module-level code and ties the two files' arguments together."""
    scripts = entry_points()
    assert {"train_lm", "push_run", "lm_results"} <= set(scripts)
    for name, path in scripts.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported = {node.module.split(".")[0]}
            else:
                continue
            assert not imported & set(scripts), f"{path.relative_to(ROOT)} imports the script {imported & set(scripts)}"


def test_the_wheel_carries_the_model_card_templates(tmp_path):
    """A non-editable install writes model cards: the templates are package data beside `toolkit/cards.py`, which
    finds them relative to itself, and the wheel holds them."""
    import zipfile

    from hf_settransformer.toolkit.cards import CARD_TEMPLATES

    assert CARD_TEMPLATES == ROOT / "hf_settransformer" / "toolkit" / "model_cards"
    templates = sorted(p.name for p in CARD_TEMPLATES.glob("*.md"))
    assert templates == ["lm_model_card.md", "mlm_model_card.md"]
    assert not set(templates) & {p.name for p in (ROOT / "model_cards").glob("*.md")}  # one copy of the templates
    # built from a copy: setuptools writes its build/ and *.egg-info beside the sources, which stay untouched
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "hf_settransformer", source / "hf_settransformer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                             str(tmp_path), str(source)], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("hf_settransformer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in templates:
        assert f"hf_settransformer/toolkit/model_cards/{name}" in names, sorted(names)
    assert "hf_settransformer/toolkit/cards.py" in names


def kept_runs(folder):
    """results/<folder>/<run>/all_results.json, by run name."""
    return {path.parent.name: json.loads(path.read_text())
            for path in sorted((ROOT / "results" / folder).glob("*/all_results.json"))}


@pytest.mark.parametrize("folder", ["wikitext2-90min-v2", "wikitext2-90min-keydrop", "wikitext2-90min-decay",
                                   "wikitext2-90min-decay-seeds"])
def test_the_results_tables_are_the_kept_results(folder):
    """docs/results.md's rows of the 90-minute runs show each kept run's validation and test perplexity and its test
    accuracy as its all_results.json records them."""
    text = (ROOT / "docs" / "results.md").read_text()
    for run, r in kept_runs(folder).items():
        row = (rf"\| {r['validation_perplexity']:.1f} \| (\*\*)?{r['test_perplexity']:.1f}(\*\*)?( \([+-]\d+\.\d%\))? "
               rf"\| {r['test_accuracy']:.3f} \|")
        assert re.search(row, text), f"docs/results.md has no row of results/{folder}/{run}: {row}"


def test_the_families_table_holds_every_run_at_the_defaults():
    """docs/results.md's table of the runs at the default training methods: each run of the folder, its steps and
    figures, and its ratio to the best of them."""
    text = (ROOT / "docs" / "results.md").read_text()
    runs = kept_runs("wikitext2-methods/combined")
    best = min(r["test_perplexity"] for r in runs.values())
    for run, r in runs.items():
        row = (f"| {run} | {r['train_steps']:,} | {r['validation_perplexity']:.1f} / **{r['test_perplexity']:.1f}** | "
               f"{r['test_perplexity'] / best:.2f} |")
        assert row in text, f"docs/results.md has no row of results/wikitext2-methods/combined/{run}: {row}"


METHODS_ROWS = {"base": "AdamW + cosine", "muon": "Muon", "tied": "tied adaptive layers", "wsd": "WSD",
                "average": "last 20% averaged", "context256": "context 256", "combined": "combined"}


def test_the_methods_table_holds_every_decoder_run_of_the_search():
    """docs/tuning.md's training-methods table: each decoder run of results/wikitext2-methods (a method alone, or the
    combination; every seed) in the row of its methods and seed, under its decoder, with its steps, the weights it
    kept (the selected step, or the average) and its validation and test perplexity."""
    lines = (ROOT / "docs" / "tuning.md").read_text().splitlines()
    columns = {"decoder-linear-elu-gated": 0, "decoder-softmax": 2}  # of the cells after the methods and the seed
    folders = [path.name for path in sorted((ROOT / "results" / "wikitext2-methods").iterdir()) if path.is_dir()]
    assert {"base", "combined", "combined-seed1"} <= set(folders), folders
    for folder in folders:
        method, _, seed = folder.partition("-seed")
        start = f"| {METHODS_ROWS[method]} | {seed or 42} |"
        rows = [line for line in lines if line.startswith(start)]
        assert len(rows) == 1, f"docs/tuning.md has {len(rows)} rows starting {start!r}"
        cells = [cell.strip().replace("**", "") for cell in rows[0].split("|")[3:-1]]
        for run, r in kept_runs(f"wikitext2-methods/{folder}").items():
            if r["family"] != "decoder":
                continue
            kept = "average" if "average" in r["selected_by"] else f"{r['selected_step']:,}"
            figures = [f"{r['train_steps']:,} ({kept})",
                       f"{r['validation_perplexity']:.1f} / {r['test_perplexity']:.1f}"]
            at = columns[run]
            assert cells[at:at + 2] == figures, f"{start} under {run}: {cells[at:at + 2]} against {figures}"


def test_the_readme_quotes_the_results_files_and_their_machines():
    """The README's perplexities are those of the runs it names (the command it shows and its gated linear sibling at
    the defaults and in the plain training, two seeds each; the grid's for the command and its best), with the
    machine, threads and precision those runs recorded."""
    text = " ".join(README.split())
    combined, seed1 = kept_runs("wikitext2-methods/combined"), kept_runs("wikitext2-methods/combined-seed1")
    plain, plain1 = kept_runs("wikitext2-methods/base"), kept_runs("wikitext2-methods/base-seed1")
    grid = kept_runs("wikitext2-90min-v2")
    softmax, gated = "decoder-softmax", "decoder-linear-elu-gated"
    best = min(grid, key=lambda run: grid[run]["test_perplexity"])

    def ppl(runs, run):
        return f"{runs[run]['test_perplexity']:.1f}"

    assert (f"On an AMD EPYC with `avx512_bf16` (bf16, one thread; `results/wikitext2-methods/`): "
            f"{ppl(combined, softmax)} test perplexity ({ppl(seed1, softmax)} with `--seed 1`); with `--attention_type "
            f"linear --linear_attention_decay gated` {ppl(combined, gated)} ({ppl(seed1, gated)}). AdamW with a cosine "
            f"schedule gave {ppl(plain, softmax)} ({ppl(plain1, softmax)}) and {ppl(plain, gated)} "
            f"({ppl(plain1, gated)}):") in text
    assert f"(this command {ppl(grid, softmax)}, best {ppl(grid, best)})" in text
    families = {}  # each other family's best run at the defaults
    for run, r in combined.items():
        if r["family"] != "decoder":
            families[r["family"]] = min(families.get(r["family"], r["test_perplexity"]), r["test_perplexity"])
    assert len(families) == 3, families
    assert f"Each other family's best at the defaults ({min(families.values()):.1f}-{max(families.values()):.1f})," in text
    for runs in (combined, seed1, plain, plain1, grid):
        for r in runs.values():
            assert (r["cpu_model"], r["threads_per_process"], r["precision"]) == ("AMD EPYC", 1, "bf16")
            assert r.get("cpu_fast_bf16", True)  # the runs before the key: the same machine kind (the folders' READMEs)
    for runs in (combined, seed1):  # what the defaults are now
        for r in runs.values():
            assert (r["hyperparameters"]["optimizer"], r["hyperparameters"]["lr_scheduler_type"]) == (
                "muon", "warmup_stable_decay")
            assert r["average_weights"] == "last" and r["config"]["tie_adaptive_weights"]
    assert "as written, the numbers of" not in text


def documented_commands(path):
    """The shell commands of a document's bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_every_documented_training_command_names_its_output_dir():
    """A training command without --output_dir writes into `trainer_output/` of the folder it runs in (the
    repository root, shared by every such command): each documented one names its own."""
    commands = [(path, line) for path in DOCUMENTS for line in documented_commands(path)
                if re.search(r"scripts/train_(lm|sets)\.py", line)]
    assert len(commands) >= 10, commands
    for path, line in commands:
        assert "--output_dir" in line, f"{path.relative_to(ROOT)}: {line}"
    folders = [line.split("--output_dir")[1].split()[0] for _, line in commands]
    assert all(folder.startswith("outputs/") for folder in folders), folders  # ignored by git (.gitignore)


REFUSED_FLAG = """
import runpy, sys
sys.argv = ["scripts/train_lm.py", "--famly", "decoder"]
try:
    runpy.run_path("scripts/train_lm.py", run_name="__main__")
except SystemExit as refusal:
    print(refusal.code)
print(sorted(name for name in ("datasets", "transformers.trainer", "hf_settransformer.toolkit.measure") if name in sys.modules))
"""


def test_train_lm_refuses_a_misspelt_flag_before_the_trainer_and_datasets_load():
    """`train_lm.py --help` and a refused flag answer after the argument classes load (transformers'
    `TrainingArguments`, the model side for the families), not after the `Trainer`, datasets and the toolkit's training
    code too."""
    result = subprocess.run([sys.executable, "-c", REFUSED_FLAG], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["unknown flag --famly (did you mean --family?)", "[]"], result.stdout

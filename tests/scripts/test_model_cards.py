"""model_cards/: the card of every released checkpoint (the two decoders trained with the training methods, the 90
CPU-minute WikiText-2 grid and its decayed linear runs), as scripts/make_model_cards.py writes it from the runs'
all_results.json with the package's templates."""

import importlib.util
import json
from pathlib import Path

import pytest

from hf_settransformer import toolkit

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "results" / "wikitext2-90min-v2"
DECAY = ROOT / "results" / "wikitext2-90min-decay"  # decayed runs, and undecayed baselines of the grid's names
METHODS = ROOT / "results" / "wikitext2-methods" / "combined"  # the defaults' methods: the decoders' released runs
CARDS = ROOT / "model_cards"
# run name -> its folder; the earliest folder of the script's list where several have the name (the script's rule)
RELEASED = {path.parent.name: path.parent for folder in (DECAY, GRID, METHODS)
            for path in folder.glob("*/all_results.json")}


def make_model_cards():
    spec = importlib.util.spec_from_file_location("hfst_script_make_model_cards", ROOT / "scripts" / "make_model_cards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_released_run_has_its_card_and_nothing_else_is_there():
    grid = {path.parent.name for path in GRID.glob("*/all_results.json")}
    decayed = {path.parent.name for path in DECAY.glob("*/all_results.json")} - grid
    assert len(grid) == 13, sorted(grid)
    assert decayed and all(name.endswith(("-fixed", "-gated")) for name in decayed), sorted(decayed)
    methods = {path.parent.name for path in METHODS.glob("*/all_results.json")}
    assert {"decoder-linear-elu-gated", "decoder-softmax"} <= methods
    assert {path.name for path in CARDS.iterdir()} == {f"{run}.md" for run in grid | decayed | methods}
    assert not any(list(folder.glob("*/README.md")) for folder in (GRID, DECAY, METHODS))  # one copy: model_cards/


def test_the_cards_are_what_the_script_writes_from_the_results(tmp_path):
    """Run `python scripts/make_model_cards.py` after a change to the templates or to a run's results."""
    script = make_model_cards()
    assert [Path(folder) for folder in script.Arguments().results_dirs] == [METHODS, GRID, DECAY]
    written = script.write_cards([METHODS, GRID, DECAY], tmp_path, quiet=True)
    assert len(written) == len(list(CARDS.glob("*.md")))
    for path in written:
        assert path.read_text() == (CARDS / path.name).read_text(), (
            f"model_cards/{path.name} is stale: run python scripts/make_model_cards.py")


def test_an_earlier_folders_run_is_the_released_one_and_a_folder_without_runs_is_refused(tmp_path, capsys):
    first, second, empty = (tmp_path / name for name in ("first", "second", "empty"))
    for folder, run in [(first, "a"), (second, "a"), (second, "b")]:
        (folder / run).mkdir(parents=True)
        (folder / run / "all_results.json").write_text("{}")
    empty.mkdir()
    script = make_model_cards()
    assert script.runs([first, second]) == [first / "a", second / "b"]
    assert f"{second / 'a'}: no card, {first / 'a'} is the released run" in capsys.readouterr().out
    with pytest.raises(ValueError, match=f"No run folder with an all_results.json in {empty}"):
        script.runs([first, empty])


@pytest.mark.parametrize("run", sorted(RELEASED))
def test_a_card_gives_its_runs_figures_and_a_command_a_hub_reader_can_run(run):
    results = json.loads((RELEASED[run] / "all_results.json").read_text())
    card = (CARDS / f"{run}.md").read_text()
    assert f"| parameters | {results['parameters']:,} |" in card
    for split in ("validation", "test"):
        assert f"**{results[f'{split}_perplexity']:.2f}**" in card and f"split: {split}" in card
    assert f"--family {results['family']} " in card and "--dataset_name wikitext --dataset_config_name wikitext-2-v1" in card
    assert "wiki.train.tokens" not in card and "${" not in card
    assert f"transformers {results['transformers_version']}, torch" in card and results["torch_version"] in card
    decay = results.get("linear_attention_decay", "none")  # the grid's runs predate the field
    assert (f"--linear_attention_decay {decay}" in card and f"{decay} decay)**" in card) == (decay != "none")


def test_a_results_folder_without_its_config_is_refused_naming_what_it_lacks(tmp_path):
    results = json.loads((GRID / "decoder-softmax" / "all_results.json").read_text())
    del results["config"]
    (tmp_path / "all_results.json").write_text(json.dumps(results))
    with pytest.raises(ValueError, match="does not record the run's config"):
        toolkit.refresh_model_card(tmp_path)


@pytest.mark.parametrize("damage", ["cut short", "a perplexity as a string"])
def test_check_names_a_damaged_all_results_json_and_its_key(tmp_path, damage):
    """`make_model_cards.py --check` on a results folder with a damaged run: the file and the key, no traceback, and
    without --check no card written (each run is read before any card is)."""
    import re
    import shutil
    import subprocess
    import sys

    results = tmp_path / "results"
    for run in ("decoder-softmax", "encoder-softmax"):
        shutil.copytree(GRID / run, results / run)
    path = results / "encoder-softmax" / "all_results.json"
    text = path.read_text()
    path.write_text(text[:300] if damage == "cut short" else
                    re.sub(r'"test_perplexity": ([0-9.]+)', r'"test_perplexity": "\1"', text))
    for check in (["--check"], []):
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_model_cards.py"), *check,
                                 "--results_dirs", str(results), "--output_dir", str(tmp_path / "cards")],
                                cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert f"[make_model_cards] {path}" in result.stderr
        assert ("is not valid JSON" if damage == "cut short" else "test_perplexity is '") in result.stderr
        assert not (tmp_path / "cards").exists() or not list((tmp_path / "cards").iterdir())

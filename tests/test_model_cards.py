"""model_cards/: the card of every released checkpoint (the 90 CPU-minute WikiText-2 grid), as
scripts/make_model_cards.py writes it from the runs' all_results.json with the package's templates."""

import importlib.util
import json
from pathlib import Path

import pytest

from hf_settransformer import toolkit

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "results" / "wikitext2-90min-v2"
CARDS = ROOT / "model_cards"


def make_model_cards():
    spec = importlib.util.spec_from_file_location("hfst_script_make_model_cards", ROOT / "scripts" / "make_model_cards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_run_of_the_grid_has_its_card_and_nothing_else_is_there():
    runs = {path.parent.name for path in GRID.glob("*/all_results.json")}
    assert len(runs) == 13, sorted(runs)
    assert {path.name for path in CARDS.iterdir()} == {f"{run}.md" for run in runs}
    assert not list(GRID.glob("*/README.md"))  # one copy of each card: model_cards/


def test_the_cards_are_what_the_script_writes_from_the_results(tmp_path):
    """Run `python scripts/make_model_cards.py` after a change to the templates or to a run's results."""
    written = make_model_cards().write_cards(GRID, tmp_path)
    assert len(written) == len(list(CARDS.glob("*.md")))
    for path in written:
        assert path.read_text() == (CARDS / path.name).read_text(), (
            f"model_cards/{path.name} is stale: run python scripts/make_model_cards.py")


@pytest.mark.parametrize("run", sorted(path.name for path in GRID.iterdir() if path.is_dir()))
def test_a_card_gives_its_runs_figures_and_a_command_a_hub_reader_can_run(run):
    results = json.loads((GRID / run / "all_results.json").read_text())
    card = (CARDS / f"{run}.md").read_text()
    assert f"| parameters | {results['parameters']:,} |" in card
    for split in ("validation", "test"):
        assert f"**{results[f'{split}_perplexity']:.2f}**" in card and f"split: {split}" in card
    assert f"--family {results['family']} " in card and "--dataset_name wikitext --dataset_config_name wikitext-2-v1" in card
    assert "wiki.train.tokens" not in card and "${" not in card
    assert f"transformers {results['transformers_version']}, torch" in card and results["torch_version"] in card


def test_a_results_folder_without_its_config_is_refused_naming_what_it_lacks(tmp_path):
    results = json.loads((GRID / "decoder-softmax" / "all_results.json").read_text())
    del results["config"]
    (tmp_path / "all_results.json").write_text(json.dumps(results))
    with pytest.raises(ValueError, match="does not record the run's config"):
        toolkit.refresh_model_card(tmp_path)

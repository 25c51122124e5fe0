"""The model card of every released checkpoint, written from the runs' all_results.json alone: each run folder of
`--results_dirs` becomes `--output_dir`/<run>.md (default model_cards/), with the package's templates
(`hf_settransformer.toolkit.cards`). The default folders: the two decoders trained with train_lm.py's default
training methods (results/wikitext2-methods/combined/<run>/), the 90 CPU-minute WikiText-2 grid
(results/wikitext2-90min-v2/<run>/) and its decayed linear runs (results/wikitext2-90min-decay/<run>/, whose
undecayed same-CPU baselines share the grid's run names). A run whose name an earlier folder already has is the
earlier folder's (the script says which it leaves out). The cards describe the weights in the runs' `outputs/`
folders, named on the Hub by the run's name until `scripts/push_run.py` writes the card again for the repository it
pushes to.

    python scripts/make_model_cards.py                 # rewrites model_cards/ (after a change to the templates)
    python scripts/make_model_cards.py --check         # writes nothing; exits 1 naming each card that differs

tests/scripts/test_model_cards.py checks that model_cards/ is what this writes.
"""

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_settransformer.toolkit.cards import read_results, refresh_model_card

ROOT = Path(__file__).resolve().parents[1]
RELEASED = ["wikitext2-methods/combined", "wikitext2-90min-v2", "wikitext2-90min-decay"]  # the released runs


@dataclass
class Arguments:
    results_dirs: list[str] = field(
        default_factory=lambda: [str(ROOT / "results" / name) for name in RELEASED],
        metadata={"help": "Folders of run folders, each with the run's all_results.json; an earlier folder's run wins."},
    )
    output_dir: str = field(default=str(ROOT / "model_cards"), metadata={"help": "Where <run>.md are written."})
    check: bool = field(default=False, metadata={"help": "Compare with --output_dir instead of writing to it."})


def runs(results_dirs, quiet=False):
    """The released run folders of `results_dirs` (those with an all_results.json), one per run name: the first
    folder's where several have it. A ValueError naming a folder without any run."""
    chosen = {}
    for folder in map(Path, results_dirs):
        found = sorted(path.parent for path in folder.glob("*/all_results.json"))
        if not found:
            raise ValueError(f"No run folder with an all_results.json in {folder}.")
        for run in found:
            if run.name in chosen:
                if not quiet:
                    print(f"[make_model_cards] {run}: no card, {chosen[run.name]} is the released run of that name")
                continue
            chosen[run.name] = run
    return [chosen[name] for name in sorted(chosen)]


def write_cards(results_dirs, output_dir, quiet=False):
    """Writes <run>.md in `output_dir` for every released run of `results_dirs` (`runs`); returns their paths."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    return [refresh_model_card(run, card_path=Path(output_dir) / f"{run.name}.md") for run in runs(results_dirs, quiet)]


def main(argv=None):
    (args,) = HfArgumentParser(Arguments).parse_args_into_dataclasses(argv)
    try:  # a folder without runs, or a run whose all_results.json is damaged: named, no traceback
        make_or_compare(args)
    except ValueError as error:
        raise SystemExit(f"[make_model_cards] {error}") from None


def make_or_compare(args):
    """main's work: writes the cards, or with --check compares them. Every run's all_results.json is read first: a
    ValueError names a folder without runs or a damaged file before any card is written."""
    for run in runs(args.results_dirs, quiet=True):
        read_results(run)
    if not args.check:
        written = write_cards(args.results_dirs, args.output_dir)
        print(f"[make_model_cards] wrote {len(written)} cards to {args.output_dir}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {path.name: path.read_text() for path in write_cards(args.results_dirs, tmp, quiet=True)}
    kept = {path.name: path.read_text() for path in Path(args.output_dir).glob("*.md")}
    stale = sorted(name for name in fresh.keys() | kept.keys() if fresh.get(name) != kept.get(name))
    if stale:
        folders = ", ".join(args.results_dirs)
        sys.exit(f"[make_model_cards] differ from {folders} (run the script to write them): {', '.join(stale)}")
    print(f"[make_model_cards] the {len(fresh)} cards of {args.output_dir} are up to date")


if __name__ == "__main__":
    main()

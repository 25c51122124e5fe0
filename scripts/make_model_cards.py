"""The model card of every released checkpoint, written from the runs' all_results.json alone: each run folder of
`--results_dir` (default: the 90 CPU-minute WikiText-2 grid, results/wikitext2-90min-v2/<run>/) becomes
`--output_dir`/<run>.md (default model_cards/), with the package's templates (`hf_settransformer.toolkit.cards`). The
cards describe the weights in the grid's `outputs/` folders, named on the Hub by the run's name until
`scripts/push_run.py` writes the card again for the repository it pushes to.

    python scripts/make_model_cards.py                 # rewrites model_cards/ (after a change to the templates)
    python scripts/make_model_cards.py --check         # writes nothing; exits 1 naming each card that differs

tests/test_model_cards.py checks that model_cards/ is what this writes.
"""

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_settransformer.toolkit.cards import refresh_model_card

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Arguments:
    results_dir: str = field(default=str(ROOT / "results" / "wikitext2-90min-v2"),
                             metadata={"help": "Folder of run folders, each with the run's all_results.json."})
    output_dir: str = field(default=str(ROOT / "model_cards"), metadata={"help": "Where <run>.md are written."})
    check: bool = field(default=False, metadata={"help": "Compare with --output_dir instead of writing to it."})


def runs(results_dir):
    """The run folders of `results_dir`: those with an all_results.json, by name."""
    return sorted(path.parent for path in Path(results_dir).glob("*/all_results.json"))


def write_cards(results_dir, output_dir):
    """Writes <run>.md in `output_dir` for every run of `results_dir`; returns their paths."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    return [refresh_model_card(run, card_path=Path(output_dir) / f"{run.name}.md") for run in runs(results_dir)]


def main(argv=None):
    (args,) = HfArgumentParser(Arguments).parse_args_into_dataclasses(argv)
    if not runs(args.results_dir):
        raise SystemExit(f"No run folder with an all_results.json in {args.results_dir}.")
    if not args.check:
        written = write_cards(args.results_dir, args.output_dir)
        print(f"[make_model_cards] wrote {len(written)} cards to {args.output_dir}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {path.name: path.read_text() for path in write_cards(args.results_dir, tmp)}
    kept = {path.name: path.read_text() for path in Path(args.output_dir).glob("*.md")}
    stale = sorted(name for name in fresh.keys() | kept.keys() if fresh.get(name) != kept.get(name))
    if stale:
        sys.exit(f"[make_model_cards] differ from {args.results_dir} (run the script to write them): {', '.join(stale)}")
    print(f"[make_model_cards] the {len(fresh)} cards of {args.output_dir} are up to date")


if __name__ == "__main__":
    main()

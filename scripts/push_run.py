"""Publish a finished `train_lm.py` run (a grid run, say) to the Hugging Face Hub afterwards, as `--push_to_hub` would
have at the end of training: the model card is written again for the repository's name (the card's code loads
`repo_id`), then the folder goes up without checkpoints, pickles or the run's lock (`push_folder_to_hub`).

    python scripts/push_run.py outputs/wikitext2-90min-v2/perceiver_io-linear-exp you/wikitext2-perceiver-io-linear-exp
    python scripts/push_run.py RUN_DIR REPO_ID --private --token hf_...     (or HF_TOKEN / `hf auth login`)

A folder that is not a finished run is refused naming what it lacks, and so is one that a live run holds (its lock,
`.hfst_run.lock`): the upload would take a half-written state. So is one whose model would not load as its config.json
claims (weights cut short, of another shape or dtype, a shard or a modeling file missing, a tokenizer that does not
load): nothing is uploaded. Only the model's files go up; the rest of the folder (checkpoints, pickles, notes) is left
out and named. The card gives what the run measured: one trained without --do_predict has no test perplexity in it.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

# a finished run has these (train_lm.py writes the results last, after the model, tokenizer and card)
NEEDED = ("all_results.json", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def read_json_object(path):
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise SystemExit(f"{path} is not valid JSON ({err}): not publishing a run whose files are damaged.") from None
    if not isinstance(value, dict):
        raise SystemExit(f"{path} holds a JSON {type(value).__name__}, not an object: not publishing it.")
    return value


def check_finished_run(run_dir):
    """Raises SystemExit naming what `run_dir` lacks to be a finished run. Its card gives what the run measured: a
    run without --do_predict (say) is published with a card that has no test perplexity."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SystemExit(f"{run_dir} is not a folder.")
    missing = [name for name in NEEDED if not (run_dir / name).is_file()]
    if missing:
        raise SystemExit(f"{run_dir} is not a finished train_lm.py run: no {', '.join(missing)} there.")
    _, config = (read_json_object(run_dir / name) for name in ("all_results.json", "config.json"))  # both readable
    refs = [r for v in config.get("auto_map", {}).values() for r in (v if isinstance(v, (list, tuple)) else [v]) if r]
    code = sorted({ref.split("--")[-1].split(".")[0] + ".py" for ref in refs})  # "repo--module.Class" or "module.Class"
    absent = [name for name in code if not (run_dir / name).is_file()]
    if not code or absent:
        raise SystemExit(
            f"{run_dir}: config.json's auto_map names modeling code that is not there "
            f"({', '.join(absent) or 'no auto_map'}): it would not load with trust_remote_code=True."
        )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a train_lm.py --output_dir with a finished run")
    p.add_argument("repo_id", help="the Hub repository, namespace/name (created if it does not exist)")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--token", default=None, help="a Hub token (default: HF_TOKEN or the stored login)")
    args, unknown = p.parse_known_args(argv)
    if unknown:  # named with the nearest flag (the toolkit, and with it torch, loads on this path only)
        from hf_settransformer.toolkit.cli import unknown_flags_message

        p.error(unknown_flags_message(p, unknown))
    from huggingface_hub.errors import StrictDataclassError
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:  # everything is checked before the card is rewritten: a refused push leaves the folder as it was
        validate_repo_id(args.repo_id)
        if args.repo_id.count("/") != 1:
            raise HFValidationError("it has no namespace (a user or organisation)")
    except HFValidationError as err:
        raise SystemExit(f"repo_id {args.repo_id!r} is not a valid Hub repository id: expected namespace/name, e.g. "
                         f"you/wikitext2-decoder ({err})") from None
    check_finished_run(args.run_dir)

    # torch and transformers: after the cheap checks
    from hf_settransformer.toolkit import log_to_stdout, refresh_model_card
    from hf_settransformer.toolkit.hub import HubUnreachableError, publishable_files, push_folder_to_hub, reach_hub
    from hf_settransformer.toolkit.run_folder import write_text_atomically
    from hf_settransformer.toolkit.run_lock import OutputDirLock, OutputDirLockedError

    logger = log_to_stdout()  # its lines and the toolkit's (what a push leaves out, say) on stdout

    card = args.run_dir / "README.md"
    try:
        with OutputDirLock(args.run_dir, " ".join(sys.argv)), tempfile.TemporaryDirectory() as scratch:
            publishable_files(args.run_dir)  # its model loads as config.json claims: before the Hub or the card
            # the card is made aside and the Hub reached first: a refused push leaves the folder as it was
            fresh = refresh_model_card(args.run_dir, repo_id=args.repo_id, card_path=Path(scratch) / "README.md")
            api = reach_hub(args.repo_id, token=args.token, private=args.private)
            before = card.read_bytes() if card.is_file() else None
            write_text_atomically(card, fresh.read_text(encoding="utf-8"))
            logger.info(f"[push_run] model card for {args.repo_id}: {card}")
            try:
                info = push_folder_to_hub(args.run_dir, args.repo_id, api=api)
            except HubUnreachableError:
                if before is None:  # the folder as it was
                    card.unlink()
                else:
                    kept = card.with_name(f".{card.name}.tmp-{os.getpid()}")  # through a temporary file: never half
                    kept.write_bytes(before)
                    os.replace(kept, card)
                raise
    # a live run holds it, no card from it, or a model that does not load (UnpublishableFolderError, a ValueError)
    except (OutputDirLockedError, ValueError, StrictDataclassError) as err:
        raise SystemExit(f"Not publishing {args.run_dir}: {err}") from None
    except HubUnreachableError as err:
        raise SystemExit(f"Not published, and {args.run_dir} is as it was: {err}. Check the network, HF_HUB_OFFLINE, "
                         "the token (--token, HF_TOKEN or `hf auth login`) and your rights to the repository.") from None
    logger.info(f"[push_run] pushed {args.run_dir} to {args.repo_id}: {getattr(info, 'commit_url', info)}")

if __name__ == "__main__":
    main()

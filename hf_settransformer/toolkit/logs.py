"""The scripts' log lines on stdout (`log_to_stdout`). Where nothing configures logging, the toolkit's warnings reach
stderr (Python's last-resort handler)."""

import logging
import sys

from transformers.utils import logging as hf_logging

LOGGER_ROOT = "hf_settransformer"


class _StdoutHandler(logging.StreamHandler):
    """A handler that writes to whatever `sys.stdout` is when a record arrives (a notebook's or pytest's capture
    replaces it after the handler is made)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


def log_to_stdout(main_process=True):
    """How the scripts show messages: the `hf_settransformer` loggers (the toolkit's and the scripts', made with
    transformers' `logging.get_logger`) write one plain line each to stdout, INFO and up on the main process and
    WARNING and up on the others (as transformers' example scripts log from the main process). Returns the scripts'
    logger (`hf_settransformer.scripts`). Calling it again only sets the level."""
    root = logging.getLogger(LOGGER_ROOT)
    if not any(isinstance(h, _StdoutHandler) for h in root.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO if main_process else logging.WARNING)
    return hf_logging.get_logger(f"{LOGGER_ROOT}.scripts")

"""MQBench's logger: ``logging.getLogger("MQBENCH")``, ``[MQBENCH] LEVEL: msg`` on stdout."""
import logging
import sys

logger = logging.getLogger("MQBENCH")
logger.setLevel(logging.INFO)
logger.propagate = False
if not logger.handlers:
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[MQBENCH] %(levelname)s: %(message)s"))
    logger.addHandler(_handler)


def set_log_level(level):
    """Sets the level of the ``MQBENCH`` logger (a ``logging`` level or its name)."""
    logger.setLevel(level)
    for handler in logger.handlers:
        handler.setLevel(level)


def disable_logging():
    """Removes every handler of the ``MQBENCH`` logger."""
    for handler in list(logger.handlers):
        logger.removeHandler(handler)


def log_deploy_passes(passes):
    """Logs the C++ deploy passes a translator ran, one DEBUG line each, by name.

    Args:
        passes: ``(name, nodes before, nodes after, milliseconds)`` tuples, as
            ``mqbench._C.deploy_run(..., passes=[])`` fills them. The names are the pass files
            under ``src/deploy/passes/`` (``set_log_level("DEBUG")`` shows them).
    """
    for name, before, after, ms in passes:
        logger.debug(f"deploy pass {name}: {before} -> {after} nodes, {ms:.1f} ms")


def log_deploy_notes(notes):
    """Logs a translator's notes: at WARNING those that start ``"warning: "`` (a Tensorrt
    deploy of float layers, allowed by ``allow_float_layers``), at INFO the others.

    Args:
        notes: the strings ``mqbench._C.deploy_run`` / ``deploy_translate`` return.
    """
    for note in notes:
        if note.startswith("warning: "):
            logger.warning(note[len("warning: "):])
        else:
            logger.info(note)

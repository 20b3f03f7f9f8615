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

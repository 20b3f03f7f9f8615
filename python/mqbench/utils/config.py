"""Checking user configuration: unknown keys and names are refused with the valid choices and
the closest one (MQBench's own docs misspell ``concrete_args``; a typo must not pass silently
nor leave the user to read a list of twenty names)."""
import difflib

__all__ = ["UnknownNameError", "check_keys", "closest", "unknown_name"]


class UnknownNameError(ValueError, AssertionError):
    """An unknown backend, observer, fake quantizer or config key. A ValueError that names the
    valid choices; also an AssertionError, which is what MQBench raised."""


def closest(name, valid):
    """`` (did you mean 'x'?)`` for the valid choice closest to ``name``, or ``''``."""
    match = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def check_keys(d, valid, what):
    """Raises UnknownNameError naming each unknown key of dict ``d``, the closest valid key, and
    the valid ones."""
    unknown = sorted(set(d) - set(valid), key=str)
    if unknown:
        hints = "; ".join(f"{k!r}{closest(k, valid)}" for k in unknown)
        raise UnknownNameError(f"unknown {what} keys: {hints}; valid keys: {list(valid)}")


def unknown_name(name, valid, what):
    """The UnknownNameError for an unknown ``what`` called ``name`` (to raise)."""
    valid = list(valid)
    return UnknownNameError(f"unknown {what} {name!r}{closest(name, valid)}; "
                            f"valid names: {valid}")

"""Type checks at the public entry points (``prepare_by_platform``, ``convert_deploy``,
``ptq_reconstruction``, ``profiling``): a wrong argument fails at once with its name, what it got
and the signature, not deep inside the work. The common case is a call written for another
MQBench release, whose positional order differed (MQBench's own ``test_load_ckpt.py`` calls
``prepare_by_platform(model, backend, True, config, None, True)``).
"""
import inspect

__all__ = ["check_arg"]

_ORDINALS = {1: "1st", 2: "2nd", 3: "3rd"}


def _describe(value):
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def check_arg(func, name, value, ok, expected):
    """Raises TypeError unless ``ok(value)``.

    Args:
        func: the public function (its name and signature go into the message).
        name: the parameter's name.
        value: what the caller passed.
        ok: predicate over ``value``.
        expected: what the parameter takes, in words (``"a dict or None"``).
    """
    if ok(value):
        return
    params = list(inspect.signature(func).parameters)
    where = ""
    if name in params:
        k = params.index(name) + 1
        where = f" ({_ORDINALS.get(k, f'{k}th')} positional)"
    raise TypeError(f"{func.__name__}: argument {name!r}{where} got {_describe(value)}; expected "
                    f"{expected}. The signature is {func.__name__}{inspect.signature(func)}; "
                    "pass the later arguments by keyword when unsure of their order")

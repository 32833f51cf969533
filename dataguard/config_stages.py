"""Building stages from a config's ``stages:`` list and ``normalize:`` mapping.

Each stage checks its own parameters (declared in ``Stage.constraints``, see
`dataguard.params`) and raises `StageConfigError` naming the parameter; here that becomes a
`ConfigError` at the parameter's line. Parameters that name local files (a tokenizer, a
model folder) are checked first, so a missing file is a config error, not a worker's crash.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from dataguard.config_yaml import Located, _one_line
from dataguard.stage import Stage, StageConfigError
from dataguard.stages import STAGE_PATHS, stage_class


def build_stages(value: Any, loc: Located) -> list[Stage]:
    if not isinstance(value, list):
        raise loc.error(("stages",), "must be a list like [{length: {percentile: 90}}]")
    stages = []
    for i, item in enumerate(value):
        here = ("stages", i)
        if isinstance(item, str):
            item = {item: {}}
        if not isinstance(item, dict) or len(item) != 1:
            raise loc.error(here, "each stage must be one `name: {params}` mapping")
        (name, params), = item.items()
        if name not in STAGE_PATHS:
            raise loc.error(here + (name,), f"unknown stage (expected one of: {', '.join(STAGE_PATHS)})")
        stages.append(_build(stage_class(name), params, loc, here + (name,)))
    return stages


def build_normalizer(params: Any, loc: Located) -> Stage:
    from dataguard.stages.normalize import Normalizer

    return _build(Normalizer, params, loc, ("normalize",))

def _path_checks() -> dict[str, Callable[[Any], None]]:
    """Parameters that name local files, checked here for every stage that takes them
    (raise ValueError starting with the parameter name), so a missing tokenizer or model
    is a config error at its line, not a worker's crash an hour into the run."""
    from dataguard.text.embeddings import check_model_path
    from dataguard.text.tokenizers import check_tokenizer_spec

    return {"tokenizer": check_tokenizer_spec, "model": check_model_path}


def _build(cls: type[Stage], params: Any, loc: Located, here: tuple[Any, ...]) -> Stage:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise loc.error(here, "stage parameters must be a mapping")
    accepted = _accepted_params(cls)
    for key in params:
        if accepted is not None and key not in accepted:
            raise loc.error(here + (key,), f"unknown parameter (expected one of: {', '.join(sorted(accepted))})")
    for key, check in _path_checks().items():
        if params.get(key) is not None:
            try:
                check(params[key])
            except ValueError as exc:
                raise loc.error(here + (key,), _strip_param(str(exc), key)) from None
            except OSError as exc:  # e.g. a folder on the way that we may not enter
                raise loc.error(here + (key,), f"cannot read: {exc.strerror or exc}: {params[key]}") from None
    try:
        return cls(**params)
    except StageConfigError as exc:
        found = exc.problem
        if found is not None and found.path and found.path[0] in params:  # a constraint: its key path
            raise loc.error(here + found.path, _one_line(found.message)) from None
        bad = _blamed_param(exc, params)
        message = _strip_param(str(exc), bad) if bad else str(exc)
        raise loc.error(here + ((bad,) if bad else ()), _one_line(message)) from None
    except (TypeError, ValueError) as exc:
        raise loc.error(here, f"invalid parameters: {_one_line(str(exc))}") from None
    except OSError as exc:  # a stage reading a file it was given (e.g. a reference set)
        raise loc.error(here, _one_line(f"{exc.strerror or exc}: {exc.filename or ''}")) from None


def _blamed_param(exc: StageConfigError, params: dict[str, Any]) -> str | None:
    """The parameter a StageConfigError is about: its ``param`` attribute when set, else
    the key its message starts with ("mode: must be ..."), else a key it names as a word."""
    param = getattr(exc, "param", None)
    if isinstance(param, str) and param in params:
        return param
    message = str(exc)
    keys = sorted((k for k in params if isinstance(k, str)), key=len, reverse=True)
    starts = next((k for k in keys if re.match(rf"{re.escape(k)}\b", message)), None)
    if starts is not None:
        return starts
    return next((k for k in keys if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", message)), None)


def _strip_param(message: str, param: str) -> str:
    """'mode: must be ...' -> 'must be ...' (the key path already names the parameter)."""
    prefix = f"{param}:"
    return message[len(prefix):].strip() if message.startswith(prefix) else message


def _accepted_params(cls: type[Stage]) -> set[str] | None:
    sig = inspect.signature(cls.__init__)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return {name for name, p in sig.parameters.items() if name != "self"
            and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}

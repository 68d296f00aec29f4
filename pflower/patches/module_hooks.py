"""``resident-model-hooks``: whether a hook is left on a model, from torch's private
hook dicts.

A client thread keeps its model across rounds (client_app/build.py) only if no
hook is left on it: a method that registers one removes it, and a model that still
holds one is replaced by a fresh copy. torch has no public way to ask, so this
reads each module's ``_forward_hooks``, ``_forward_pre_hooks`` and
``_backward_hooks`` and each parameter's ``_backward_hooks``, as torch 2.13 and 2.14
keep them. With ``PFLOWER_FLOWER_PATCHES=0`` (or a torch it was not checked against)
every model counts as hooked: each client gets a fresh copy, slower and the same.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pflower.patches.core import applies, check, enabled

MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")


def hooks_left(model: Any) -> bool:
    """Whether a hook is left on ``model`` (a torch module) or any of its parameters;
    True with the patch off, where nothing is read."""
    if not enabled() or not _checked():
        return True
    return any(getattr(p, "_backward_hooks", None) for p in model.parameters()) or any(
        getattr(m, name, None) for m in model.modules() for name in MODULE_HOOKS
    )


@cache
def _checked() -> bool:
    """Whether the installed torch is one this patch was checked against (another that
    no patch was is refused, as by every patch)."""
    check(("torch",))
    return applies("resident-model-hooks")

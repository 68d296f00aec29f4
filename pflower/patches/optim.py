"""``optimizers-without-dynamo``: torch's SGD and Adam without torch._dynamo's wrappers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pflower.patches.core import check, enabled


def optimizers() -> tuple[type, type]:
    """``optimizers-without-dynamo``: (SGD, Adam). torch.optim imports torch._dynamo on
    an optimizer's first use: its methods are wrapped by
    ``torch._compile._disable_dynamo`` (imports on first call) and ``step()`` by a
    graph-break wrapper (imports on every call). That is 2-5 s in every new process,
    and a deployed ClientApp is a new process per message. Nothing here is compiled,
    so these two skip the wrappers and do exactly what they do outside compilation
    (tests/test_client_start.py: bit-identical updates, no torch._dynamo import).
    With the patches off, torch's own classes."""
    import torch

    if not enabled():
        return torch.optim.SGD, torch.optim.Adam
    check(("torch",))

    def undecorated(fn: Callable[..., Any]) -> Callable[..., Any]:
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        return fn

    def without_graph_break(base: type) -> type:
        raw_step = undecorated(base.step)

        def step(self: Any, closure: Callable[[], float] | None = None) -> Any:
            with torch.set_grad_enabled(self.defaults["differentiable"]):
                return raw_step(self, closure)

        return type(base.__name__, (base,), {"step": step, "__module__": __name__})

    # pre-fill the cache _disable_dynamo's wrapper fills on its first call
    inner_code = torch._compile._disable_dynamo(lambda: None).__code__
    for cls in (torch.optim.Optimizer, torch.optim.SGD, torch.optim.Adam):
        for attr in vars(cls).values():
            fn = getattr(attr, "__wrapped__", None)
            if getattr(attr, "__code__", None) is inner_code and fn is not None:
                setattr(fn, "__dynamo_disable", fn)
    return without_graph_break(torch.optim.SGD), without_graph_break(torch.optim.Adam)

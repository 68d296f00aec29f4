"""One aggregation path: a round is streamed unless the run or the method's card says
why it must hold every reply, and a streamed round ends where the held round ends."""

from __future__ import annotations

import numpy as np
import pytest

from methods import get_method, method_names
from server_app.method_strategy import strategy_class
from strategies.base import PFLStrategy, Reply
from tests.helpers import config, make_strategy

# The largest difference between a method's streamed and held global arrays after two
# in-process rounds, over every method: 0 (bit-equal) when measured, as both sum in
# double-double (strategies/robust.py RunningMean) and cast back once. Kept at 0.
TOLERANCE = 0.0


@pytest.mark.parametrize("method", method_names())
def test_a_strategy_overrides_aggregate_only_where_its_card_says_why(method: str) -> None:
    overrides = strategy_class(get_method(method)).aggregate is not PFLStrategy.aggregate
    assert not overrides or get_method(method).per_client, (
        f"{method}'s strategy has its own aggregate: its card must say why (per_client)"
    )


def test_a_strategy_that_overrides_aggregate_without_a_reason_is_refused() -> None:
    class Undeclared(PFLStrategy):
        def aggregate(self, server_round: int, replies: list[Reply]) -> None:
            super().aggregate(server_round, replies)

    cfg = config(method="fedavg")
    base = make_strategy(cfg)
    args = dict(cfg=cfg, spec=base.spec, initial=base.global_arrays, model=None)
    with pytest.raises(TypeError, match="Undeclared overrides aggregate"):
        Undeclared(**args)
    # declared: built, and its rounds held with the reason named
    held = Undeclared(**args, holds_replies="it mixes every reply its own way")
    assert "it mixes every reply its own way" in held.held_reason
    assert held.open_streamed_round(1, [1, 2, 3]) is None


@pytest.mark.parametrize("method", method_names())
def test_a_round_is_held_exactly_where_a_rule_needs_every_reply(method: str) -> None:
    card = get_method(method)
    strategy = make_strategy(config(method=method))
    if card.per_client:
        assert card.per_client in strategy.held_reason
    else:
        assert strategy.held_reason == ""
        assert strategy.open_streamed_round(1, [1, 2, 3]) is not None
    off = make_strategy(config(method=method, streamed_aggregation=False))
    assert off.held_reason and off.open_streamed_round(1, [1, 2, 3]) is None


@pytest.mark.slow
@pytest.mark.parametrize("method", method_names())
def test_two_rounds_streamed_and_held_give_the_same_global_arrays(method: str, tmp_path) -> None:  # noqa: ANN001
    from pflower.engine.inprocess import build_inprocess

    finals = []
    for streamed in (True, False):
        raw = {
            "method": method,
            "num-server-rounds": 2,
            "sim-samples": 60,
            "hidden-dim": 16,
            "streamed-aggregation": streamed,
            "output-dir": str(tmp_path),
            "run-name": f"{method}-{streamed}",
        }
        server, rounds = build_inprocess(raw, 3)
        server.fit(rounds, timeout=None)
        assert bool(server.strategy.held_reason) != streamed or get_method(method).per_client
        finals.append([a.copy() for a in server.strategy.global_arrays])
    streamed_arrays, held_arrays = finals
    assert len(streamed_arrays) == len(held_arrays)
    for s, h in zip(streamed_arrays, held_arrays, strict=True):
        assert s.dtype == h.dtype and s.shape == h.shape
        if s.size:
            diff = np.abs(s.astype(np.float64) - h.astype(np.float64)).max()
            assert diff <= TOLERANCE, f"{method}: streamed and held differ by {diff}"


def test_adding_a_method_says_how_many_lines_an_aggregations_author_reads() -> None:
    """docs/ADDING_A_METHOD.md names the core an aggregation's author reads and its
    length: the figure is the file's, and the core stays short enough to read."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "ADDING_A_METHOD.md").read_text()
    said = re.search(
        r"`strategies/aggregation\.py` \(how a\s+round's replies.*?: (\d+) lines\)", page, re.S
    )
    assert said, "ADDING_A_METHOD.md no longer says how long strategies/aggregation.py is"
    lines = len((root / "strategies" / "aggregation.py").read_text().splitlines())
    assert int(said.group(1)) == lines <= 600

"""The command line a researcher scripts (``bash scripts/dev.sh check|run``).

``check``: merge the app's defaults with ``--run-config`` exactly as Flower does,
validate with the run config's pydantic model, run the cheap data checks; one
line and exit 2 on a bad config, no traceback. ``run``: the same pre-flight,
then ``flwr run . --stream``, then the exit status from how the run ended
(results.json holds every round: 0; anything else: 1).
"""

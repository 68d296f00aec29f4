"""One-off studies: each module answered one question once, and its docstring's first
paragraph says what it answered and where the answer is written (docs/notes/ for the
history, docs/PERFORMANCE.md or docs/results/ where it is a current figure). They
import the product and still run (tests/test_benchmarks_modules.py runs each one's
``--help``; tests/test_benchmarks.py runs most on small inputs), but none is part of
what a user runs: that is ``python -m benchmarks`` and the modules beside this folder.
"""

"""Speed and memory targets, as ratios against the stock flow measured in the same run (``make bench``).

Each ``benchmarks/bench_*.py`` module has ``main() -> bool``: it prints its figures and returns True
when every target is met. ``python -m benchmarks`` runs them all.
"""

"""Speed and memory targets, as ratios against the stock flow measured in the same run (``make bench``).

Each ``benchmarks/bench_*.py`` module has a ``main()`` that prints its figures; it returns ``False``
when a target is missed. ``python -m benchmarks`` runs them all.
"""

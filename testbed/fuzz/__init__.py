"""A graph fuzzer of xnnguard's own: small random networks of the domain through the flow in every mode.

* ``catalogue``: the ops a network is made of (Conv3d to attention masks), each written as source with
  random parameters;
* ``generator``: ``generate(seed)``, a seeded chain of catalogue ops, kept only where it runs eagerly, as a
  readable standalone module (the repro);
* ``runner``: each (network, mode) program through ``testbed.flow.lower_and_run`` in a child process,
  classified (ok, wrong, a stage failed, crash, timeout, invalid) with delegates and what stayed outside;
* ``report``: the Markdown report of a run and a repro script per finding;
* ``warm``: what the runner's fork server imports, so that each child starts warm.

``make fuzz`` (``python -m testbed.fuzz``) runs it; ``tests/test_fuzz.py`` runs a few fixed seeds.
"""

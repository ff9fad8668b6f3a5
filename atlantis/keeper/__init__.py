"""The lease keeper: a process that ends attempts whose lease runs out, whatever else runs.

Started by each supervisor (``python -m atlantis.keeper``), in a session of its own, it
never runs handler code: see :mod:`atlantis.keeper.main`.
"""

"""A Jepsen-style run of atlantis: supervisors serve jobs while faults are injected at random,
then the recorded history is checked against the product's promises. ``python -m chaos``."""

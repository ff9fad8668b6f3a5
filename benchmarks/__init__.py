"""Throughput and latency benchmarks, run side by side with the peers (not by the test suite)."""

"""Ballast benchmarks (`make bench`, `python -m bench.run`): readable reports, not tests."""

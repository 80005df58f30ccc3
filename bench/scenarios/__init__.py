"""The incident bench (issue 12): seed incidents replayed through real Envoy, Ballast against the
baseline the seed compares with, reported with plots. Run `python -m bench.scenarios NAME`."""

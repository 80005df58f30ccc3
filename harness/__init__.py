"""The harness: what `make run`, the tests and the benchmarks share (demo origins, real Envoy
processes, traffic, simulated xDS clients, example models, scenarios). Not part of the wheel;
nothing under control_plane/ imports it."""

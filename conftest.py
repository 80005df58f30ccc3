"""Set-up every test module shares (tests/ and bench/'s smoke tests), applied before any of them
imports gRPC."""

import os

# Tests fork real Envoys, Prometheus and etcd while gRPC threads of this same process serve and
# stream. With gRPC's fork support on, its fork handlers run around each fork, and a child about
# to exec can die there: seen as an Envoy that "exited with -6" before it started, its log
# holding only gRPC's "Epoll1Poller encountered epoll_wait error: Bad file descriptor" (one
# failure in a few full runs). Nothing here needs gRPC in a forked child, so, like `make run`,
# the test process turns fork support off; it only takes effect before grpc is imported.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

from hypothesis import HealthCheck, settings

# Property tests are deterministic here: the same examples every run (a failure reproduces, a
# pass does not depend on luck), no per-example deadline and no "too slow" health check (on a
# loaded 2-core machine a 200 ms deadline failed an example that takes 20 ms when quiet), and
# no example database carried between runs. Explore new examples with
# `pytest --hypothesis-profile=explore`.
settings.register_profile(
    "suite", derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

"""Set-up every test module shares, applied before any of them imports gRPC."""

import os

# Tests fork real Envoys, Prometheus and etcd while gRPC threads of this same process serve and
# stream. With gRPC's fork support on, its fork handlers run around each fork, and a child about
# to exec can die there: seen as an Envoy that "exited with -6" before it started, its log
# holding only gRPC's "Epoll1Poller encountered epoll_wait error: Bad file descriptor" (one
# failure in a few full runs). Nothing here needs gRPC in a forked child, so, like `make run`,
# the test process turns fork support off; it only takes effect before grpc is imported.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

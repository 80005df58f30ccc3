"""Typed JSON's lazy import of a message's package, looked up from two threads at once (two
replicas in one process reloading the same file, a reload beside `validate`): the second
thread must find the type, not see the package noted as imported while the first is still
importing it. In a fresh interpreter (the package not imported yet), the first thread's import
held open until the second has looked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import importlib, threading
    from control_plane.desired import typed_json

    NAME = "envoy.extensions.filters.http.compressor.v3.Compressor"
    real = importlib.import_module
    inside, looked = threading.Event(), threading.Event()

    def held(name, *args):
        if threading.current_thread().name == "first" and not inside.is_set():
            inside.set()
            looked.wait(2)  # the second thread looks while this import is under way
        return real(name, *args)

    importlib.import_module = held
    found = {}

    def look(who):
        found[who] = typed_json.known_type(NAME)
        if who == "second":
            looked.set()

    first = threading.Thread(target=look, args=("first",), name="first")
    first.start()
    inside.wait(2)
    look("second")
    first.join()
    print(found["first"], found["second"])
""")


def test_a_type_looked_up_while_another_thread_imports_its_package_is_found() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr

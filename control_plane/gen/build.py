"""Compile `protos/**/*.proto` into `control_plane/gen/` with grpcio-tools.

`make protos` runs this; the output is committed. `--check` regenerates into a temporary folder
and fails if the committed files differ (the test-suite runs it).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
OUT = ROOT / "control_plane" / "gen"
KEEP = {"__init__.py", "build.py"}


def compile_into(out: Path) -> list[Path]:
    from grpc_tools import protoc

    sources = sorted(PROTOS.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    for source in sources:
        code = protoc.main(
            [
                "protoc",
                f"-I{PROTOS}",
                f"-I{include}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                *([f"--grpc_python_out={out}"] if _declares_service(source) else []),
                str(source),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {source}")
    generated = [p for p in out.rglob("*") if p.is_file()]
    for path in generated:
        if path.suffix in {".py", ".pyi"}:
            path.write_text(_rehome_imports(path.read_text()))
    for folder in {p.parent for p in generated}:
        if folder != out:
            (folder / "__init__.py").touch()
    return sorted(p for p in out.rglob("*") if p.is_file())


def _declares_service(source: Path) -> bool:
    """gRPC stubs only for files that define a service (the others would be empty modules)."""
    return re.search(r"^service\s", source.read_text(), flags=re.M) is not None


def _rehome_imports(code: str) -> str:
    """protoc writes `from ballast.v1 import x_pb2`; our package lives under control_plane.gen."""
    return re.sub(r"^(from|import) ballast\.", r"\1 control_plane.gen.ballast.", code, flags=re.M)


def generated_files(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p
        for p in root.rglob("*")
        if p.is_file() and p.name not in KEEP | {"__pycache__"} and "__pycache__" not in p.parts
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed output is stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        compile_into(fresh)
        new = generated_files(fresh)
        old = generated_files(OUT)
        if args.check:
            stale = sorted(
                name
                for name in set(new) | set(old)
                if name not in new or name not in old or not filecmp.cmp(new[name], old[name])
            )
            if stale:
                print("generated protos are stale, run `make protos`: " + ", ".join(stale))
                return 1
            return 0
        for name in set(old) - set(new):
            old[name].unlink()
        for name, path in new.items():
            target = OUT / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())

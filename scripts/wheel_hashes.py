"""Print a pip requirements file pinning every distribution in a wheelhouse by sha256.

    python scripts/wheel_hashes.py WHEELHOUSE > wheel-hashes.txt

The image build installs with ``pip install --require-hashes --no-deps -r`` that file
(docker/app.Dockerfile), so whatever serves the wheels to the build, only these
bytes are installed: pip refuses a file whose hash differs.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from packaging.utils import parse_sdist_filename, parse_wheel_filename


def requirement(path: Path) -> str:
    """``name==version --hash=sha256:...`` for one wheel or sdist."""
    if path.suffix == ".whl":
        name, version, *_ = parse_wheel_filename(path.name)
    else:
        name, version = parse_sdist_filename(path.name)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return f"{name}=={version} --hash=sha256:{digest}"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    files = sorted(
        p for p in Path(argv[0]).iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip"))
    )
    if not files:
        print(f"wheel_hashes: no wheel or sdist in {argv[0]}", file=sys.stderr)
        return 1
    print("\n".join(requirement(p) for p in files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

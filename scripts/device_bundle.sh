#!/usr/bin/env bash
# Makes .whl/site.tar.gz: pydantic and Ray (with their dependencies) for a bare GPU machine's
# python3.12 on x86-64, which scripts/device_check.sh unpacks into /tmp/site. Ray's Java jars,
# its dashboard's web files and its libraries seedgrid does not use (RLlib, Tune, Train, Serve,
# Data, LLM, AIR) are left out so that the bundle travels (about 45 MB). Versions: this
# checkout's environment's Ray and pydantic.
#
#   bash scripts/device_bundle.sh            # needs the package index (pip download)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
ray_version=$("$PY" -c "import ray; print(ray.__version__)")
pydantic_version=$("$PY" -c "import pydantic; print(pydantic.VERSION)")
core_version=$("$PY" -c "import pydantic_core; print(pydantic_core.__version__)")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$work/wheels" \
  "ray==$ray_version" "pydantic==$pydantic_version" "pydantic_core==$core_version" annotated-types \
  typing-inspection typing_extensions click filelock jsonschema attrs \
  jsonschema-specifications referencing rpds-py "msgpack<2" packaging protobuf requests \
  charset-normalizer idna urllib3 certifi
mkdir -p "$work/site" .whl
# unpacked keeping each file's mode: Ray's raylet and gcs_server must stay executable
"$PY" - "$work" <<'UNPACK'
import sys
import zipfile
from pathlib import Path

work = Path(sys.argv[1])
for wheel in sorted((work / "wheels").glob("*.whl")):
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            path = Path(archive.extract(info, work / "site"))
            mode = info.external_attr >> 16
            if mode and not info.is_dir():
                path.chmod(mode & 0o777)
UNPACK
rm -rf "$work"/site/ray/{jars,rllib,tune,train,serve,data,llm,air} \
  "$work/site/ray/dashboard/client/build"
tar czf .whl/site.tar.gz -C "$work/site" .
ls -l .whl/site.tar.gz

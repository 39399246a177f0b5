#!/usr/bin/env bash
# Wheels that bring `duplexcadence serve` to a machine without network whose Python already has torch,
# aiohttp, grpcio, protobuf, prometheus-client, h11, anyio, click, filelock, msgpack, pyyaml, requests (the
# GPU device image): Ray (its Java jar left out: 31 MiB that Python never loads) and Serve's Python deps.
#   packaging/serve-wheels.sh [DEST=.whl] [PYVER=3.12]      -> DEST/*.whl, about 50 MiB
# On the device: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site DEST/*.whl
#                export PYTHONPATH=/tmp/site:$PYTHONPATH
set -euo pipefail
DEST=${1:-.whl}
PYVER=${2:-3.12}
PY=${PY:-python3}
mkdir -p "$DEST"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
pkgs=(ray==2.60.0 fastapi starlette pydantic pydantic-core annotated-types typing-inspection annotated-doc
      uvicorn websockets jsonschema jsonschema-specifications referencing rpds-py opentelemetry-api
      importlib-metadata zipp "grpcio-reflection==${GRPCIO:-1.84.0}" soxr)   # = the image's grpcio (GRPCIO=...)
for p in "${pkgs[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        "${plat[@]}" -d "$DEST" "$p" 2>&1 | grep -v "^WARNING: Location" || true
done
ray_whl=$(ls "$DEST"/ray-*.whl)
"$PY" - "$ray_whl" <<'PY'
import os, sys, zipfile
src = sys.argv[1]
tmp = src + ".tmp"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if item.filename.startswith("ray/jars/"):
            continue
        data = zin.read(item.filename)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l + b"\n" for l in data.splitlines() if not l.startswith(b"ray/jars/"))
        zout.writestr(item, data)
os.replace(tmp, src)
PY
du -sh "$DEST"

# DuplexCadence — `make run` opens the app, `make test` runs the suite. Both bootstrap .venv from nothing.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU torch on machines without an NVIDIA driver (the 2.13.0 CPU build lies on disk here);
# the regular (CUDA) build where nvidia-smi exists. Never newer than 2.14.1.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 'torch<=2.14.1' || echo 'torch==2.13.0')
SYS_PKGS := libportaudio2 libegl1 libgl1 libglib2.0-0 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 \
  libdbus-1-3 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0 libxcb-xinerama0 libxcb-randr0 \
  libxcb-render-util0 libxcb-image0 libnss3 espeak-ng sox pulseaudio pulseaudio-utils libasound2-plugins desktop-file-utils

.PHONY: run test sysdeps venv bench package package-test clean

sysdeps:
	@missing=$$(for p in $(SYS_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing system packages: $$missing"; \
	  (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else \
	  echo "NOTE: missing system packages (install them with your package manager): $$missing"; \
	fi

$(STAMP): pyproject.toml tests/oracle-requirements.txt
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "$(TORCH_SPEC)"
	$(VPY) -m pip install -q -e ".[test,serve]"
	$(VPY) -m pip install -q --no-deps -r tests/oracle-requirements.txt
	@touch $(STAMP)

venv: sysdeps $(STAMP)

# The stock-loop oracle's own venv (transformers 4.51 + the minicpmo sdist), used only by
# tests/test_minicpmo45_stock_loop.py through tests/stock_loop/run_stock.py.
STOCK_VENV := .venv-stock
STOCK_STAMP := $(STOCK_VENV)/.installed

$(STOCK_STAMP): tests/stock-loop-requirements.txt
	@test -x $(STOCK_VENV)/bin/python || $(PY) -m venv $(STOCK_VENV)
	$(STOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(STOCK_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(STOCK_VENV)/bin/python -m pip install -q -r tests/stock-loop-requirements.txt
	$(STOCK_VENV)/bin/python -m pip install -q --no-deps minicpmo==0.1.2
	@touch $(STOCK_STAMP)

run: venv
	$(VENV)/bin/duplexcadence

test: venv $(STOCK_STAMP)
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q

bench: venv
	$(VENV)/bin/duplexcadence-bench --help

clean:
	rm -rf $(VENV) $(STOCK_VENV) build dist .pytest_cache

# Packaging: a PyInstaller one-folder bundle + tarball in dist/, built against the torch in .venv
# (the CPU build here and in CI; see README "Packaging" for the CUDA variant). Not part of `make test`.
PKG_STAMP := $(VENV)/.package-installed

$(PKG_STAMP): $(STAMP)
	$(VPY) -m pip install -q -e ".[package]"
	@touch $(PKG_STAMP)

package: venv $(PKG_STAMP)
	PY=$(VPY) packaging/build.sh

package-test: venv $(PKG_STAMP)
	QT_QPA_PLATFORM=offscreen $(VPY) -m pytest -q -m slow tests/test_packaging.py

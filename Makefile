# treenic — one Makefile for the whole flow. Every target sets up .venv itself.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
SIM   ?= icarus
WAVES ?= 0
# pytest-xdist workers for `make test` / `make sim` (auto: one per CPU; JOBS=0 runs serially)
JOBS  ?= auto
export SIM WAVES

.PHONY: all setup setup-demo demo test sim bench synth bitstream clean
BOARD ?= ecpix5
all: test

setup:
	@tools/setup_env.sh sim,torch,test

# the demo needs the simulator and torch, not the test tools
setup-demo:
	@tools/setup_env.sh sim,torch

demo: setup-demo
	$(PY) -m treenic.cli demo

# TREENIC_RTL_TESTS=1: the driver's rtl backend runs against the Verilated NIC fabric too
test: setup
	TREENIC_RTL_TESTS=1 $(PY) -m pytest -q -n $(JOBS) --dist worksteal tests
	$(MAKE) --no-print-directory sim

# worksteal: a worker that is done takes queued benches from the other (a few run minutes)
sim: setup
	$(PY) -m pytest -q -n $(JOBS) --dist worksteal sim

bench: setup
	$(PY) -m treenic.bench --out build/bench

synth:
	@tools/setup_env.sh sim,torch,test,synth
	$(PY) -m treenic.boards.synth --out build/synth

# a board's bitstream, timing report and utilisation under build/bitstream/$(BOARD)/;
# exits 1 on negative slack (ARGS=--allow-negative-slack to keep the result anyway)
bitstream:
	@tools/setup_env.sh sim,torch,test,synth
	nice -n 10 $(PY) -m treenic.boards.bitstream --board $(BOARD) --out build/bitstream/$(BOARD) $(ARGS)

clean:
	rm -rf build

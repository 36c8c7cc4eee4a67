# The two commands every machine needs: `make demo` and `make test`.
# Both bootstrap dependencies first (idempotent), then build with Ninja+ccache.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python
export CCACHE_DIR ?= $(HOME)/.cache/ccache
# Relative paths in the cache key: a fresh clone elsewhere (CI) still hits the cache.
export CCACHE_BASEDIR ?= $(CURDIR)

.PHONY: all deps configure build demo test bench fuzz fmt fmt-check lint install-git-hooks clean

all: build

deps:
	@bash scripts/bootstrap.sh

configure: deps
	@test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@$(BUILD)/rlx demo

test: build
	@cd $(BUILD) && ctest --output-on-failure -j 2
	@BUILD=$(BUILD) bash scripts/test_python.sh

bench: build
	@bash bench/run.sh

# libFuzzer harnesses (tests/fuzz) built with clang in build-fuzz/, each run FUZZ_SECONDS (docs/testing.md, "Fuzzing").
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: deps
	@bash scripts/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fmt:
	@git ls-files '*.cpp' '*.hpp' '*.inc' | xargs clang-format -i

# The gates .ci/run applies: formatting (.clang-format) and clang-tidy (.clang-tidy: every finding is an error).
fmt-check: deps
	@git ls-files '*.cpp' '*.hpp' '*.inc' | xargs clang-format --dry-run --Werror && echo "fmt-check: clean"

lint: configure
	@git ls-files 'src/*.cpp' 'tools/*.cpp' | xargs -P $(JOBS) -n 8 clang-tidy -p $(BUILD) --quiet && echo "lint: clean"

install-git-hooks:
	@ln -sf ../../scripts/pre-commit .git/hooks/pre-commit && echo "pre-commit hook installed"

clean:
	@rm -rf $(BUILD)

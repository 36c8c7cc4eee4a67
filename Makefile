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

# Sanitizer builds, each in its own tree (docs/testing.md, "Sanitizers"): the Release flags plus RLX_SANITIZE,
# without the benchmarks.
.PHONY: test-asan test-tsan test-load
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
SANITIZER_CMAKE_FLAGS = -G Ninja -DCMAKE_BUILD_TYPE=Release -DRLX_BUILD_BENCH=OFF
# pytest under ASan: Python itself is not instrumented, so the runtimes are preloaded, and leaks are not checked
# (the interpreter does not free everything at exit; the C++ suite checks RLX's).
ASAN_PRELOAD = $$(c++ -print-file-name=libasan.so) $$(c++ -print-file-name=libubsan.so)
# The TSan suite: the runtime's concurrency tests (clones, the thread pool, DeviceRouter, concurrent runs on one
# compiled graph, cancelling from another thread, the load test), the tcp engine's (its store serves from a thread;
# its tests run every rank as a thread), by test name, and the binaries that hold them.
TSAN_TESTS = Clone|Concurren|ThreadPool|Router|RunControl|Load\.|TcpEngine|TcpStore
TSAN_TARGETS = runtime_test_concurrency runtime_test_load runtime_test_session runtime_test_router \
  runtime_test_run_control cpu_test_cpu_thread_pool cpu_test_cpu_kernels cpu_test_cpu_gemm \
  compile_test_lower_control_flow vulkan_test_vulkan_backend distributed_test_tcp

# The whole C++ suite and pytest under ASan and UBSan (it fits CI's budget, so there is no subset).
test-asan: deps
	@test -f $(ASAN_BUILD)/build.ninja || cmake -S . -B $(ASAN_BUILD) $(SANITIZER_CMAKE_FLAGS) \
	  -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python -DRLX_SANITIZE=address,undefined
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j 2
	@LD_PRELOAD="$(ASAN_PRELOAD)" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  PYTHONPATH=$(ASAN_BUILD)/python .venv/bin/python -m pytest -q python/tests

test-tsan: deps
	@test -f $(TSAN_BUILD)/build.ninja || cmake -S . -B $(TSAN_BUILD) $(SANITIZER_CMAKE_FLAGS) -DRLX_BUILD_PYTHON=OFF \
	  -DRLX_SANITIZE=thread
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TARGETS)
	@cd $(TSAN_BUILD) && ctest --output-on-failure -j 2 -R '$(TSAN_TESTS)'

# The load test at the issue's size on every device, 8 threads x 10,000 runs (make test runs fewer on Vulkan).
test-load: build
	@$(BUILD)/tests/runtime_test_load --gtest_also_run_disabled_tests --gtest_filter='*TenThousand*'

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

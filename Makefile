# flashattn: `make test` runs every test (GPU tests only where a GPU is),
# `make demo` runs the main demo, `make bench` / `make bench-cpu` benchmark.
CC      ?= cc
PYTHON  ?= python3
NVCC    ?= nvcc
CFLAGS  ?= -O3 -march=native -ffp-contract=fast
BUILD   := build
HEADERS := flashattn.h flashattn_ref.h

.PHONY: all numpy test demo bench bench-cpu clean

all: $(BUILD)/libflashattn_test.so $(BUILD)/cpu_attention

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/libflashattn_test.so: tests/shim.c $(HEADERS) | $(BUILD)
	$(CC) -std=c99 $(CFLAGS) -fPIC -shared -o $@ tests/shim.c -lm -pthread

$(BUILD)/cpu_attention: examples/cpu_attention.c $(HEADERS) | $(BUILD)
	$(CC) -std=c99 $(CFLAGS) -o $@ examples/cpu_attention.c -lm -pthread

# The test driver's one dependency, installed when missing.
numpy:
	@$(PYTHON) -c "import numpy" 2>/dev/null || $(PYTHON) -m pip install --quiet numpy

test: numpy $(BUILD)/libflashattn_test.so
	$(PYTHON) tests/run_tests.py

demo: $(BUILD)/cpu_attention
	./$(BUILD)/cpu_attention

bench-cpu: numpy $(BUILD)/libflashattn_test.so
	$(PYTHON) bench/bench_cpu.py

clean:
	rm -rf $(BUILD)

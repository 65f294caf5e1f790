# flashattn: `make demo` runs the main demo, `make test` every test (the GPU
# tests only where nvidia-smi sees a GPU), `make bench` (GPU sweep,
# decode and FP8) / `make bench-decode` / `make bench-cpu` benchmark, `make sanitize`
# runs compute-sanitizer over the reduced GPU suite.
CC      ?= cc
PYTHON  ?= python3
NVCC    ?= nvcc
CFLAGS  ?= -O3 -march=native -ffp-contract=fast
BUILD   := build
HEADERS := flashattn.h flashattn_ref.h
CUDA_HEADERS := $(HEADERS) flashattn_cuda.cuh

# The GPU part builds only where a GPU is; sm_90a for Hopper, else the
# device's own compute capability.
GPU_CC  := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)
ifeq ($(GPU_CC),90)
GPU_ARCH ?= -gencode=arch=compute_90a,code=sm_90a
else ifneq ($(GPU_CC),)
GPU_ARCH ?= -gencode=arch=compute_$(GPU_CC),code=sm_$(GPU_CC)
endif
NVFLAGS := -O3 -Xcompiler -fPIC $(GPU_ARCH)
GPU_LIBS := $(if $(GPU_CC),$(BUILD)/libflashattn_cuda_test.so $(BUILD)/libflashattn_cuda_fa2_test.so \
              $(BUILD)/libflashattn_cuda_fa1_test.so $(BUILD)/libflashattn_cuda_smem163_test.so \
              $(BUILD)/libflashattn_cuda_smem99_test.so)
# FA3 ablations for the benchmark: no intra-warpgroup overlap, no ping-pong.
BENCH_LIBS := $(if $(GPU_CC),$(BUILD)/libflashattn_cuda_nooverlap.so $(BUILD)/libflashattn_cuda_nopingpong.so)
GPU_DEMO := $(if $(GPU_CC),$(BUILD)/gpu_attention)

.PHONY: all bench-libs cuda-lib numpy test demo bench bench-build bench-decode bench-varlen bench-cpu sanitize clean

CPU_LIBS := $(BUILD)/libflashattn_test.so $(BUILD)/libflashattn_nothreads_test.so \
            $(BUILD)/libflashattn_tiles_test.so $(BUILD)/libflashattn_portable_test.so \
            $(BUILD)/libflashattn_avx2_test.so

all: $(CPU_LIBS) $(BUILD)/cpu_attention $(GPU_LIBS) $(GPU_DEMO)

bench-libs: $(BENCH_LIBS)

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/libflashattn_test.so: tests/shim.c $(HEADERS) | $(BUILD)
	$(CC) -std=c99 $(CFLAGS) -fPIC -shared -o $@ tests/shim.c -lm -pthread

$(BUILD)/libflashattn_nothreads_test.so: tests/shim.c $(HEADERS) | $(BUILD)
	$(CC) -std=c99 $(CFLAGS) -DFA_NO_THREADS -fPIC -shared -o $@ tests/shim.c -lm

$(BUILD)/libflashattn_tiles_test.so: tests/shim.c $(HEADERS) | $(BUILD)
	$(CC) -std=c99 $(CFLAGS) -DFA_CPU_BLOCK_M=32 -DFA_CPU_BLOCK_N=16 -DFA_CPU_BWD_BLOCK_N=16 -fPIC -shared -o $@ tests/shim.c -lm -pthread

# The portable C kernels (no SIMD), the oracle the SIMD kernels are tested against.
$(BUILD)/libflashattn_portable_test.so: tests/shim.c $(HEADERS) | $(BUILD)
	$(CC) -std=c99 $(CFLAGS) -DFA_CPU_SIMD=0 -fPIC -shared -o $@ tests/shim.c -lm -pthread

# The AVX2 microkernels where the compiler would pick AVX-512 ones (the same
# bits, tested).
$(BUILD)/libflashattn_avx2_test.so: tests/shim.c $(HEADERS) | $(BUILD)
	$(CC) -std=c99 $(CFLAGS) -DFA_CPU_AVX512=0 -fPIC -shared -o $@ tests/shim.c -lm -pthread

# The GPU library split over translation units (FA_CUDA_SPLIT in
# flashattn_cuda.cuh), each compiled from the header itself, so that
# `make -j cuda-lib` builds them in parallel: the host unit (the host code,
# the CPU path, the kernels every head dim shares) and one kernel unit per
# head dim, heaviest first. CUDA_LIB_FLAGS reaches every unit. ptxas
# compiles a unit's kernels on every core (CUDA_LIB_PTXAS; the same SASS as
# one thread; empty it for a ptxas without --split-compile).
CUDA_LIB_ARCH  ?= -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
CUDA_LIB_FLAGS ?=
CUDA_LIB_DIMS  ?= 256 192 128 160 96 64 32
CUDA_LIB_PTXAS ?= -Xptxas --split-compile=0
CUDA_LIB_NVCC   = $(NVCC) -O3 -Xcompiler -fPIC $(CUDA_LIB_ARCH) $(CUDA_LIB_PTXAS) -DFA_CUDA_SPLIT=1 $(CUDA_LIB_FLAGS) -x cu
CUDA_LIB_OBJS  := $(CUDA_LIB_DIMS:%=$(BUILD)/cuda/d%.o) $(BUILD)/cuda/host.o

cuda-lib: $(BUILD)/libflashattn_cuda.a

$(BUILD)/cuda:
	mkdir -p $(BUILD)/cuda

$(BUILD)/cuda/host.o: $(CUDA_HEADERS) | $(BUILD)/cuda
	$(CUDA_LIB_NVCC) -DFLASHATTN_IMPLEMENTATION -DFLASHATTN_CUDA_IMPLEMENTATION -c -o $@ flashattn_cuda.cuh

$(BUILD)/cuda/d%.o: $(CUDA_HEADERS) | $(BUILD)/cuda
	$(CUDA_LIB_NVCC) -DFLASHATTN_CUDA_KERNELS -DFA_CUDA_UNIT_HEAD_DIM=$* -c -o $@ flashattn_cuda.cuh

$(BUILD)/libflashattn_cuda.a: $(CUDA_LIB_OBJS)
	rm -f $@ && ar rcs $@ $(CUDA_LIB_OBJS)

# The CUDA test shim in each build the tests and the benchmark compare.
$(BUILD)/libflashattn_cuda_fa2_test.so: SHIM_FLAGS := -DFA_SM90=0
$(BUILD)/libflashattn_cuda_fa1_test.so: SHIM_FLAGS := -DFA_VARIANT=1
# As on GPUs that allow 163 KB (compute capability 8.0) or 99 KB (8.6, 8.9)
# of shared memory per block.
$(BUILD)/libflashattn_cuda_smem163_test.so: SHIM_FLAGS := -DFA_SM90=0 -DFA_I_TEST_SMEM_OPTIN=166912
$(BUILD)/libflashattn_cuda_smem99_test.so: SHIM_FLAGS := -DFA_SM90=0 -DFA_I_TEST_SMEM_OPTIN=101376
$(BUILD)/libflashattn_cuda_nooverlap.so: SHIM_FLAGS := -DFA_FA3_OVERLAP=0
$(BUILD)/libflashattn_cuda_nopingpong.so: SHIM_FLAGS := -DFA_FA3_PINGPONG=0
$(BUILD)/libflashattn_cuda_%.so: tests/shim_cuda.cu $(CUDA_HEADERS) | $(BUILD)
	$(NVCC) $(NVFLAGS) $(SHIM_FLAGS) -shared -o $@ tests/shim_cuda.cu

$(BUILD)/cpu_attention: examples/cpu_attention.c $(HEADERS) | $(BUILD)
	$(CC) -std=c99 $(CFLAGS) -o $@ examples/cpu_attention.c -lm -pthread

$(BUILD)/gpu_attention: examples/gpu_attention.cu $(CUDA_HEADERS) | $(BUILD)
	$(NVCC) -O3 $(GPU_ARCH) -o $@ examples/gpu_attention.cu

# The test driver's one dependency, installed when missing.
numpy:
	@$(PYTHON) -c "import numpy" 2>/dev/null || $(PYTHON) -m pip install --quiet numpy

test: numpy $(CPU_LIBS) $(GPU_LIBS)
	$(PYTHON) tests/run_tests.py

demo: $(BUILD)/cpu_attention $(GPU_DEMO)
	./$(BUILD)/cpu_attention
	$(if $(GPU_DEMO),./$(GPU_DEMO))

# The CPU benchmark's peers and tools, installed when missing.
bench-varlen: numpy $(GPU_LIBS)
	$(PYTHON) bench/bench_varlen.py

bench-cpu: numpy $(BUILD)/libflashattn_test.so $(BUILD)/fma_peak
	@$(PYTHON) -c "import onnxruntime, onnx, threadpoolctl" 2>/dev/null || \
	  $(PYTHON) -m pip install --quiet onnxruntime onnx threadpoolctl
	$(PYTHON) bench/bench_cpu.py

$(BUILD)/fma_peak: bench/fma_peak.c | $(BUILD)
	$(CC) $(CFLAGS) -o $@ bench/fma_peak.c -pthread

bench: numpy $(GPU_LIBS) $(BENCH_LIBS)
	$(PYTHON) bench/bench_gpu.py
	$(PYTHON) bench/bench_decode.py
	$(PYTHON) bench/bench_fp8.py

# Wall seconds of the library's builds on this machine (bench/results_build.md).
bench-build:
	$(PYTHON) bench/bench_build.py

bench-decode: numpy $(GPU_LIBS)
	$(PYTHON) bench/bench_decode.py

sanitize: numpy $(CPU_LIBS) $(GPU_LIBS)
	for tool in memcheck racecheck synccheck; do \
	  compute-sanitizer --tool $$tool --error-exitcode 1 $(PYTHON) tests/run_tests.py gpu_small || exit 1; \
	done

clean:
	rm -rf $(BUILD)

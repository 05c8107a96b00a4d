# mesanet: `make` builds the library, the tool and the tests; `make test` runs the tests.
#
# Knobs: CUDA=0 turns the CUDA backend off even where nvcc exists; NCCL=0 builds it without
# NCCL (several GPUs then sum their gradients through the host); CUDNN=0 without cuDNN (attention
# then runs our own kernels only); NATIVE=0 builds for
# generic x86-64 instead of this machine's instruction set; BLAS_CFLAGS/BLAS_LIBS point at
# another CBLAS; CC=clang builds with clang; SAN=1 builds with the sanitizers (below); `make fuzz`
# builds and runs the fuzzers (below, fuzz/).

CC      ?= gcc
NATIVE  ?= 1

# SAN=1: everything built with AddressSanitizer (LeakSanitizer included) and
# UndefinedBehaviorSanitizer, the first finding fatal: `make SAN=1 BUILD=build-san test` runs the
# suite so, with gcc or CC=clang (scripts/sanitize.sh). CPU only.
SAN_FLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
ifeq ($(SAN),1)
  OPT      ?= -O1 -g
  CUDA     := 0
  SANITIZE := $(SAN_FLAGS)
  SAN_ENV  := ASAN_OPTIONS=detect_leaks=1:$(ASAN_OPTIONS) UBSAN_OPTIONS=print_stacktrace=1:$(UBSAN_OPTIONS)
endif
# FUZZ=1 (set by `make fuzz`): the library instrumented for clang's libFuzzer, plus the sanitizers.
ifeq ($(FUZZ),1)
  OPT      ?= -O1 -g
  CUDA     := 0
  SANITIZE := -fsanitize=fuzzer-no-link $(SAN_FLAGS)
endif
OPT     ?= -O3
ARCH    := $(if $(filter 1,$(NATIVE)),-march=native,)
# -Wno-format-truncation: paths are built in fixed buffers; a truncated path fails at open with
# a message naming it, which is the behaviour we want anyway.
# -ffp-contract=fast: ISO C mode turns FMA contraction off; the numerics are tested with
# tolerances that allow it, and without it the CPU loops run at half speed.
# -Wpointer-arith: arithmetic on a void pointer (a buffer's opaque pointer plus elements) counts
# bytes in GNU C, not elements; refused, so an offset is always taken on a typed pointer.
CFLAGS  += -std=c11 $(OPT) $(ARCH) -ffp-contract=fast -fopenmp -D_DEFAULT_SOURCE \
           -Wall -Wextra -Wpointer-arith -Werror -Wno-unused-parameter -Wno-missing-field-initializers -Iinclude -Isrc \
           -I. -MMD -MP
# gcc and clang (CC=clang) both build it, warnings as errors; clang has no -Wformat-truncation, and
# its -fopenmp needs LLVM's OpenMP runtime (Debian: libomp-dev, scripts/install-deps.sh --clang).
CC_IS_CLANG := $(if $(shell $(CC) --version 2>/dev/null | grep -i clang),1,0)
# clang's -Wpass-failed: an `omp simd` loop it could not vectorize (tanhf has no vector
# variant for it); the pragma is a hint, and the loop is still correct.
ifeq ($(CC_IS_CLANG),1)
  CFLAGS += -Wno-pass-failed
else
  CFLAGS += -Wno-format-truncation
endif
LDLIBS  += -lm

# glibc's vector math library: lets the elementwise loops call AVX-512 expf/tanhf
# (src/cpu/vmath.h says why it is declared by hand). -fno-math-errno: we never read errno.
LIBMVEC := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libmvec.so /lib/x86_64-linux-gnu/libmvec.so))
ifneq ($(LIBMVEC),)
  CFLAGS += -DMN_HAVE_LIBMVEC -fno-math-errno
  LDLIBS += -lmvec
endif

# OpenBLAS, preferably its OpenMP build: called inside our own parallel regions it then
# runs single-threaded instead of oversubscribing the cores.
OPENBLAS_OMP := /usr/lib/x86_64-linux-gnu/openblas-openmp
ifneq ($(wildcard $(OPENBLAS_OMP)/libopenblas.so),)
  BLAS_CFLAGS ?= -I/usr/include/x86_64-linux-gnu/openblas-openmp
  BLAS_LIBS   ?= -L$(OPENBLAS_OMP) -Wl,-rpath,$(OPENBLAS_OMP) -lopenblas
else
  BLAS_CFLAGS ?= $(shell pkg-config --cflags openblas 2>/dev/null)
  BLAS_LIBS   ?= $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
endif
CFLAGS += $(BLAS_CFLAGS) $(SANITIZE)
LDLIBS := $(BLAS_LIBS) $(LDLIBS)

BUILD   ?= build
LIB_SRC := $(wildcard src/*/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/*.c))
TEST_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/*.c))  # tests/cuda/ builds separately
BENCH_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard bench/*.c))

# CUDA backend: built when nvcc is found, unless CUDA=0.
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),1,0)
CU_SRC  := $(wildcard src/cuda/*.cu)
ifeq ($(CUDA),1)
  ifneq ($(CU_SRC),)
    CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
    CU_OBJ    := $(CU_SRC:%.cu=$(BUILD)/%.o)
    NVCCFLAGS ?= -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80 \
                 -Xcompiler -Wall,-Werror,-fopenmp -Werror all-warnings -Iinclude -Isrc -MMD -MP
    CFLAGS    += -DMN_HAVE_CUDA
    LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
    # NCCL for training on several GPUs (train --gpus N); without it the ranks sum through the host.
    NCCL      ?= $(if $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h),1,0)
    ifeq ($(NCCL),1)
      CU_DEFS += -DMN_HAVE_NCCL
      LDLIBS  += -lnccl
    endif
    # cuDNN 9's fused flash attention for attn_fwd / attn_bwd (src/cuda/attn_cudnn.cu): found where
    # include/cudnn.h is, beside the CUDA headers or under /usr, or at CUDNN_HOME=DIR (include/ and
    # lib/ or lib64/ with libcudnn.so.9: a pip wheel's nvidia/cudnn, say). CUDNN=0, or none found,
    # leaves our own attention kernels only. libcudnn.so.9 is cuDNN's shim: it loads libcudnn_graph
    # and the engine libraries (libcudnn_engines_*, libcudnn_heuristic) at run time, from its own
    # directory's rpath or LD_LIBRARY_PATH.
    CUDNN_HOME ?= $(firstword $(foreach d,$(CUDA_HOME) /usr,$(if $(wildcard $(d)/include/cudnn.h),$(d))))
    CUDNN      ?= $(if $(CUDNN_HOME),1,0)
    ifeq ($(CUDNN),1)
      CUDNN_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(CUDNN_HOME)/lib64/libcudnn.so.9* \
                      $(CUDNN_HOME)/lib/libcudnn.so.9* $(CUDNN_HOME)/lib/x86_64-linux-gnu/libcudnn.so.9*))))
      CU_DEFS += -DMN_HAVE_CUDNN $(if $(filter /usr $(CUDA_HOME),$(CUDNN_HOME)),,-I$(CUDNN_HOME)/include)
      ifneq ($(CUDNN_LIBDIR),)
        LDLIBS += -L$(CUDNN_LIBDIR) -Wl,-rpath,$(CUDNN_LIBDIR)
      endif
      LDLIBS  += -l:libcudnn.so.9
    endif
  endif
endif

.PHONY: all test test-cuda clean fuzz fuzz-build
all: $(BUILD)/libmesanet.a $(BUILD)/mesanet $(BUILD)/run_tests $(if $(CU_OBJ),$(BUILD)/run_tests_cuda)

# Made afresh each time: an archive updated in place would keep the objects of renamed files.
$(BUILD)/libmesanet.a: $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/mesanet: $(TOOL_OBJ) $(BENCH_OBJ) $(BUILD)/libmesanet.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BENCH_OBJ) $(BUILD)/libmesanet.a $(LDLIBS)

$(BUILD)/run_tests: $(TEST_OBJ) $(BUILD)/libmesanet.a
	$(CC) $(CFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libmesanet.a $(LDLIBS)

# GPU tests: their own binary, since they need a device (make test-cuda).
CUDA_TEST_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/cuda/*.c)) \
                 $(BUILD)/tests/main.o $(BUILD)/tests/fd.o $(BUILD)/tests/mesa_case.o \
                 $(BUILD)/tests/mixer_case.o $(BUILD)/tests/tmpdir.o $(BUILD)/tests/toy.o $(BUILD)/tests/tool_run.o
$(BUILD)/run_tests_cuda: $(CUDA_TEST_OBJ) $(BUILD)/libmesanet.a
	$(CC) $(CFLAGS) -o $@ $(CUDA_TEST_OBJ) $(BUILD)/libmesanet.a $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "cc $<"
	@$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CU_DEFS) -c $< -o $@

# The whole suite, on the CPU; ends with "N passed, M failed".
test: all
	$(SAN_ENV) ./$(BUILD)/run_tests

# The GPU suite (needs a CUDA device and a build with nvcc).
test-cuda: all
	@test -x $(BUILD)/run_tests_cuda || { echo "no CUDA build (nvcc not found, or CUDA=0)"; exit 1; }
	./$(BUILD)/run_tests_cuda

# Fuzzing: `make fuzz FUZZ_TIME=60` builds the libFuzzer harnesses of fuzz/ with clang in
# $(FUZZ_BUILD) and runs each for FUZZ_TIME seconds (scripts/fuzz.sh); FUZZ_TARGETS=json runs one.
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_TIME    ?= 60
FUZZ_TARGETS ?= $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZ_OBJ     := $(patsubst %.c,$(BUILD)/%.o,$(wildcard fuzz/*.c))

fuzz:
	$(MAKE) FUZZ=1 CC=$(FUZZ_CC) BUILD=$(FUZZ_BUILD) fuzz-build
	scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_TIME) $(FUZZ_TARGETS)

fuzz-build: $(FUZZ_TARGETS:%=$(BUILD)/fuzz-%) $(BUILD)/fuzz_seeds
.SECONDARY: $(FUZZ_OBJ)

$(BUILD)/fuzz-%: $(BUILD)/fuzz/fuzz_%.o $(BUILD)/fuzz/util.o $(BUILD)/libmesanet.a
	@echo "link $@"
	@$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)

$(BUILD)/fuzz_seeds: $(BUILD)/fuzz/seeds.o $(BUILD)/libmesanet.a
	@echo "link $@"
	@$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BENCH_OBJ:.o=.d) $(CUDA_TEST_OBJ:.o=.d) $(CU_OBJ:.o=.d) $(FUZZ_OBJ:.o=.d)

#!/usr/bin/env bash
# The one prepared script a session with a GPU machine runs (the device tool
# of /work/.library/device/README.md): the Python suite's CUDA tests and the
# loader benchmark's GPU delivery, results under $OUT. The machine has
# torch with CUDA, numpy and msgpack, and no Go: the tensorwire binary comes
# prebuilt in the ignored folder .devbin/, carried to it.
#
# Here, from the repository root:
#   go build -ldflags='-s -w' -o .devbin/tensorwire ./cmd/tensorwire   (about 27 MB of the 64 MiB that travel;
#   build it after the last change to python/: the binary embeds the Python client the benchmark runs)
# then the device tool's run, with carry [".devbin"] and timeout_s 590:
#   bash scripts/device.sh
# It takes about 4 to 6 minutes (each step has its own time limit, 9 minutes
# in all: run it with timeout_s 590); what comes back (8 files):
#   env.txt         nvidia-smi, torch and the GPU
#   tests.log       the CUDA tests: test_producer_device.TestDeviceCUDA (GPU
#                   delivery: views on cuda:0 across processes, a held view
#                   blocking its slot, kill -9, the host path), and the
#                   suite's other CUDA tests (collective, replica)
#   bench.log/json  tensorwire bench loader --producer python --device cuda:0:
#                   tensorsocket's workload, 4 shared consumers (views on
#                   the GPU) against 4 jobs each copying its own batches there
#   plain.log/json  the same without the DataLoader's transform (--plain,
#                   step 0): the delivery's own rate, batches of uint8
#                   [64, 3, 224, 224]
#   serve.log/json  tensorwire bench serve --model py-big,py-mlp --device
#                   cuda:0: torch MLPs in a Python replica on the GPU at 32
#                   and 128 clients, against the module called in-process
#                   (issue 26's goal: >= 0.5 of it for py-big)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
DEV=${DEVICE:-cuda:0}  # DEVICE=shm:0 tries the script on a machine without a GPU (the CPU stand-in)
BIN=${TENSORWIRE_BIN:-$PWD/.devbin/tensorwire}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ ! -x "$BIN" ]; then
	echo "device.sh: no tensorwire binary at $BIN (go build -o .devbin/tensorwire ./cmd/tensorwire, and carry .devbin)" >&2
	exit 2
fi
rc=0

{
	date -u
	nvidia-smi || true
	python3 -c 'import sys, torch, numpy, msgpack; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count()); [print(i, torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]; print("numpy", numpy.__version__, "msgpack", msgpack.version)'
	nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The CUDA tests: every class of the suite that skips without CUDA.
echo "== CUDA tests" | tee "$OUT/tests.log"
(cd python/tests && timeout 210 env TENSORWIRE_BIN="$BIN" PYTHONPATH="$PWD/.." python3 -m unittest -v \
	test_producer_device.TestDeviceCUDA test_collective.TestCollectiveCUDA test_replica.TestReplicaCUDA) \
	>>"$OUT/tests.log" 2>&1 || rc=1
tail -n 25 "$OUT/tests.log"

# The benchmark: tensorsocket's workload with GPU delivery.
echo "== tensorwire bench loader --producer python --device $DEV" | tee "$OUT/bench.log"
timeout 120 "$BIN" bench loader --producer python --device "$DEV" --samples 2048 --consumers 4 \
	--json "$OUT/bench.json" >>"$OUT/bench.log" 2>&1 || rc=1
tail -n 8 "$OUT/bench.log"

# The delivery alone: no transform, no step.
echo "== _bench_loader --device $DEV --plain --step 0" | tee "$OUT/plain.log"
(cd python && timeout 60 python3 -m tensorwire._bench_loader --bin "$BIN" --device "$DEV" --plain --step 0 \
	--samples 8192 --consumers 4 --json "$OUT/plain.json") >>"$OUT/plain.log" 2>&1 || rc=1
tail -n 8 "$OUT/plain.log"

# Serve: torch modules in a Python replica on the device (issue 26), against
# the same module called in-process with batches of --max-batch rows.
echo "== tensorwire bench serve --model py-big,py-mlp --device $DEV" | tee "$OUT/serve.log"
if [ "${DEV#cuda}" != "$DEV" ]; then
	timeout 150 "$BIN" bench serve --model py-big,py-mlp --device "$DEV" --clients 32,128 --max-batch 64 \
		--duration 2s --limit-duration 1s --update-mb 0 --json "$OUT/serve.json" >>"$OUT/serve.log" 2>&1 || rc=1
else
	echo "device.sh: $DEV is no CUDA device: the serve run needs one" >>"$OUT/serve.log"
fi
tail -n 14 "$OUT/serve.log"

echo "device.sh: exit $rc"
exit $rc

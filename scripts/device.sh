#!/usr/bin/env bash
# The one prepared script a session with a GPU machine runs (the device tool
# of /work/.library/device/README.md): first the GPU work (the Python
# suite's CUDA tests, Python serve replicas on the GPU, the loader's GPU
# delivery), then the 16-core figures (the collective at 4 and 16 ranks
# beside gloo, and the four service benchmarks of issue 30). The machine has
# torch with CUDA, numpy and msgpack, and no Go: the tensorwire binary comes
# prebuilt in the ignored folder .devbin/, carried to it.
#
# Here, from the repository root:
#   CGO_ENABLED=0 go build -ldflags='-s -w' -o .devbin/tensorwire ./cmd/tensorwire
#   (about 27 MB of the 64 MiB that travel; build it after the last change to
#   python/: the binary embeds the Python client the benchmarks run)
# then the device tool's run, with carry [".devbin"] and timeout_s 600:
#   bash scripts/device.sh
# Steps run in order of worth, each under its own limit and all of them
# under BUDGET seconds (default 570): a step that would start with under 15 s
# left is skipped, saying so, so a short lease still brings back the first
# ones. What comes back (8 files, the device tool's most):
#   tests.log        the machine (nvidia-smi, torch, the GPU, nproc) and the
#                    CUDA tests: test_producer_device.TestDeviceCUDA (GPU
#                    delivery: views on cuda:0 across processes, a held view
#                    blocking its slot, kill -9, the host path),
#                    test_collective.TestCollectiveCUDA, test_replica.TestReplicaCUDA
#   gpu.log          the GPU benchmarks' tables: bench serve --model
#                    py-big,py-mlp --device cuda:0 (issue 26: >= 0.5 of the
#                    module called in-process for py-big at 32+ clients),
#                    py-big again with --window 2, and at 32 clients with
#                    its replica's cProfile report (--profile);
#                    bench loader --producer python --device cuda:0
#                    (tensorsocket's workload, 4 shared consumers with views
#                    on the GPU against 4 jobs copying their own batches
#                    there); the delivery alone (--source premade, step
#                    0), with tensorsocket's own producer and consumers
#                    beside when its wheels are carried in .whl:
#                      python3 -m pip download --no-deps --only-binary=:all: \
#                        --python-version 3.12 --implementation cp \
#                        --platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 \
#                        -d .whl tensorsocket==0.0.5 pyzmq==27.3.0 tornado==6.6.1
#                    (echo /.whl/ >> .git/info/exclude; carry [".devbin", ".whl"])
#   serve.json loader.json premade.json   the same as JSON
#   cpu.log          the 16-core tables: bench collective (allreduce, 4 and
#                    16 ranks, shm and tcp, 1 KB / 1 MB / 64 MB, gloo beside,
#                    the bound 2B/p), bench replay --modes ref, bench serve
#                    (the Go MLP, 8-128 clients), bench loader (synthetic; and --bytes), bench
#                    store (10 MB, 4 workers; and its rollouts by Extend)
#   collective.json replay.json        the first two as JSON
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
DEV=${DEVICE:-cuda:0}  # DEVICE=shm:0 tries the script on a machine without a GPU (the CPU stand-in)
BIN=${TENSORWIRE_BIN:-$PWD/.devbin/tensorwire}
BUDGET=${BUDGET:-570}
ONLY=${ONLY:-tests,serve,loader,cpu}  # the parts to run; ONLY=tests,loader: those alone (a second, shorter lease)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ ! -x "$BIN" ]; then
	echo "device.sh: no tensorwire binary at $BIN (go build -o .devbin/tensorwire ./cmd/tensorwire, and carry .devbin)" >&2
	exit 2
fi
start=$(date +%s)
rc=0
# tensorsocket (and pyzmq, tornado) for the loader's side-by-side, from
# wheels carried in .whl when there are some (the device has none of them).
TS_PATH=
if ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
	--upgrade --target /tmp/site .whl/*.whl; then
	TS_PATH=:/tmp/site
fi

# step CAP LOG TITLE CMD...: run CMD under min(CAP, what is left of BUDGET)
# seconds, appending its output to LOG; a failure sets rc and goes on.
step() {
	local cap=$1 log=$2 title=$3
	shift 3
	local left=$((start + BUDGET - $(date +%s)))
	local t=$((cap < left ? cap : left))
	echo "== $title (limit ${t}s, $(($(date +%s) - start))s in)" | tee -a "$log"
	if [ "$t" -lt 15 ]; then
		echo "device.sh: skipped, ${left}s of the budget left" | tee -a "$log"
		rc=1
		return
	fi
	local s=$(date +%s)
	timeout "$t" "$@" >>"$log" 2>&1
	local r=$?
	echo "-- exit $r after $(($(date +%s) - s))s" >>"$log"
	[ "$r" -eq 0 ] || rc=1
	tail -n 16 "$log"
}

{
	date -u
	nvidia-smi || true
	python3 -c 'import sys, torch, numpy, msgpack; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count()); [print(i, torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]; print("numpy", numpy.__version__, "msgpack", msgpack.version)'
	echo "nproc $(nproc)"
	free -g
} >"$OUT/tests.log" 2>&1
cat "$OUT/tests.log"

case ",$ONLY," in *,tests,*)
	# The CUDA tests: every class of the suite that skips without CUDA.
	step 170 "$OUT/tests.log" "CUDA tests" env TENSORWIRE_BIN="$BIN" PYTHONPATH="$PWD/python" bash -c \
		'cd python/tests && exec python3 -m unittest -v test_producer_device.TestDeviceCUDA test_collective.TestCollectiveCUDA test_replica.TestReplicaCUDA'

	;;
esac

case ",$ONLY," in *,serve,*)
	# Serve: torch modules in a Python replica on the device (issue 26),
	# against the same module called in-process with batches of --max-batch rows.
	if [ "${DEV#cuda}" != "$DEV" ]; then
		step 110 "$OUT/gpu.log" "tensorwire bench serve --model py-big,py-mlp --device $DEV" \
			"$BIN" bench serve --model py-big,py-mlp --device "$DEV" --clients 32,128 --max-batch 64 \
			--duration 2s --limit-duration 1s --update-mb 0 --json "$OUT/serve.json"
		# The same with a window of 2 batches in flight (the node sends the next
		# while the replica runs one): the table only, in gpu.log.
		step 60 "$OUT/gpu.log" "tensorwire bench serve --model py-big --device $DEV --window 2" \
			"$BIN" bench serve --model py-big --device "$DEV" --clients 32,128 --max-batch 64 --window 2 \
			--duration 2s --limit-duration 1s --update-mb 0
		# Where a replica's batch goes beyond the forward (about 1 ms on the
		# first H200 run): py-big at 32 clients with its replica under cProfile
		# (wall time by function), the report appended to gpu.log.
		prof=$(mktemp -d)
		step 45 "$OUT/gpu.log" "tensorwire bench serve --model py-big --device $DEV --clients 32 --profile" \
			"$BIN" bench serve --model py-big --device "$DEV" --clients 32 --max-batch 64 \
			--duration 2s --limit-duration 1s --update-mb 0 --profile "$prof/p"
		cat "$prof"/p-py-big-32-64-replica.txt >>"$OUT/gpu.log" 2>/dev/null
		rm -rf "$prof"
	else
		echo "device.sh: $DEV is no CUDA device: the serve run needs one" | tee -a "$OUT/gpu.log"
	fi

	;;
esac

case ",$ONLY," in *,loader,*)
	# The loader: tensorsocket's workload with GPU delivery, then the delivery
	# alone (no transform, no step).
	step 120 "$OUT/gpu.log" "tensorwire bench loader --producer python --device $DEV" \
		"$BIN" bench loader --producer python --device "$DEV" --samples 2048 --consumers 4 --json "$OUT/loader.json"
	# The delivery alone: batches made once, no step, and tensorsocket's
	# producer and consumers beside when its wheels came in .whl (see the top).
	step 150 "$OUT/gpu.log" "_bench_loader --device $DEV --source premade --step 0" env PYTHONPATH="$PWD/python$TS_PATH" \
		python3 -m tensorwire._bench_loader --bin "$BIN" --device "$DEV" --source premade --step 0 \
		--samples 4096 --consumers 4 --timeout 100 --json "$OUT/premade.json"
	;;
esac

case ",$ONLY," in *,cpu,*)
	# Issue 29 at 16 cores: allreduce at 4 and 16 ranks by shared mapping
	# (heap tensors, and shared buffers from Comm.Alloc) and TCP, gloo beside
	# (torch.distributed over loopback), the bound 2B/p.
	step 150 "$OUT/cpu.log" "tensorwire bench collective --ranks 4,16" \
		"$BIN" bench collective --ops allreduce --ranks 4,16 --sizes 1KB,1MB,64MB --transports shm,shm-alloc,tcp \
		--json "$OUT/collective.json"
	# Issue 30's four at 16 cores: the README's main job (10 s timed) ...
	step 60 "$OUT/cpu.log" "tensorwire bench replay --modes ref --duration 10s" \
		"$BIN" bench replay --modes ref --duration 10s --json "$OUT/replay.json"
	# ... serve (the Go MLP, 8 to 128 clients) ...
	step 60 "$OUT/cpu.log" "tensorwire bench serve --model mlp --clients 8,32,128 --duration 3s" \
		"$BIN" bench serve --model mlp --clients 8,32,128 --duration 3s
	# ... the loader (Go producer, tensorsocket's synthetic workload, 1 to 8 consumers) ...
	step 60 "$OUT/cpu.log" "tensorwire bench loader --dataset synthetic --samples 8000 --consumers 1,4,8" \
		"$BIN" bench loader --dataset synthetic --samples 8000 --consumers 1,4,8
	# ... its consumers by bytes, as jobs on other machines get the batches ...
	step 45 "$OUT/cpu.log" "tensorwire bench loader --dataset synthetic --samples 8000 --consumers 4,8 --mixed=false --bytes" \
		"$BIN" bench loader --dataset synthetic --samples 8000 --consumers 4,8 --mixed=false --bytes
	# ... and the store.
	step 60 "$OUT/cpu.log" "tensorwire bench store --mb 10 --workers 4 --duration 2s" \
		"$BIN" bench store --mb 10 --workers 4 --duration 2s
	# ... and its appends by Extend, 8 items a call, 2 calls in flight a worker.
	step 30 "$OUT/cpu.log" "tensorwire bench store --parts rollouts --extend 8 --inflight 2 --duration 2s" \
		"$BIN" bench store --parts rollouts --extend 8 --inflight 2 --duration 2s
	;;
esac

echo "device.sh: exit $rc after $(($(date +%s) - start))s"
exit $rc

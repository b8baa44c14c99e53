#!/usr/bin/env bash
# The GPU checks in one go (run by hand on a CUDA machine, from the repository root):
#
#     bash bench/gpu_checks.sh [results folder]      # default: gpu-results/
#
# 1. the GPU tests (`pytest -m gpu`): the engine's decode graphs against its eager steps
#    and the trainer's log-probabilities;
# 2. bench/bench_inference.py: the engine (decode graphs on and off) against
#    `model.generate` at batch 64 and 256, a Qwen2.5-0.5B-shaped model in bf16;
# 3. bench/bench_trainer.py: the FSDP trainer's tokens/s and MFU on the same shape;
# 4. bench/gpu_server_check.py: an embedded server started as a run starts it chooses the GPU itself.
#
# Each part has its own time limit and log, so one failing part leaves the others' figures.
#
# The benchmarks import telescope-core (the trainer one builds a config, so pydantic and the
# plugin manager's importlib-metadata too). On a GPU image that has torch and transformers
# but not the project, build the wheels here and install them there without an index:
#     pip wheel --no-deps -w wheels ./telescope-core
#     pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d wheels pydantic \
#         pydantic-core annotated-types typing-inspection typing-extensions importlib-metadata \
#         lazy-importer zipp
# and for part 4 (the server) also fastapi, starlette, annotated-doc, anyio, sniffio, uvicorn,
# h11, click, opentelemetry-api and httpx with httpcore, certifi and idna (those the image lacks).
#     pip install --no-index --no-deps wheels/*.whl      # on the GPU machine
set -u
out=${1:-gpu-results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
$py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
timeout 150 $py -m pytest -q -m gpu -p no:cacheprovider tests/core/inference/test_inference_cuda_graphs.py 2>&1 \
    | tee "$out/tests.log" | tail -15
timeout 270 $py bench/bench_inference.py --device cuda --batches 64,256 --new-tokens 128 --repeats 3 --sync-mb 64 2>&1 \
    | grep -v "Loading weights" | tee "$out/inference.log"
timeout 150 $py bench/bench_trainer.py --device cuda --size 0.5b --groups 8 --group-size 16 --prompt 256 \
    --min-completion 64 --max-completion 1024 --steps 3 --warmup 1 2>&1 | grep -v "Loading weights" | tee "$out/trainer.log"
timeout 120 $py bench/gpu_server_check.py 2>&1 | grep -v "Loading weights\|Writing model" | tee "$out/server.log"

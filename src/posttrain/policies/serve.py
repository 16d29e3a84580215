"""Serve a local model over the OpenAI-compatible HTTP API, with continuous batching and
vLLM's weight-update routes.

    .venv/bin/python -m posttrain.policies.serve --model models/tiny-base --port 8000
    # -> listening on http://127.0.0.1:8000/v1

An ASGI app (Starlette, `posttrain.policies.server.app`) on uvicorn in front of a
`BatchEngine` (`posttrain.policies.server.engine`): every connection's rows join one running
batch over the model's KV cache, so 64 concurrent clients are decoded together rather than one
after another. Endpoints and their fields are listed in `server/app.py`; the weight-update ones
(`/pause`, `/collective_rpc` `reload_weights`, `/reset_prefix_cache`, `/resume`) are what
`posttrain.training.sync` calls on this server and on vLLM alike, so the embedded default and
the tests run the exact server-in-the-loop path a GPU deployment runs.

A `VisionPolicy` (an image-text-to-text model, chosen when the model directory's config has a
`vision_config`) is served too: chat requests, with `image_url` parts or without, go to its own
batched `generate`; it has no continuous batch, so no completions or weight-update routes.

`--mode fast` decodes with prompt-lookup speculative decoding inside the batch (same output
distribution; `server/engine.py`), or with a draft model's proposals (`--draft DIR`, e.g.
`models/tiny-base-draft`); the prefix cache (a radix tree shared by every request) is on in
both modes (`--prefix-cache-mb`), and each response's `usage` says how many prompt tokens it
reused.

What it is *not*: a production server. No streaming, no authentication, no `best_of`/`echo`/
penalties (refused with 400, not ignored). It binds 127.0.0.1 by default. Log-probs are those
of `TorchPolicy`: temperature-scaled, before top-p.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
from pathlib import Path

from posttrain.policies.local import TorchPolicy
from posttrain.policies.server.app import build_app
from posttrain.policies.server.engine import BatchEngine
from posttrain.policies.vision import VisionPolicy

BACKLOG = 2048
"""listen backlog: a burst of concurrent clients must queue, not be reset (the old standard-
library server's backlog of 5 reset most of 64 simultaneous connections)"""


class PolicyServer:
    """An HTTP server around one policy; `start()` runs it on background threads."""

    def __init__(self, policy: TorchPolicy | VisionPolicy, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None, *, max_batch: int = 256,
                 prefix_cache_mb: float = 64.0, mode: str = "standard", draft: str | None = None,
                 max_draft: int | None = None) -> None:
        import uvicorn

        self.policy = policy
        self.model_name = model_name or policy.version.name
        vision = policy if isinstance(policy, VisionPolicy) else None
        self.engine = (BatchEngine(policy, max_batch=max_batch, prefix_cache_mb=prefix_cache_mb, mode=mode,
                                   draft=draft, max_draft=max_draft)
                       if isinstance(policy, TorchPolicy) else None)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(BACKLOG)
        config = uvicorn.Config(build_app(self.engine, self.model_name, vision=vision), log_level="warning",
                                access_log=False, backlog=BACKLOG, timeout_keep_alive=30,
                                lifespan="off")
        self.uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> PolicyServer:
        if self.engine is not None:
            self.engine.start()
        self._thread = threading.Thread(target=self.serve_forever, name="posttrain-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until `close()` (or Ctrl-C on the main thread)."""
        if self.engine is not None and self.engine._thread is None:
            self.engine.start()
        asyncio.run(self.uvicorn.serve(sockets=[self.sock]))

    def close(self) -> None:
        """Stop serving: open connections are dropped (clients see the server gone)."""
        self.uvicorn.should_exit = True
        self.uvicorn.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.engine is not None:
            self.engine.close()
        try:
            self.sock.close()
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a local HF causal LM over the OpenAI API.")
    parser.add_argument("--model", required=True, help="model directory (or trainer checkpoint)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (0 picks a free one)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    parser.add_argument("--name", default=None, help="model name served (default: its version name)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--max-batch", type=int, default=256, help="rows decoded together at most")
    parser.add_argument("--prefix-cache-mb", type=float, default=64.0,
                        help="prefix cache budget (0 = off): an episode's next turn reuses its keys/values")
    parser.add_argument("--mode", choices=("standard", "fast"), default="standard",
                        help="fast: prompt-lookup speculative decoding in the batch, same output distribution")
    parser.add_argument("--draft", default=None,
                        help="with --mode fast: a draft model directory (same tokenizer) proposes the drafts")
    parser.add_argument("--max-draft", type=int, default=None,
                        help="draft tokens per row per step at most (default 16; 4 with --draft)")
    args = parser.parse_args(argv)
    if args.draft is not None and args.mode != "fast":
        parser.error("--draft needs --mode fast")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    policy: TorchPolicy | VisionPolicy
    config = Path(args.model) / "config.json"
    if config.is_file() and "vision_config" in json.loads(config.read_text()):
        policy = VisionPolicy.load(args.model)
        if args.device:
            policy.model.to(args.device)
    else:
        policy = TorchPolicy(args.model, device=args.device)
    server = PolicyServer(policy, args.host, args.port, args.name,
                          max_batch=args.max_batch, prefix_cache_mb=args.prefix_cache_mb, mode=args.mode,
                          draft=args.draft, max_draft=args.max_draft)
    print(f"listening on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()

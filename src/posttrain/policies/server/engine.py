"""Continuous batching over a `TorchPolicy`'s model: the decode loop behind posttrain's server.

Requests arrive at any time from many connections (`submit`, thread-safe, returns a future). One
engine thread runs the loop, one iteration at a time:

1. **admit** waiting requests (up to `max_batch` rows in flight): each distinct prompt is
   prefilled once (a GRPO group's or an `n > 1` request's rows share it), starting from its
   longest prefix in the prefix cache (a radix tree, `prefix_cache.py`: an episode's earlier
   turns, or another episode's copy of the same instruction), and the new rows join the running
   batch (`ragged.RaggedBatch`: rows of any length in one KV cache). The prompt's keys/values
   enter the tree right after the prefill, pinned until the row finishes (then its completion
   joins them), so requests that arrive meanwhile share them;
2. **decode** one token for every row in flight in one forward pass; rows that finish (EOS, a
   stop string, `max_tokens`, the context) leave the batch at once and their futures resolve,
   so a short request never waits for a long one and a new one never waits for a batch to end.

Sampling is `decode.sample_next` (per-row temperature, top-p and seed), so log-probs are
exactly `TorchPolicy`'s: `log_softmax(logits / T)` before top-p, and greedy output matches it.

**Fast mode** (`mode='fast'`): step 2 feeds each row its new token plus a prompt-lookup draft
(`drafters.PromptLookup`, which copies what followed the row's last n-gram earlier in its prompt
and output) in the same one forward, and the target's distribution at each fed position decides,
as in `TorchPolicy`'s fast mode (`speculative.py`): a position's token is picked (greedy) or
sampled from `decode.sampling_dist` exactly as standard decoding would, and the draft is accepted
while it agrees. The first disagreeing token is emitted and fed at the next step; rejected drafts
are retracted from the row's KV cache. For a deterministic drafter this is the rejection test of
speculative sampling (accept `d` with probability `p(d)`, else sample from `p` without `d`), so
every token follows the target distribution, and greedy output is the standard output (up to
the float rounding of a wider forward). A seed reproduces a fast-mode completion, not the
standard mode's (the two draw their random numbers differently).

With a draft model (`draft=DIR`, `drafters.DraftModel`, e.g. `models/tiny-base-draft`) the
drafts come from a small LM batched over the same rows on its own KV cache (rows join and leave
it with the target's); greedy rows are verified as above, sampled rows by the rejection test
with the draft's distribution `q` (`speculative.accept_sampled`: accept with probability
`min(1, p/q)`, else sample the residual), exactly `TorchPolicy`'s rule.

**Weight updates** (vLLM's dev-mode semantics): `pause(mode='keep')` stops the loop between two
iterations with every in-flight row kept as it is (its KV cache, its tokens); `reload_weights`
copies a directory's weights into the model in place; `resume()` continues the kept rows under
the new weights -- nothing in flight is lost. `pause(mode='wait')` stops admitting and returns
once every row in flight has finished. The prefix cache belongs to the weights that computed it:
it is emptied on reload (and on `reset_prefix_cache`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from posttrain.policies.base import PolicyError
from posttrain.policies.decode import cut_at_stop, sample_next
from posttrain.policies.drafters import DraftModel, PromptLookup
from posttrain.policies.local import TorchPolicy
from posttrain.policies.prefix_cache import PrefixCache, weights_fingerprint
from posttrain.policies.ragged import RaggedBatch
from posttrain.policies.server.rows import EngineStats, Row
from posttrain.policies.server.verify import verify_drafts
from posttrain.policies.server.weights import load_weights_into
from posttrain.values.generation import Completion, SamplingParams


class BatchEngine:
    """The loop described in the module docstring, on its own thread (`start`/`close`)."""

    VERIFY_TOKENS = 256
    """positions one verification forward computes at most (rows x width): a large batch gets
    short drafts, and from this many rows on decodes one token per row, as standard does"""

    def __init__(self, policy: TorchPolicy, *, max_batch: int = 256, prefix_cache_mb: float = 64.0,
                 mode: str = "standard", draft: str | os.PathLike | torch.nn.Module | None = None,
                 max_draft: int | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"BatchEngine max_batch must be >= 1, got {max_batch}")
        if mode not in ("standard", "fast"):
            raise ValueError(f"BatchEngine mode must be 'standard' or 'fast', got {mode!r}")
        if draft is not None and mode != "fast":
            raise ValueError(f"BatchEngine draft= is only used with mode='fast' (got mode={mode!r})")
        if max_draft is not None and max_draft < 1:
            raise ValueError(f"BatchEngine max_draft must be >= 1, got {max_draft}")
        self.mode = mode
        # a draft model's every draft token costs one of its forwards: shorter drafts by default
        self.max_draft = max_draft or (4 if draft is not None else 16)
        self.draft_model = policy._load_draft(draft) if draft is not None else None
        self.drafter: PromptLookup | DraftModel | None = None
        if mode == "fast":
            self.drafter = (PromptLookup() if self.draft_model is None
                            else DraftModel(self.draft_model, policy.pad_id))
        self.policy = policy
        self.model = policy.model.eval()
        self.tokenizer = policy.tokenizer
        self.max_batch = max_batch
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None
        self._epoch = 0  # bumped whenever the cache's contents become stale (reload, reset)
        self.stats = EngineStats()
        self.weights_path: str | None = None
        """the directory the weights were last reloaded from (None: as loaded at start)"""
        self._cv = threading.Condition()
        self._waiting: list[Row] = []
        self._controls: list[tuple[Callable[[], Any], Future]] = []
        self._paused = False
        self._draining = False  # pause(mode='wait'): admit nothing until the batch is empty
        self._idle = threading.Event()  # set while the loop is between iterations with nothing to do
        self._stop = False
        self._rows: list[Row] = []
        self._batch: RaggedBatch | None = None
        self._logits: torch.Tensor | None = None  # next-token logits, one row per row in flight
        self._thread: threading.Thread | None = None
        self._pieces: dict[int, str] = {}
        self._kept: list[int] = []  # `_retire`: the old index of each row still in flight

    # -- public, thread-safe ------------------------------------------------------------
    def start(self) -> BatchEngine:
        self._thread = threading.Thread(target=self._loop, name="posttrain-engine", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for row in self._rows + self._waiting:
            if not row.future.done():
                row.future.set_exception(PolicyError("the server is shutting down"))

    @property
    def rows_in_flight(self) -> int:
        """rows admitted and decoding now (requests still waiting for admission not counted)"""
        return len(self._rows)

    def submit(self, prompt: Sequence[int], sampling: SamplingParams, ignore_eos: bool = False) -> Future:
        """Queue one completion; the future gives a `Completion` (finish_reason 'error' with
        `context_exceeded` when the prompt alone fills the model's context). `ignore_eos`
        (vLLM's extension, for benchmarks) decodes past EOS up to `max_tokens`."""
        fut: Future = Future()
        prompt = list(prompt)
        ctx = self.policy.max_positions
        if ctx is not None and len(prompt) >= ctx:
            fut.set_result(Completion(
                text="", finish_reason="error", prompt_token_ids=prompt, context_exceeded=True,
                error=f"prompt of {len(prompt)} tokens does not fit the model's maximum context "
                      f"length of {ctx} tokens"))
            return fut
        limit = sampling.max_tokens if ctx is None else min(sampling.max_tokens, ctx - len(prompt))
        gen = None
        if sampling.seed is not None:
            gen = torch.Generator(device=self.policy.device)
            gen.manual_seed(int(sampling.seed))
        with self._cv:
            if self._stop:
                raise PolicyError("the server is shutting down")
            self._waiting.append(Row(prompt, sampling, fut, limit, gen, ignore_eos))
            self._cv.notify_all()
        return fut

    def pause(self, mode: str = "keep", timeout: float = 600.0) -> None:
        """Stop generating (see the module docstring); returns once the loop has stopped."""
        if mode not in ("keep", "wait"):
            raise ValueError(f"pause mode must be 'keep' or 'wait', got {mode!r}")
        with self._cv:
            if mode == "wait":
                self._draining = True
            else:
                self._paused = True
            self._cv.notify_all()
        if mode == "wait":
            deadline = time.monotonic() + timeout
            with self._cv:
                while self._rows and time.monotonic() < deadline:
                    self._cv.wait(0.05)
                self._paused, self._draining = True, False
        self.call(lambda: None, timeout)  # runs between iterations: the loop is now stopped

    def resume(self) -> None:
        with self._cv:
            self._paused = self._draining = False
            self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def reload_weights(self, weights_path: str, timeout: float = 600.0) -> int:
        """Load a directory's weights between two iterations (paused or not); returns the
        number of tensors loaded. The prefix cache is emptied: its keys/values are stale."""
        path = str(Path(weights_path))

        def load() -> int:
            n = load_weights_into(self.model, path)
            self._clear_cache()
            self.weights_path = path
            self.stats.reloads += 1
            return n

        return self.call(load, timeout)

    def reset_prefix_cache(self) -> None:
        self.call(self._clear_cache)

    def _clear_cache(self) -> None:
        # rows in flight keep decoding (pause mode 'keep') but their earlier keys/values belong
        # to the old weights: the new epoch keeps them out of the cache when they finish
        self._epoch += 1
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def call(self, fn: Callable[[], Any], timeout: float = 600.0) -> Any:
        """Run `fn` on the engine thread between two iterations; returns its result."""
        fut: Future = Future()
        with self._cv:
            self._controls.append((fn, fut))
            self._cv.notify_all()
        return fut.result(timeout=timeout)

    def load(self) -> int:
        """Rows in flight plus waiting (for least-loaded routing)."""
        with self._cv:
            return len(self._rows) + len(self._waiting)

    # -- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._controls and (
                        self._paused or (not self._rows and (not self._waiting or self._draining))):
                    self._cv.wait()
                if self._stop:
                    return
                controls, self._controls = self._controls, []
                admit: list[Row] = []
                if not self._paused and not self._draining:
                    room = self.max_batch - len(self._rows)
                    admit, self._waiting = self._waiting[:room], self._waiting[room:]
            for fn, fut in controls:
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - the caller gets it
                    fut.set_exception(e)
            if self._paused:
                continue
            try:
                with torch.inference_mode():
                    if admit:
                        self._admit(admit)
                    if self._rows:
                        self._step()
            except Exception as e:  # noqa: BLE001 - the model failed: every row in flight fails
                failed = self._rows + admit
                self._rows, self._batch, self._logits = [], None, None
                if self.drafter is not None:
                    self.drafter.select([])
                for row in failed:
                    if self.prefix_cache is not None:
                        self.prefix_cache.release(row.pin)
                        row.pin = None
                    if not row.future.done():
                        row.future.set_exception(PolicyError(f"generation failed: {type(e).__name__}: {e}"))
            with self._cv:
                self._cv.notify_all()  # pause(mode='wait') watches the rows drain

    def _admit(self, rows: list[Row]) -> None:
        cache = self.prefix_cache
        if cache is not None:
            cache.check_weights(weights_fingerprint(self.model))
        distinct: dict[tuple, int] = {}
        starts: list[tuple[list[int], Any, list[int]]] = []
        row_of = []
        for row in rows:
            n, kv = cache.lookup(row.prompt, limit=len(row.prompt) - 1) if cache is not None else (0, None)
            row.reused = n
            row.epoch = self._epoch
            key = (tuple(row.prompt), n)
            if key not in distinct:
                distinct[key] = len(starts)
                starts.append((row.prompt[:n], kv, row.prompt[n:]))
            row_of.append(distinct[key])
        batch = RaggedBatch(self.model, self.policy.pad_id, [(p, kv) for p, kv, _ in starts])
        logits, _ = batch.forward([rest for _, _, rest in starts])
        if cache is not None:
            # each prompt enters the tree now, pinned while its rows run: a request arriving
            # meanwhile (another episode of the same task) reuses it at once
            pins = [cache.insert(batch.fed[s], batch.row_kv(s), lock=True) for s in range(len(starts))]
            for row, s in zip(rows, row_of):
                row.pin = pins[s]
                cache.pin(row.pin)
            for handle in pins:
                cache.release(handle)
        index = torch.tensor(row_of, device=logits.device)
        last = logits[:, -1, :][index]
        batch.select(row_of)
        if self.drafter is not None:
            if not self._rows:
                self.drafter.select([])
            self.drafter.add([row.prompt for row in rows], [row.sampling.temperature for row in rows],
                             [row.sampling.top_p for row in rows], [row.generator for row in rows])
        if self._batch is None or not self._rows:
            self._batch, self._logits, self._rows = batch, last, list(rows)
        else:  # join the running batch: every row's keys/values, right-aligned in one cache
            old = self._batch
            prefixes = ([(old.fed[r], old.row_kv(r)) for r in range(len(old))]
                        + [(batch.fed[r], batch.row_kv(r)) for r in range(len(batch))])
            self._batch = RaggedBatch(self.model, self.policy.pad_id, prefixes)
            assert self._logits is not None
            self._logits = torch.cat([self._logits, last])
            self._rows = self._rows + list(rows)
        self.stats.requests += len(rows)
        self.stats.max_rows = max(self.stats.max_rows, len(self._rows))

    def _step(self) -> None:
        rows, batch = self._rows, self._batch
        assert batch is not None and self._logits is not None
        device = self._logits.device
        # 1. every row's next token: sampled from its logits, or already emitted (fast mode)
        toks = [row.pending for row in rows]
        need = [i for i, row in enumerate(rows) if row.pending is None]
        if need:
            temps = torch.tensor([rows[i].sampling.temperature for i in need], dtype=torch.float32, device=device)
            top_ps = torch.tensor([rows[i].sampling.top_p for i in need], dtype=torch.float32, device=device)
            logits = self._logits if len(need) == len(rows) else self._logits[torch.tensor(need, device=device)]
            tokens, logps = sample_next(logits, temps, top_ps, [rows[i].generator for i in need])
            for i, tok, lp in zip(need, tokens.tolist(), logps.tolist()):
                toks[i] = tok
                self._emit(rows[i], tok, lp)
        for row in rows:
            row.pending = None
        self.stats.steps += 1
        self.stats.row_steps += len(rows)
        if not self._retire():
            return
        rows, batch = self._rows, self._batch
        assert batch is not None
        fed = [int(toks[i]) for i in self._kept]  # type: ignore[arg-type]  # every row has one now
        # 2. feed them (fast mode: each with its row's draft) in one forward
        drafts: list[list[int]] = [[] for _ in rows]
        qs: list[torch.Tensor | None] = [None] * len(rows)
        if self.drafter is not None:
            for r, row in enumerate(rows):  # last step's accepted drafts, then the token fed now
                self.drafter.commit(r, row.accepted, row.draft[:row.accepted] + [fed[r]])
                row.draft, row.accepted = [], 0
            cap = self.VERIFY_TOKENS // len(rows) - 1
            budgets = [max(0, min(row.depth, self.max_draft, cap, row.limit - len(row.ids) - 1)) for row in rows]
            drafts, qs = self.drafter.propose(budgets)
        logits, lengths = batch.forward([[t] + d for t, d in zip(fed, drafts)])
        if not any(drafts):
            self._logits = logits[:, -1, :]
            return
        self._logits = verify_drafts(rows, batch, drafts, qs, logits, lengths,
                                     emit=self._emit, max_draft=self.max_draft, stats=self.stats)
        self._retire()

    def _emit(self, row: Row, tok: int, logprob: float) -> None:
        if row.finish:
            return
        row.ids.append(tok)
        row.logprobs.append(logprob)
        self.stats.tokens += 1
        if (tok in self.policy.eos_ids and not row.ignore_eos) or self._stopped(row):
            row.finish = "stop"
        elif len(row.ids) >= row.limit:
            row.finish = "length"

    def _retire(self) -> bool:
        """Resolve the finished rows and take them out of the batch (their keys/values enter the
        prefix cache); `_kept` is the old index of each row left. False when none is left."""
        rows, batch = self._rows, self._batch
        assert batch is not None and self._logits is not None
        self._kept = [i for i, row in enumerate(rows) if not row.finish]
        if len(self._kept) == len(rows):
            return True
        for i, row in enumerate(rows):
            if row.finish:
                if self.prefix_cache is not None:
                    if row.epoch == self._epoch:
                        self.prefix_cache.insert(batch.fed[i], batch.row_kv(i))
                    self.prefix_cache.release(row.pin)
                self._finish(row)
        if self.drafter is not None:
            self.drafter.select(self._kept)
        if not self._kept:
            self._rows, self._batch, self._logits = [], None, None
            return False
        batch.select(self._kept)
        batch.compact()
        self._rows = [rows[i] for i in self._kept]
        self._logits = self._logits[torch.tensor(self._kept, device=self._logits.device)]
        return True

    # -- text -----------------------------------------------------------------------------
    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _stopped(self, row: Row) -> bool:
        stops = [s for s in row.sampling.stop if s]
        if not stops:
            return False
        span = max(map(len, stops)) + 16
        if self.policy._piecewise:  # tokens decode piece by piece: grow the tail by one piece
            piece = self._pieces.get(row.ids[-1])
            if piece is None:
                piece = self._pieces[row.ids[-1]] = self._text([row.ids[-1]])
            row.tail = (row.tail + piece)[-span:]
        else:
            row.tail = self._text(row.ids[-span:])
        return any(s in row.tail for s in stops)

    def _finish(self, row: Row) -> None:
        """Resolve the row's future: the text cut before the first stop string, the tokens up to
        and including the one that completed it (as `TorchPolicy` and vLLM report them)."""
        text, ids, logprobs = cut_at_stop(self._text, row.ids, row.logprobs, row.sampling.stop)
        row.future.set_result(Completion(
            text=text, finish_reason=row.finish,  # type: ignore[arg-type]
            prompt_token_ids=row.prompt, token_ids=ids, logprobs=logprobs,
            gen_s=time.perf_counter() - row.t0, prefill_tokens=len(row.prompt) - row.reused,
            reused_tokens=row.reused))

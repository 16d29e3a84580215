"""From trajectories to token tensors, and the teacher-forced log-probs of a batch.

A trajectory becomes `Sample`s holding exactly the ids the sampler saw and produced (no
re-tokenisation drift), the sampler's log-probs and the trajectory's advantage:

* **multi-turn, one sequence** (the field's way, when the episode ran token-in/token-out: each
  turn's prompt ids extend the previous turn's prompt + completion ids): the whole episode is one
  sample, `prompt_ids` (the first observation) followed by every turn's generated ids with the
  observation ids between them (`between`). Only the model's own tokens are trained: log-probs
  are taken at generated positions only (per turn, in order), observations and tool output are
  context. The history is computed once instead of once per turn;
* **one sample per turn** otherwise (turns whose prompts do not extend each other, e.g. a
  backend that re-rendered the history): each turn's recorded prompt and its generated ids.

Either way the loss mask is implicit: only generated tokens get a log-prob, prompt tokens
(observations, tool output) never do, and `completion_ids` holds exactly the trained tokens.

**Images** (episodes of a `VisionPolicy`): a sequence's prompt ids hold one image token per image
position, all the same id; what fills them comes from the images themselves. A sample carries the
images its sequence shows, in reading order (a turn's prompt shows every observation image of
its episode so far), re-run through the policy's processor (`image_inputs`, given to
`samples_from`): the trajectory keeps the bytes, not the pixel tensors. Image positions are
observation tokens, so they are context, never trained. Prompts are shared across a group only
when their images are the same too (ids alone cannot tell two pictures apart).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.policies.decode import cache_kwarg, keep_last, left_pad, output_cache, positions_of
from posttrain.policies.vision import placeholder_ids
from posttrain.values.image import Image
from posttrain.values.trajectory import Trajectory

ImageInputs = Callable[[Sequence[Image]], dict[str, Any]]
"""images -> the model's image tensors for them (pixel values, ...; `VisionPolicy.image_inputs`)"""


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float] | None
    advantage: float
    owner: int
    """index of the trajectory (within the step) this turn belongs to"""
    turn_lengths: list[int] | None = None
    """a merged multi-turn sample: generated ids per turn (they sum to len(completion_ids))"""
    between: list[list[int]] | None = None
    """a merged multi-turn sample: the observation ids that follow each turn but the last"""
    images: tuple[str, ...] = ()
    """SHA-256 of every image the sequence shows, in reading order"""
    prompt_images: int = 0
    """how many of `images` sit in `prompt_ids` (the rest in `between`)"""
    image_inputs: dict[str, Any] | None = None
    """the model's image tensors for `images` (from the policy's processor), batched along dim 0"""

    def tail(self) -> tuple[list[int], list[bool]]:
        """Everything after the prompt, and which of it the model generated (the loss mask)."""
        if not self.turn_lengths:
            return list(self.completion_ids), [True] * len(self.completion_ids)
        ids: list[int] = []
        mask: list[bool] = []
        at = 0
        for i, n in enumerate(self.turn_lengths):
            ids += self.completion_ids[at:at + n]
            mask += [True] * n
            at += n
            if i < len(self.turn_lengths) - 1:
                ids += self.between[i]  # type: ignore[index]
                mask += [False] * len(self.between[i])  # type: ignore[index]
        return ids, mask


def _shown(traj: Trajectory, turns: Sequence[Any]) -> list[Image]:
    """The images `turns` showed, in order, from the trajectory's bytes."""
    out = []
    for turn in turns:
        for ref in turn.observation_images:
            img = traj.images.get(ref["sha256"])
            if img is None:
                raise ValueError(f"trajectory {traj.id} turn {turn.index} showed image {ref['sha256']}, whose "
                                 "bytes it does not carry (load it with its images from the store)")
            out.append(img)
    return out


def _memo(image_inputs: ImageInputs) -> ImageInputs:
    seen: dict[tuple[str, ...], dict[str, Any]] = {}

    def inputs(images: Sequence[Image]) -> dict[str, Any]:
        key = tuple(img.sha256 for img in images)
        if key not in seen:
            seen[key] = dict(image_inputs(images))
        return seen[key]
    return inputs


def _with_images(sample: Sample, traj: Trajectory, shown: list[Image], prompt_images: int,
                 image_inputs: ImageInputs | None) -> Sample:
    if not shown:
        return sample
    if image_inputs is None:
        raise ValueError(f"trajectory {traj.id} ({traj.domain}) showed the policy {len(shown)} image(s): "
                         "train it with the VisionPolicy that sampled it (a text model has no image inputs)")
    sample.images = tuple(img.sha256 for img in shown)
    sample.prompt_images = prompt_images
    sample.image_inputs = dict(image_inputs(shown))
    return sample


def merged(traj: Trajectory, adv: float, owner: int) -> Sample | None:
    """The whole episode as one sample, or None unless every turn has token ids and each
    turn's prompt extends the previous prompt + completion (token-in/token-out)."""
    turns = traj.turns
    if len(turns) < 2 or any(not t.token_ids or not t.prompt_token_ids for t in turns):
        return None
    between = []
    for prev, nxt in zip(turns, turns[1:]):
        history = list(prev.prompt_token_ids) + list(prev.token_ids)  # type: ignore[arg-type]
        if list(nxt.prompt_token_ids[:len(history)]) != history:  # type: ignore[index]
            return None
        between.append(list(nxt.prompt_token_ids[len(history):]))  # type: ignore[index]
    if any(t.logprobs is not None and len(t.logprobs) != len(t.token_ids) for t in turns):  # type: ignore[arg-type]
        return None  # reported by the per-turn path below
    old = None if any(t.logprobs is None for t in turns) else [lp for t in turns for lp in t.logprobs]  # type: ignore[union-attr]
    return Sample(list(turns[0].prompt_token_ids), [i for t in turns for i in t.token_ids],  # type: ignore[arg-type, union-attr]
                  old, float(adv), owner, [len(t.token_ids) for t in turns], between)  # type: ignore[arg-type]


def samples_from(trajectories: Sequence[Trajectory], advantages: Sequence[float], *,
                 merge_turns: bool = True, image_inputs: ImageInputs | None = None
                 ) -> tuple[list[Sample], int]:
    """The samples of a step (see the module docstring); returns (samples, turns skipped).

    A turn without recorded token ids (a backend that does not expose them) or with an empty
    prompt cannot be trained on; it is skipped and counted. A trajectory that showed images
    needs `image_inputs` (a text trainer refuses it, naming it)."""
    samples, skipped = [], 0
    if image_inputs is not None:  # a GRPO group shows its pictures G times: process them once
        image_inputs = _memo(image_inputs)
    for owner, (traj, adv) in enumerate(zip(trajectories, advantages)):
        whole = merged(traj, adv, owner) if merge_turns else None
        if whole is not None:
            first = len(traj.turns[0].observation_images)
            samples.append(_with_images(whole, traj, _shown(traj, traj.turns), first, image_inputs))
            continue
        for k, turn in enumerate(traj.turns):
            if not turn.token_ids:
                skipped += turn.token_ids is None
                continue
            if not turn.prompt_token_ids:
                skipped += 1
                continue
            old = turn.logprobs
            if old is not None and len(old) != len(turn.token_ids):
                raise ValueError(f"trajectory {traj.id} turn {turn.index}: {len(old)} log-probs for "
                                 f"{len(turn.token_ids)} token ids")
            sample = Sample(list(turn.prompt_token_ids), list(turn.token_ids),
                            None if old is None else list(old), float(adv), owner)
            shown = _shown(traj, traj.turns[:k + 1])  # the prompt re-shows every earlier image
            samples.append(_with_images(sample, traj, shown, len(shown), image_inputs))
    return samples, skipped


def sequence_logprobs(model: torch.nn.Module, samples: Sequence[Sample], *, temperature: float,
                      with_entropy: bool = False, share_prompts: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of every generated token of `samples`, flat, in sample order, computed as the
    sampler does: log_softmax(logits / temperature). Differentiable unless under no_grad.
    Returns (log-probs, per-token entropy or None).

    A GRPO batch repeats each prompt once per sample of its group. With `share_prompts` (and a
    model whose KV cache can select rows), each distinct prompt is run once, its cache copied to
    its samples, and only the completions are run on top: the gradient flows back through the
    shared cache into the one prompt pass. Same numbers as running every sequence whole (up to
    float rounding), a fraction of the compute when prompts are long and answers short."""
    distinct = {_prompt_key(s) for s in samples}
    # images in a tail would need their pixels in the completion pass: such batches run whole
    if share_prompts and len(distinct) < len(samples) and all(s.prompt_images == len(s.images) for s in samples):
        out = _shared_prompt_logits(model, samples)
        if out is not None:
            return _gather(out[0], out[1], out[2], temperature, with_entropy, placeholder_ids(model))
    return _gather(*_whole_sequence_logits(model, samples), temperature, with_entropy, placeholder_ids(model))


def _prompt_key(s: Sample) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Two prompts are the same when their ids *and* their pictures are (image positions all
    hold one token id)."""
    return tuple(s.prompt_ids), s.images[:s.prompt_images]


def image_kwargs(samples: Sequence[Sample], device: torch.device) -> dict[str, torch.Tensor]:
    """The forward() keywords with the image tensors of `samples`, concatenated in row order:
    the model fills its image positions from them in reading order, row after row."""
    shown = [s for s in samples if s.images]
    if not shown:
        return {}
    for s in shown:
        if s.image_inputs is None:
            raise ValueError(f"a sample shows {len(s.images)} image(s) but carries no image inputs "
                             "(build it with samples_from(..., image_inputs=...))")
    keys = shown[0].image_inputs.keys()  # type: ignore[union-attr]
    return {k: torch.cat([torch.as_tensor(s.image_inputs[k]) for s in shown]).to(device)  # type: ignore[index]
            for k in keys}


def _gather(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, temperature: float,
            with_entropy: bool, never: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [B, K, V] predicting targets [B, K]; valid [B, K] marks generated tokens; `never`:
    token ids the sampler never draws (image placeholders), out of the distribution here too."""
    scaled = logits.float() / temperature
    if never:
        scaled = scaled.index_fill(-1, torch.tensor(list(never), device=scaled.device), float("-inf"))
    logp_all = torch.log_softmax(scaled, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():  # a token of probability 0 adds 0 (not 0 * -inf)
            entropy = -(logp_all.exp() * logp_all.clamp_min(torch.finfo(logp_all.dtype).min)).sum(-1)[valid]
    return logp[valid], entropy


def _whole_sequence_logits(model: torch.nn.Module, samples: Sequence[Sample]
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every sequence run whole, left-padded: each row's generated tokens are its last columns,
    so only the last (longest completion + 1) positions need logits (`logits_to_keep`)."""
    device = next(model.parameters()).device
    tails = [s.tail() for s in samples]
    ids, mask = (t.to(device) for t in left_pad([s.prompt_ids + t[0] for s, t in zip(samples, tails)]))
    keep = max(len(t[0]) for t in tails)
    valid = torch.zeros((len(samples), keep), dtype=torch.bool)
    for i, (_, gen) in enumerate(tails):
        valid[i, keep - len(gen):] = torch.tensor(gen, dtype=torch.bool)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_of(mask), use_cache=False,
                   **keep_last(model, keep + 1), **image_kwargs(samples, device)).logits
    return logits[:, -(keep + 1):-1, :], ids[:, -keep:], valid.to(device)


def _shared_prompt_logits(model: torch.nn.Module, samples: Sequence[Sample]
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Distinct prompts once (left-padded), completions on their copied cache (right-padded).
    None when the model's cache cannot select rows."""
    device = next(model.parameters()).device
    index: dict[tuple[tuple[int, ...], tuple[str, ...]], int] = {}
    firsts: list[Sample] = []  # one sample per distinct prompt, in `index` order
    row_of = []
    for s in samples:
        row = index.setdefault(_prompt_key(s), len(index))
        if row == len(firsts):
            firsts.append(s)
        row_of.append(row)
    p_ids, p_mask = (t.to(device) for t in left_pad([ids for ids, _ in index]))
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=positions_of(p_mask), use_cache=True,
                **keep_last(model, 1), **image_kwargs(firsts, device))
    cache = output_cache(out)
    if not hasattr(cache, "batch_select_indices"):
        return None
    rows = torch.tensor(row_of, device=device)
    cache.batch_select_indices(rows)  # differentiable gather: a repeated index copies the row
    tails = [s.tail() for s in samples]
    keep = max(len(t[0]) for t in tails)
    c_ids = torch.zeros((len(samples), keep), dtype=torch.long)
    valid = torch.zeros((len(samples), keep), dtype=torch.bool)
    present = torch.zeros((len(samples), keep), dtype=torch.long)
    for i, (tail_ids, gen) in enumerate(tails):
        c_ids[i, :len(tail_ids)] = torch.tensor(tail_ids, dtype=torch.long)
        valid[i, :len(gen)] = torch.tensor(gen, dtype=torch.bool)
        present[i, :len(tail_ids)] = 1
    c_ids, valid = c_ids.to(device), valid.to(device)
    mask = torch.cat([p_mask[rows], present.to(device)], dim=1)
    positions = p_mask[rows].sum(-1, keepdim=True) + torch.arange(keep, device=device)[None, :]
    # padding after a short tail would count on past the row's end (a long prompt beside another
    # sample's long tail can pass the model's last position): masked columns sit at position 0
    positions = positions * present.to(device)
    logits = model(input_ids=c_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                   **{cache_kwarg(model): cache}).logits
    # The prompt's last logits predict the first generated token; each generated token's
    # logits predict the next one.
    predicting = torch.cat([out.logits[:, -1:, :][rows], logits[:, :-1, :]], dim=1)
    return predicting, c_ids, valid

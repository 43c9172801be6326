"""How a rollout's samples are laid out for the model in the update's passes.

A rollout of P prompts x n answers is packed once into padded tensors (`pack_rollout`:
prompts left-padded, answers right-padded). Each pass (a micro-batch) then takes some of
its samples in one of three layouts:

- one row per sample (`sample_rows`): the sample's prompt and its answer back to back,
  right-padded. A causal model needs no attention mask: no real token looks at a later
  (padding) position.
- a group's answers after one copy of their prompt (`shared_prompt_rows`,
  `--share-prompt`): the n answers to one prompt share it, so the row is the prompt once,
  then every answer, and an attention mask lets each answer see the prompt and itself only;
  each answer's positions go on from the prompt's end, as in its own row. The same
  log-probs to float rounding, for fewer tokens through the model where prompts are long
  beside their answers: the cpu preset's prompt (two worked examples, ~175 tokens) is most
  of a row whose answer has 13-17 tokens on average (48 at most), and 8 answers carry it
  once instead of 8 times. The price is a dense mask, so attention cannot take its causal
  fast path, and attends over the whole row (prompt and every answer) where each answer
  needed only its own: on an H200, at the recipe's ~290-token answers, the update was 8-11%
  slower with a third fewer tokens (BENCHMARKS.md), so the recipe leaves it off.
- samples back to back (`packed_rows`, `--padding-free`): rows as long as the longest
  sample, each filled first-fit with whole samples whose positions count from 0, so only a
  row's end is padding; transformers reads the restarts of the positions as the starts of
  new sequences and keeps them apart (block-diagonal causal attention). A row per sample
  pads each row to its pass's longest: the group-size study's checkpointed passes (24,576
  tokens) were 8-22% padding; benchmarks/bench_update.py's made-up rollout of the recipe's
  lengths is 14.3% padding so and 2.7% back to back. Through a mask, sdpa loses its causal
  fast path: on an H100 the recipe's update alone was 5-30% slower for 5-12% fewer tokens
  (BENCHMARKS.md). So where torch's varlen flash kernel runs (a CUDA GPU, torch >= 2.10) the
  packed samples go through it with no mask (`use_varlen_attention`, at the end of this
  module); the recipe leaves the layout off until that has been measured to pay.

`micro_batches` and its kin for the other layouts split a global batch into passes: a fixed
number of samples each (`--micro-batch-size`) or as many as fit in `--max-tokens-per-gpu`
padded tokens (`--use-dynamic-batch-size`; miles' names).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch


@dataclass
class RolloutBatch:
    """A rollout packed for training: [N, P + R] tokens, with the answer part marked."""

    input_ids: torch.Tensor  # [N, P + R]
    attention_mask: torch.Tensor  # [N, P + R]
    response_mask: torch.Tensor  # [N, R] 1 on answer tokens
    prompt_width: int  # P
    advantages: torch.Tensor  # [N]
    engine_logprobs: torch.Tensor | None  # [N, R] the engine's sampling log-probs, if given
    engine_rows: torch.Tensor | None = None  # [N] 1 where a sample has the engine's log-probs
    old_logprobs: torch.Tensor | None = None  # [N, R] the trainer's, before the update
    ref_logprobs: torch.Tensor | None = None  # [N, R] the reference model's (KL loss only)
    prompt_index: torch.Tensor | None = None  # [N] samples with one index have one prompt

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]


def pack_rollout(
    prompt_ids: list[list[int]], response_ids: list[list[int]], advantages: torch.Tensor,
    engine_logprobs: list[list[float] | None], pad_id: int,
) -> RolloutBatch:
    """Pack one (prompt, answer) pair per sample into a RolloutBatch.

    `engine_logprobs[i]` may be None for samples the engine gave no log-probs for (it is
    asked for them on a few prompts only); `engine_rows` marks the others. Samples whose
    prompts are the same tokens get the same `prompt_index` (a group's answers do)."""
    n = len(prompt_ids)
    p_width = max(len(p) for p in prompt_ids)
    r_width = max(1, max(len(r) for r in response_ids))
    ids = torch.full((n, p_width + r_width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    rmask = torch.zeros((n, r_width), dtype=torch.float32)
    rows = torch.tensor([lp is not None for lp in engine_logprobs], dtype=torch.float32)
    elp = torch.zeros((n, r_width), dtype=torch.float32) if rows.any() else None
    seen: dict[tuple[int, ...], int] = {}
    index = torch.tensor([seen.setdefault(tuple(p), len(seen)) for p in prompt_ids], dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        ids[i, p_width - len(p) : p_width] = torch.tensor(p, dtype=torch.long)
        ids[i, p_width : p_width + len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, p_width - len(p) : p_width + len(r)] = 1
        rmask[i, : len(r)] = 1.0
        if engine_logprobs[i] is not None:
            elp[i, : len(r)] = torch.tensor(engine_logprobs[i], dtype=torch.float32)
    return RolloutBatch(ids, attn, rmask, p_width, advantages.float().reshape(-1), elp,
                        rows if elp is not None else None, prompt_index=index)


def sample_lengths(batch: RolloutBatch) -> torch.Tensor:
    """Tokens of each sample, prompt and answer: its width in a row of its own."""
    return batch.attention_mask.sum(dim=1)


def longest_first(batch: RolloutBatch, idx: torch.Tensor) -> torch.Tensor:
    """`idx` sorted by sample length, longest first (ties keep their order)."""
    lengths = sample_lengths(batch)
    return idx[torch.argsort(lengths[idx], descending=True, stable=True)]


# ---------------------------------------------------------------------- micro-batches
def micro_batches(batch: RolloutBatch, idx: torch.Tensor, *, max_samples: int,
                  max_tokens: int | None = None) -> list[torch.Tensor]:
    """Split the samples `idx` (in order) into micro-batches of one row per sample.

    Fixed: `max_samples` samples each. Dynamic (`max_tokens` given): add samples while the
    padded micro-batch (rows x its longest prompt + answer) stays within `max_tokens`;
    a sample longer than the budget goes alone. Sort `idx` by length first to cut padding."""
    if max_tokens is None:
        return [idx[i : i + max_samples] for i in range(0, len(idx), max_samples)]
    lengths = sample_lengths(batch)
    units = [(torch.tensor([i]), int(lengths[i])) for i in idx.tolist()]
    return [torch.cat([u for u, _ in mb]) for mb in _fill(units, max_tokens)]


def shared_micro_batches(batch: RolloutBatch, idx: torch.Tensor, *, max_samples: int,
                         max_tokens: int | None = None) -> list[list[torch.Tensor]]:
    """Split the samples `idx` into micro-batches of the shared-prompt layout: each a list of
    rows, a row the samples of one prompt (`shared_prompt_plan`). Dynamic: rows x the widest
    within `max_tokens`; fixed: at most `max_samples` samples (rows are kept whole)."""
    rows = shared_prompt_plan(batch, idx, max_samples=max_samples, max_tokens=max_tokens)
    if max_tokens is not None:
        return [[r for r, _ in mb] for mb in _fill(rows, max_tokens)]
    out, cur, count = [], [], 0
    for r, _ in rows:
        if cur and count + len(r) > max_samples:
            out.append(cur)
            cur, count = [], 0
        cur.append(r)
        count += len(r)
    if cur:
        out.append(cur)
    return out


def packed_micro_batches(batch: RolloutBatch, idx: torch.Tensor, *, max_samples: int,
                         max_tokens: int | None = None) -> list[list[torch.Tensor]]:
    """Split the samples `idx` (longest first) into micro-batches of the padding-free layout:
    each a list of rows, a row the samples laid back to back in it.

    A row holds as many tokens as the longest sample; the samples go, longest first, into
    the first row with room (first-fit decreasing), so only each row's tail is padding.
    Dynamic (`max_tokens`): the longest of `idx` sets the room of every row, and a
    micro-batch takes rows while rows x that room stays within `max_tokens`; fixed:
    `max_samples` samples each, in rows as long as their own longest."""
    lengths = sample_lengths(batch)
    if max_tokens is None:
        groups = [idx[i : i + max_samples] for i in range(0, len(idx), max_samples)]
        return [_first_fit(g, lengths) for g in groups]
    rows = _first_fit(idx, lengths)
    if not rows:
        return []
    width = int(lengths[idx].max())
    per_pass = max(1, max_tokens // width)
    return [rows[i : i + per_pass] for i in range(0, len(rows), per_pass)]


def _first_fit(idx: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    """The samples `idx`, longest first, into rows as wide as the longest: each in the first
    row it fits (first-fit decreasing)."""
    order = idx[torch.argsort(lengths[idx], descending=True, stable=True)].tolist()
    if not order:
        return []
    width = int(lengths[order[0]])
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = int(lengths[i])
        for b, free in enumerate(room):
            if n <= free:
                rows[b].append(i)
                room[b] -= n
                break
        else:
            rows.append([i])
            room.append(width - n)
    return [torch.tensor(r, dtype=torch.long) for r in rows]


def passes(batch: RolloutBatch, idx: torch.Tensor, device, *, max_samples: int,
           max_tokens: int | None = None, share_prompt: bool = False, padding_free: bool = False):
    """The update's passes over the samples `idx`: (samples, Rows) for each micro-batch, in
    the layout asked for, on `device`."""
    if share_prompt and padding_free:
        raise ValueError("one layout at a time: share_prompt or padding_free")
    if padding_free:
        for rows in packed_micro_batches(batch, idx, max_samples=max_samples, max_tokens=max_tokens):
            yield torch.cat(rows), packed_rows(batch, rows, device)
    elif share_prompt:
        for rows in shared_micro_batches(batch, idx, max_samples=max_samples, max_tokens=max_tokens):
            yield torch.cat(rows), shared_prompt_rows(batch, rows, device)
    else:
        for mb in micro_batches(batch, idx, max_samples=max_samples, max_tokens=max_tokens):
            yield mb, sample_rows(batch, mb, device)


def _fill(units: list[tuple[torch.Tensor, int]], max_tokens: int) -> list[list[tuple[torch.Tensor, int]]]:
    """Group (samples, width) rows into passes of at most `max_tokens` padded tokens
    (rows x the widest); a row wider than the budget goes alone."""
    out, cur, width = [], [], 0
    for unit in units:
        wide = max(width, unit[1])
        if cur and (len(cur) + 1) * wide > max_tokens:
            out.append(cur)
            cur, wide = [], unit[1]
        cur.append(unit)
        width = wide
    if cur:
        out.append(cur)
    return out


def shared_prompt_plan(batch: RolloutBatch, idx: torch.Tensor, *, max_samples: int,
                       max_tokens: int | None = None) -> list[tuple[torch.Tensor, int]]:
    """The rows of the shared-prompt layout for the samples `idx`: (samples, width) each,
    widest first. A row holds answers of one prompt (in `idx`'s order), as many as fit in
    `max_tokens` with the prompt once (dynamic) or at most `max_samples` (fixed)."""
    prompt_len = batch.attention_mask[:, : batch.prompt_width].sum(dim=1)
    answer_len = batch.response_mask.sum(dim=1).long()
    groups: dict[int, list[int]] = {}
    for i in idx.tolist():
        key = int(batch.prompt_index[i]) if batch.prompt_index is not None else -1 - i
        groups.setdefault(key, []).append(i)
    rows = []
    for members in groups.values():
        cur, width = [], int(prompt_len[members[0]])
        for i in members:
            full = len(cur) >= max_samples if max_tokens is None else (
                width + int(answer_len[i]) > max_tokens)
            if cur and full:
                rows.append((torch.tensor(cur), width))
                cur, width = [], int(prompt_len[i])
            cur.append(i)
            width += int(answer_len[i])
        rows.append((torch.tensor(cur), width))
    rows.sort(key=lambda row: row[1], reverse=True)  # stable: ties keep the groups' order
    return rows


# ---------------------------------------------------------------------- one pass's tensors
@dataclass
class Rows:
    """One micro-batch as the model sees it, and where its answer tokens are.

    The micro-batch's samples are numbered 0..S-1 in the order of the indices it was made
    from; answer token k of sample s sits at `col` k, in `row`, predicted by the hidden state
    at position `at` of that row."""

    ids: torch.Tensor  # [B, W] right-padded rows
    positions: torch.Tensor  # [B, W] position ids
    mask: torch.Tensor | None  # [B, 1, W, W] True where a token may look; None: causal
    rmask: torch.Tensor  # [S, r] 1 on answer tokens
    r: int  # the longest answer
    sample: torch.Tensor  # [T] the sample of each answer token
    col: torch.Tensor  # [T] its place in the answer
    row: torch.Tensor  # [T] the row it is in
    at: torch.Tensor  # [T] the position whose hidden state predicts it
    targets: torch.Tensor  # [T] the token
    real: int  # positions that hold a token (the rest is padding)
    # packed rows only (varlen_attention): where each sample, and each row's padding,
    # starts in the rows flattened to B x W tokens, then B x W; and the longest of them
    segments: torch.Tensor | None = None  # [K + 1] int32
    longest: int = 0

    def spread(self, flat: torch.Tensor) -> torch.Tensor:
        """[T] per answer token -> [S, r], zeros off the answers."""
        return flat.new_zeros(self.rmask.shape).index_put((self.sample, self.col), flat)


def sample_rows(batch: RolloutBatch, idx: torch.Tensor, device) -> Rows:
    """Samples `idx` as right-padded rows of prompt + answer, one row each, on `device`.

    A row holds its prompt and its answer back to back and padding only at its end, so the
    width is the longest prompt + answer of the micro-batch (the packed batch's layout pads
    to the longest prompt plus the longest answer)."""
    p = batch.prompt_width
    prompt_len = batch.attention_mask[idx, :p].sum(dim=1)
    answer_len = batch.response_mask[idx].sum(dim=1).long()
    r = int(answer_len.max().clamp(min=1))
    width = int((prompt_len + answer_len).max())
    cols = torch.arange(width)
    src = (p - prompt_len)[:, None] + cols[None, :]  # the packed column of each row's token
    real = cols[None, :] < (prompt_len + answer_len)[:, None]
    ids = batch.input_ids[idx].gather(1, src.clamp(max=batch.input_ids.shape[1] - 1))
    ids = torch.where(real, ids, torch.zeros_like(ids))
    rmask = batch.response_mask[idx, :r]
    rows, k = rmask.nonzero(as_tuple=True)  # answer token k of row `rows`...
    at = prompt_len[rows] + k - 1  # ...is predicted by the hidden state just before it
    return Rows(ids.to(device), cols.repeat(len(idx), 1).to(device), None, rmask.to(device), r,
                rows.to(device), k.to(device), rows.to(device), at.to(device),
                ids[rows, at + 1].to(device), int(real.sum()))


def shared_prompt_rows(batch: RolloutBatch, rows: list[torch.Tensor], device) -> Rows:
    """`rows` (each: samples of one prompt) as right-padded rows of the prompt once, then
    each answer, with the mask that keeps the answers apart, on `device`. The micro-batch's
    samples are the rows' samples in order (`torch.cat(rows)`)."""
    p = batch.prompt_width
    answer_len = batch.response_mask.sum(dim=1).long()
    r = max(1, max(int(answer_len[s]) for row in rows for s in row.tolist()))
    lines, segments, positions, token_at = [], [], [], []
    for row in rows:
        first = int(row[0])
        lp = int(batch.attention_mask[first, :p].sum())
        line, seg, pos = [batch.input_ids[first, p - lp : p]], [torch.zeros(lp, dtype=torch.long)], [torch.arange(lp)]
        offset = lp
        for j, s in enumerate(row.tolist(), start=1):
            n = int(answer_len[s])
            line.append(batch.input_ids[s, p : p + n])
            seg.append(torch.full((n,), j, dtype=torch.long))
            pos.append(torch.arange(lp, lp + n))
            # answer token 0 is predicted by the prompt's last position, token k by its k-1
            token_at.append(torch.cat([torch.tensor([lp - 1]), torch.arange(offset, offset + max(n - 1, 0))])[:n])
            offset += n
        lines.append(torch.cat(line))
        segments.append(torch.cat(seg))
        positions.append(torch.cat(pos))
    width = max(len(line) for line in lines)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    seg = torch.full((len(rows), width), -1, dtype=torch.long)  # -1: padding
    pos = torch.arange(width).repeat(len(rows), 1)
    for b, (line, sg, ps) in enumerate(zip(lines, segments, positions)):
        ids[b, : len(line)], seg[b, : len(line)], pos[b, : len(line)] = line, sg, ps
    samples = torch.cat(rows)
    rmask = batch.response_mask[samples, :r]
    sample, col = rmask.nonzero(as_tuple=True)
    row_of = torch.cat([torch.full((len(row),), b, dtype=torch.long) for b, row in enumerate(rows)])
    at = torch.cat(token_at)  # in the same order: sample by sample, token by token
    return Rows(ids.to(device), pos.to(device), _segment_mask(seg).to(device), rmask.to(device), r,
                sample.to(device), col.to(device), row_of[sample].to(device), at.to(device),
                _targets(batch, samples, sample, col).to(device), int((seg >= 0).sum()))


def packed_rows(batch: RolloutBatch, rows: list[torch.Tensor], device) -> Rows:
    """`rows` (each: samples laid back to back) as right-padded rows of one width, on `device`.

    Each sample's positions count from 0 and so does the padding at a row's end; with no
    attention mask, transformers reads a restart of the positions as the start of another
    sequence (masking_utils.find_packed_sequence_indices) and keeps the samples of a row
    apart: block-diagonal causal attention (varlen with flash attention, a block mask with
    flex attention, a dense mask with sdpa and eager). The micro-batch's samples are the
    rows' samples in order (`torch.cat(rows)`)."""
    p = batch.prompt_width
    samples = torch.cat(rows)
    prompt_len = batch.attention_mask[samples, :p].sum(dim=1)
    answer_len = batch.response_mask[samples].sum(dim=1).long()
    lengths = sample_lengths(batch)
    length = lengths[samples]
    width = max(int(lengths[r].sum()) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    start = torch.zeros(len(samples), dtype=torch.long)  # where each sample begins in its row
    row_of = torch.cat([torch.full((len(r),), b, dtype=torch.long) for b, r in enumerate(rows)])
    bounds = [0]
    k = 0
    for b, row in enumerate(rows):
        offset = 0
        for s in row.tolist():
            n, lp = int(length[k]), int(prompt_len[k])
            ids[b, offset : offset + n] = batch.input_ids[s, p - lp : p - lp + n]
            pos[b, offset : offset + n] = torch.arange(n)
            start[k] = offset
            offset += n
            bounds.append(b * width + offset)
            k += 1
        pos[b, offset:] = torch.arange(width - offset)  # the padding: a sequence of its own
        if offset < width:
            bounds.append((b + 1) * width)
    r = int(answer_len.max().clamp(min=1))
    rmask = batch.response_mask[samples, :r]
    sample, col = rmask.nonzero(as_tuple=True)
    at = start[sample] + prompt_len[sample] + col - 1  # the position just before the token
    segments = torch.tensor(bounds, dtype=torch.int32)
    return Rows(ids.to(device), pos.to(device), None, rmask.to(device), r, sample.to(device),
                col.to(device), row_of[sample].to(device), at.to(device),
                _targets(batch, samples, sample, col).to(device), int(length.sum()),
                segments.to(device), int((segments[1:] - segments[:-1]).max()))


def _targets(batch: RolloutBatch, samples: torch.Tensor, sample: torch.Tensor, col: torch.Tensor):
    """Answer token `col` of the micro-batch's sample `sample`, from the packed batch."""
    return batch.input_ids[samples[sample], batch.prompt_width + col]


def _segment_mask(seg: torch.Tensor) -> torch.Tensor:
    """[B, 1, W, W] True where query position q may look at key position k: k <= q, and k
    is the prompt (segment 0) or in q's own segment (its answer; padding sees padding)."""
    w = seg.shape[1]
    causal = torch.ones(w, w, dtype=torch.bool).tril()
    same = seg[:, :, None] == seg[:, None, :]
    prompt = (seg == 0)[:, None, :]
    return (causal & (same | prompt))[:, None]


# ---------------------------------------------------------------------- attention for packed rows
# Left to transformers, the restarts of a packed row's positions become a block-diagonal mask,
# and a mask costs sdpa its causal fast path: on an H100 the recipe's update alone was 5-30%
# slower than with a row per sample (BENCHMARKS.md). torch's `varlen_attn` (torch >= 2.10, a
# CUDA GPU) runs flash attention over each sample alone, from where the samples start and end
# in the flattened rows (`Rows.segments`), with no mask at all. `use_varlen_attention` makes it
# a model's attention (registered with transformers as `VARLEN`); a pass of packed rows hands
# it the samples' bounds (`varlen_kwargs`), and any other pass runs transformers' sdpa.
VARLEN = "labkit_varlen"


def varlen_available(device) -> bool:
    """Whether torch's varlen attention can run on `device` (a CUDA GPU, torch >= 2.10)."""
    if torch.device(device).type != "cuda":
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def use_varlen_attention(model) -> None:
    """Make torch's varlen kernel `model`'s attention for packed rows (sdpa for the rest)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, _no_mask)
    model.config._attn_implementation = VARLEN


def varlen_kwargs(model, rows) -> dict:
    """What a forward pass of `rows` hands the attention: the bounds of its samples in the
    flattened rows (transformers' names for them), where `model` attends with the varlen
    kernel and `rows` is packed; nothing otherwise."""
    if rows.segments is None or getattr(model.config, "_attn_implementation", None) != VARLEN:
        return {}
    return dict(cu_seq_lens_q=rows.segments, cu_seq_lens_k=rows.segments,
                max_length_q=rows.longest, max_length_k=rows.longest)


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """transformers' attention function for `VARLEN`: query [B, Hq, W, D], key and value
    [B, Hkv, W, D] -> ([B, W, Hq, D], None). Causal within each segment of `cu_seq_lens_q`
    (the flattened rows' sample bounds); without them, transformers' sdpa."""
    if cu_seq_lens_q is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    b, heads, w, d = query.shape
    q = query.transpose(1, 2).reshape(b * w, heads, d)
    k = key.transpose(1, 2).reshape(b * w, key.shape[1], d)
    v = value.transpose(1, 2).reshape(b * w, value.shape[1], d)
    if k.shape[1] != heads:  # grouped-query attention: head i reads key/value head i // group
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    if torch.is_autocast_enabled(q.device.type):  # a custom op: autocast does not cast for it
        dtype = torch.get_autocast_dtype(q.device.type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    scale = scaling if scaling is not None else d**-0.5
    out = causal_varlen(q, k, v, cu_seq_lens_q, int(max_length_q), scale)
    return out.reshape(b, w, heads, d), None


def causal_varlen(q, k, v, bounds: torch.Tensor, longest: int, scale: float) -> torch.Tensor:
    """Causal attention of each segment [bounds[i], bounds[i+1]) of q, k, v [T, H, D] alone:
    torch's varlen kernel, its causal flag by the name this torch gives it."""
    from torch.nn.attention.varlen import varlen_attn

    causal, takes_scale = _varlen_flags()
    extra = {"scale": scale} if takes_scale else {}
    if not takes_scale and abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise RuntimeError("this torch's varlen_attn takes no scale, and the model's is not 1/sqrt(d)")
    return varlen_attn(q, k, v, bounds, bounds, longest, longest, **causal, **extra)


@functools.cache
def _varlen_flags() -> tuple[dict, bool]:
    """How this torch's varlen_attn is asked for causal attention, and whether it takes a
    scale (its signature changed between releases); read once, not at every layer."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    return ({"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True},
            "scale" in params)


def _no_mask(*args, **kwargs):
    """The mask transformers builds for `VARLEN`: none (the kernel takes the samples' bounds,
    and a pass without them is causal)."""
    return None

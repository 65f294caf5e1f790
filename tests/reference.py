"""Attention in float64 NumPy, written from the formulas, independent of the C code.

Tensors are logical [batch, seq, heads, head_dim] arrays. Masks are aligned
bottom-right: query r, key c, diag = r + Nk - Nq, unless shift gives query r's
position relative to key 0 (chunks of a sharded sequence): diag = r + shift.
"""
import numpy as np


def mask(nq, nk, causal=False, window=None, shift=None):
    """True where a key is masked. window = (left, right), negative = unbounded."""
    r = np.arange(nq)[:, None]
    c = np.arange(nk)[None, :]
    diag = r + (nk - nq if shift is None else shift)
    masked = np.zeros((nq, nk), dtype=bool)
    if causal:
        masked |= c > diag
    if window is not None:
        left, right = window
        if right >= 0:
            masked |= c > diag + right
        if left >= 0:
            masked |= c < diag - left
    return masked


def max_logit(q, k, scale):
    """max |scale q.k| over all pairs of the same head group."""
    group = q.shape[2] // k.shape[2]
    return np.abs(np.einsum("bqhd,bkhd->bhqk", q, _expand(k, group))).max() * scale


def _expand(x, group):
    return np.repeat(x, group, axis=2)


def _probs(q, k, scale, causal, window, softcap, keys=None, shift=None):
    group = q.shape[2] // k.shape[2]
    x = np.einsum("bqhd,bkhd->bhqk", q, _expand(k, group)) * q.dtype.type(scale)
    t = None
    if softcap:
        t = np.tanh(x / softcap)
        x = softcap * t
    m = mask(q.shape[1], k.shape[1], causal, window, shift)
    if keys is not None:  # only keys [lo, hi) of the full key axis
        outside = np.ones(k.shape[1], dtype=bool)
        outside[keys[0]:keys[1]] = False
        m = m | outside[None, :]
    x = np.where(m, -np.inf, x)
    mx = x.max(axis=-1, keepdims=True)  # NaN where a score is
    # Non-finite scores: a NaN or +inf among a row's allowed ones makes it
    # NaN (a plain softmax's answer); -inf ones get weight 0, and a row with
    # only -inf (or no allowed key) is P = 0, LSE = -inf.
    poisoned = np.isnan(mx) | (mx == np.inf)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):  # inf / inf in poisoned rows
        e = np.exp(x - safe)
        total = e.sum(axis=-1, keepdims=True)
        p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    p = np.where(poisoned, np.nan, p)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(total[..., 0] > 0, safe[..., 0] + np.log(total[..., 0]), -np.inf)
    lse = np.where(poisoned[..., 0], np.nan, lse)
    return p, t, lse, x


def forward(q, k, v, scale, causal=False, window=None, softcap=0.0, precision=np.float64,
            round_p=None, keys=None, shift=None):
    """Returns O [B, Nq, Hq, d] and LSE [B, Hq, Nq], computed in `precision`.
    round_p (optional) rounds P before P V, as tensor cores take 16-bit P.
    keys = (lo, hi) attends to those keys only (one part of a split)."""
    q, k, v = (np.asarray(x, precision) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    p, _, lse, _ = _probs(q, k, scale, causal, window, softcap, keys, shift)
    if round_p is not None:
        p = round_p(p).astype(precision)
    o = np.einsum("bhqk,bkhd->bqhd", p, _expand(v, group))
    return o, lse


def _group_sum(x, heads_kv):
    b, n, hq, d = x.shape
    return x.reshape(b, n, heads_kv, hq // heads_kv, d).sum(axis=3)


def backward(q, k, v, dout, scale, causal=False, window=None, softcap=0.0,
             precision=np.float64, o=None, lse=None, magnitudes=False, round_p=None,
             shift=None):
    """Analytic gradients (dQ, dK, dV) of sum(O * dout), computed in `precision`.

    By default P is the softmax and D = rowsum(P * dP). Given the stored
    output o and lse, the computation is FlashAttention's instead:
    P = exp(S - LSE) and D = rowsum(dout * o), whose rounding differs where
    the gradient cancels. magnitudes=True also returns the gradients of the
    absolute values of the summed terms: the scale that rounding errors of a
    gradient are relative to, since dQ and dK can cancel to nearly zero.
    round_p (optional) rounds P and dS before they enter a matmul."""
    q, k, v, dout = (np.asarray(x, precision) for x in (q, k, v, dout))
    hkv = k.shape[2]
    group = q.shape[2] // hkv
    p, t, _, x = _probs(q, k, scale, causal, window, softcap, shift=shift)
    if lse is not None:  # recompute P from the stored LSE; empty rows stay 0
        lse = np.asarray(lse, precision)[..., None]
        p = np.exp(x - np.where(np.isfinite(lse), lse, np.inf))
    ke, ve = _expand(k, group), _expand(v, group)
    rounded = (lambda x: round_p(x).astype(precision)) if round_p is not None else (lambda x: x)
    dv = _group_sum(np.einsum("bhqk,bqhd->bkhd", rounded(p), dout), hkv)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, ve)
    if o is None:
        dsum = (p * dp).sum(axis=-1, keepdims=True)
    else:
        dsum = np.einsum("bqhd,bqhd->bhq", dout, np.asarray(o, precision))[..., None]
    ds = p * (dp - dsum)
    if softcap:
        ds = ds * (1.0 - t * t)
    dx = rounded(ds) * q.dtype.type(scale)
    dq = np.einsum("bhqk,bkhd->bqhd", dx, ke)
    dk = _group_sum(np.einsum("bhqk,bqhd->bkhd", dx, q), hkv)
    if not magnitudes:
        return dq, dk, dv
    # dP and D are dot products over the head dim: their rounding is relative
    # to the sums of |terms|, not to |dP| and |D|, which can cancel (Nk = 1
    # gives dP = D exactly, so dS = 0 and dQ, dK are pure rounding).
    dp_abs = np.einsum("bqhd,bkhd->bhqk", np.abs(dout), np.abs(ve))
    if o is None:
        dsum_abs = (np.abs(p) * dp_abs).sum(axis=-1, keepdims=True)
    else:
        dsum_abs = np.einsum("bqhd,bqhd->bhq", np.abs(dout), np.abs(o))[..., None]
    terms = np.abs(p) * (dp_abs + dsum_abs) * scale
    if softcap:
        terms = terms * (1.0 - t * t)
    mags = (np.einsum("bhqk,bkhd->bqhd", terms, np.abs(ke)),
            _group_sum(np.einsum("bhqk,bqhd->bkhd", terms, np.abs(q)), hkv),
            _group_sum(np.einsum("bhqk,bqhd->bkhd", p, np.abs(dout)), hkv))
    return (dq, dk, dv), mags



def combine(o_parts, lse_parts):
    """Merges partial results: per row LSE = log sum_i exp(LSE_i) and
    O = sum_i exp(LSE_i - LSE) O_i, parts with LSE_i = -inf skipped (their O
    unread); rows with no part left get O = 0, LSE = -inf; a part with
    LSE = NaN makes its row NaN. O parts [B, N, H, d], LSE parts [B, H, N]."""
    lse = np.stack([np.asarray(x, np.float64) for x in lse_parts])  # [P, B, H, N]
    mx = lse.max(axis=0)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    w = np.where(np.isneginf(lse), 0.0, np.exp(lse - safe))
    total = w.sum(axis=0)
    o = np.zeros(np.shape(o_parts[0]))
    for wi, oi in zip(w, o_parts):
        wr = wi.transpose(0, 2, 1)[..., None]  # [B, N, H, 1]
        o += np.where(wr > 0, wr * np.nan_to_num(np.asarray(oi, np.float64)), 0.0)
    t = total.transpose(0, 2, 1)[..., None]
    o = np.divide(o, t, out=np.zeros_like(o), where=t > 0)
    with np.errstate(divide="ignore"):
        out_lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    nan = np.isnan(lse).any(axis=0)  # [B, H, N]
    o = np.where(nan.transpose(0, 2, 1)[..., None], np.nan, o)
    return o, np.where(nan, np.nan, out_lse)

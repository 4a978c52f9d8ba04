"""Localization and diagnosis: where along each axis a failing component is wrong, and a likely cause.

A slice (one index, or one block of indices, along an axis) is *bad* when its excess error breaks
the component's global bounds: max(e_slice) > tol_max or rms(e_slice) > tol_rms. Since the global
rms is a mean of slice rms values, a component failing on rms has at least one bad slice.
"""

from __future__ import annotations

from typing import Any

import torch

from .spec import Axis

Tensor = torch.Tensor


def ranges(idx: list[int], limit: int = 12) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'. Past ``limit`` runs the rest is counted, not listed: the
    rows of a wrong confident-row gradient were ~400 runs, a screenful in the terminal."""
    if not idx:
        return "none"
    out, start, prev = [], idx[0], idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    if len(out) > limit:
        return ", ".join(out[:limit]) + f", ... ({len(idx)} in {len(out)} runs)"
    return ", ".join(out)


def block_size(axis: Axis, blocks: dict[str, int], params: dict) -> int:
    if axis.group_param is not None:
        return max(1, int(params.get(axis.group_param, 1)))
    if axis.block is not None:
        return max(1, int(blocks.get(axis.block, axis.default_block)))
    return max(1, axis.default_block)


def _per_slice(x: Tensor, dim: int, size: int, nslices: int, reduce: str) -> Tensor:
    """Reduce x over everything but ``dim``, grouped in blocks of ``size`` along ``dim``."""
    x = x.movedim(dim, 0).reshape(x.shape[dim], -1)
    pad = nslices * size - x.shape[0]
    if reduce == "max":
        x = torch.nn.functional.pad(x, (0, 0, 0, pad), value=float("-inf")) if pad else x
        return x.reshape(nslices, -1).amax(dim=1)
    if reduce == "sumsq":
        x = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
        return x.pow(2).reshape(nslices, -1).sum(dim=1)
    if reduce == "count":
        x = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
        return x.reshape(nslices, -1).sum(dim=1)
    raise ValueError(reduce)


def localize(
    e: Tensor,
    k: Tensor,
    o: Tensor,
    axes: tuple[Axis, ...],
    tol_max: float,
    tol_rms: float,
    blocks: dict[str, int],
    params: dict,
) -> dict[str, Any]:
    """Per-axis bad/zero/non-finite slices, the first bad index and the worst index, as data."""
    k = k.detach().to(torch.float64)
    o = o.detach().to(torch.float64)
    bad_el = (e > tol_max) | torch.isinf(e)
    out: dict[str, Any] = {"axes": []}
    if e.numel() == 0:
        return out
    if bad_el.any():
        out["first_bad"] = bad_el.nonzero()[0].tolist()
    finite_e = torch.where(torch.isinf(e), torch.full_like(e, float("inf")), e)
    out["worst"] = list(torch.unravel_index(finite_e.argmax(), e.shape)) if e.dim() else []
    out["worst"] = [int(i) for i in out["worst"]]
    e_fin = torch.where(torch.isfinite(e), e, torch.zeros_like(e))
    nonfin = ~torch.isfinite(e)
    kz = (k == 0) & (o != 0)
    onz = o != 0
    for ax in axes:
        if ax.dim >= e.dim():
            continue
        n = e.shape[ax.dim]
        size = block_size(ax, blocks, params)
        ns = -(-n // size)
        smax = _per_slice(e, ax.dim, size, ns, "max")
        counts = _per_slice(torch.ones_like(e_fin), ax.dim, size, ns, "count")
        srms = (_per_slice(e_fin, ax.dim, size, ns, "sumsq") / counts.clamp_min(1)).sqrt()
        bad = ((smax > tol_max) | (srms > tol_rms)).nonzero().flatten().tolist()
        nzero = _per_slice(kz.double(), ax.dim, size, ns, "count")
        nonz_o = _per_slice(onz.double(), ax.dim, size, ns, "count")
        zero = ((nzero == nonz_o) & (nonz_o > 0)).nonzero().flatten().tolist()
        nf = (_per_slice(nonfin.double(), ax.dim, size, ns, "count") > 0).nonzero().flatten().tolist()
        out["axes"].append(
            {
                "axis": ax.name,
                "block": size,
                "slices": ns,
                "extent": n,
                "bad": bad,
                "zero": zero,
                "nonfinite": nf,
                "slice_max": [round(float(v), 6) for v in smax[:64]],
            }
        )
    return out


def describe(loc: dict[str, Any]) -> str:
    """'head: 1-3 bad of 4 (0 ok); nD (blocks of 64): 0-4 bad of 6 (5 ok)'."""
    parts = []
    for a in loc.get("axes", []):
        if not a["bad"] or len(a["bad"]) == a["slices"] and a["slices"] == 1:
            continue
        unit = f" (blocks of {a['block']})" if a["block"] > 1 else ""
        ok = sorted(set(range(a["slices"])) - set(a["bad"]))
        s = f"{a['axis']}{unit}: {ranges(a['bad'])} bad of {a['slices']}"
        if ok:
            s += f" ({ranges(ok)} ok)"
        else:
            s += " (all)"
        if a["zero"]:
            s += f", zeros in {ranges(a['zero'])}"
        parts.append(s)
    if "first_bad" in loc:
        parts.append(f"first bad index {loc['first_bad']}")
    return "; ".join(parts)


def _last_block_is_full_enough(a: dict[str, Any]) -> bool:
    """At least half a block: a short tail that happens to be right says little about accumulation."""
    tail = a.get("extent", a["slices"] * a["block"]) - (a["slices"] - 1) * a["block"]
    return 2 * tail >= a["block"]


def diagnose(loc: dict[str, Any], res: Any) -> str:
    """A one-line likely cause from the pattern (heuristics, stated as such)."""
    if res.reason.startswith("all zeros"):
        return "never written: a missing store, or a store through another tensor's pointer"
    if res.reason.startswith("non-finite"):
        if res.nonfinite and res.zero_frac == 0:
            return (
                "NaN/Inf where the oracle is finite: elements never written (the harness poisons "
                "fresh allocations with NaN), an overflow, or a read past a mask"
            )
        return "NaN/Inf positions differ from the oracle's"
    hints = []
    for a in loc.get("axes", []):
        n, bad = a["slices"], set(a["bad"])
        if n < 2 or not bad:
            continue
        name = a["axis"]
        if bad == set(range(1, n)):
            if a["block"] > 1:
                hints.append(f"only the first {name} block is right: offsets of later blocks are wrong")
            else:
                hints.append(
                    f"only {name} 0 is right: a {name} stride is wrong (e.g. one tensor "
                    f"addressed with another tensor's {name} stride), or {name} > 0 never written"
                )
        elif bad == set(range(0, n - 1)) and _last_block_is_full_enough(a):
            hints.append(
                f"only the last {name} block is right: accumulation across {name} blocks lost "
                f"(each block overwrites the previous one)"
            )
        elif bad == {n - 1}:
            hints.append(f"only the last (partial) {name} block is wrong: a tail mask or bound")
        elif bad == {0} and n > 2:
            hints.append(f"only {name} 0 is wrong: results of other {name}s accumulated into slot 0?")
        if a["zero"] and set(a["zero"]) == bad:
            hints.append(f"{name} {ranges(sorted(bad))} never written")
    if res.cosine > 0.999 and res.rel_rms > 1e-3 and not hints:
        hints.append("right direction, wrong magnitude: a scale or normalizer (mean vs sum, a microbatch count) is off")
    if res.cosine < -0.99:
        hints.append("sign flipped")
    if not hints and res.verdict == "FAIL":
        if res.ratio_rms > 1 and res.ratio_max <= 1:
            hints.append(
                "diffuse error above the floor everywhere: low-precision accumulation or a slightly wrong formula"
            )
        elif abs(res.cosine) < 0.9:
            hints.append("uncorrelated with the oracle: a wrong formula or wrong operands")
    return "; ".join(dict.fromkeys(hints))


def matches(pattern: Any, bad: list[int], slices: int) -> bool:
    """Does the bad-slice list match an expectation pattern (used by the bug zoo)?"""
    want: set[int]
    if pattern == "all":
        want = set(range(slices))
    elif pattern == "all-but-last":
        want = set(range(slices - 1))
    elif pattern == "all-but-first":
        want = set(range(1, slices))
    elif pattern == "first":
        want = {0}
    elif pattern == "last":
        want = {slices - 1}
    elif pattern == "none":
        want = set()
    elif isinstance(pattern, str) and "-" in pattern:
        a, b = pattern.split("-")
        want = set(range(int(a), int(b) + 1))
    elif isinstance(pattern, (list, tuple)):
        want = {int(i) for i in pattern}
    else:
        raise ValueError(f"unknown localization pattern {pattern!r}")
    return set(bad) == want


def grid(
    e: Tensor, axes: tuple[Axis, ...], blocks: dict[str, int], params: dict, cap: int = 64
) -> dict[str, Any] | None:
    """Max error over slices of the two widest axes on different dimensions (for a heatmap)."""
    cand = [(ax, -(-e.shape[ax.dim] // block_size(ax, blocks, params))) for ax in axes if ax.dim < e.dim()]
    cand = [(ax, n) for ax, n in cand if n > 1]
    cand.sort(key=lambda x: -x[1])
    pick = []
    for ax, _n in cand:
        if all(ax.dim != p.dim for p in pick):
            pick.append(ax)
        if len(pick) == 2:
            break
    if not pick:
        return None
    if len(pick) == 1:  # a strip along the one axis that has several slices
        pick.insert(0, next((ax for ax in axes if ax.dim < e.dim() and ax.dim != pick[0].dim), None) or pick[0])
        if pick[0] is pick[1]:
            return None
    a, b = sorted(pick, key=lambda ax: ax.dim)
    x = torch.where(torch.isfinite(e), e, torch.full_like(e, float("inf")))
    x = x.movedim((a.dim, b.dim), (0, 1)).reshape(e.shape[a.dim], e.shape[b.dim], -1).amax(-1)
    sizes = []
    for i, ax in enumerate((a, b)):
        size = block_size(ax, blocks, params)
        n = x.shape[i]
        while -(-n // size) > cap:
            size *= 2
        sizes.append(size)
    na, nb = -(-x.shape[0] // sizes[0]), -(-x.shape[1] // sizes[1])
    x = torch.nn.functional.pad(x, (0, nb * sizes[1] - x.shape[1], 0, na * sizes[0] - x.shape[0]), value=0.0)
    x = x.reshape(na, sizes[0], nb, sizes[1]).amax(dim=(1, 3))
    return {"axes": [a.name, b.name], "block": sizes, "values": [[float(v) for v in row] for row in x.tolist()]}

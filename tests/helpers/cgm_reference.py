"""A deliberately plain, independent implementation of docs/semantics.md sections 3-4.

Lists of Python tuples, no numpy, no shared code with smerge: the oracle for the engine.
"""

from __future__ import annotations


def tol_cmp(x, y, eps):
    for xj, yj, e in zip(x, y, eps):
        if xj < yj - e:
            return -1
        if xj > yj + e:
            return 1
    return 0


def sweep(wa, wb, eps):
    """wa, wb: sorted lists of (key, row). Returns (pairs as index pairs, i, j)."""
    i = j = 0
    out = []
    while i < len(wa) and j < len(wb):
        c = tol_cmp(wa[i][0], wb[j][0], eps)
        if c < 0:
            i += 1
        elif c > 0:
            j += 1
        else:
            out.append((i, j))
            ka, kb = wa[i][0], wb[j][0]
            i += 1
            while i < len(wa) and tol_cmp(wa[i][0], ka, eps) == 0:
                i += 1
            j += 1
            while j < len(wb) and tol_cmp(wb[j][0], kb, eps) == 0:
                j += 1
    return out, i, j


def cgm_reference(keys_a, keys_b, n, ka, kb, eps, k_schedule=None):
    """Returns (pairs [(a_row, b_row)], unmatched_a rows, unmatched_b rows, passes [(m, retired_a)]).

    ``k_schedule`` (adaptive K, docs/semantics.md section 10): the (K_A, K_B) of each report window in turn
    (a window closes once >= n records of A were retired in it); the last one holds after the
    list ends. Without it, every pass uses ``ka``, ``kb``.
    """
    window, retired_in_window = 0, 0
    A = [(tuple(k), r) for r, k in enumerate(keys_a)]
    B = [(tuple(k), r) for r, k in enumerate(keys_b)]
    pa = pb = 0
    wa, wb = [], []
    pairs, ua, ub, passes = [], [], [], []
    while True:
        while len(wa) < n and pa < len(A):
            wa.append(A[pa]); pa += 1
        while len(wb) < n and pb < len(B):
            wb.append(B[pb]); pb += 1
        if not wa or not wb:
            break
        wa.sort(key=lambda r: (r[0], r[1]))
        wb.sort(key=lambda r: (r[0], r[1]))
        found, i, j = sweep(wa, wb, eps)
        m = len(found)
        pairs += [(wa[x][1], wb[y][1]) for x, y in found]
        ma = {x for x, _ in found}
        mb = {y for _, y in found}
        a_behind, b_behind = i >= len(wa), j >= len(wb)
        wa = [r for t, r in enumerate(wa) if t not in ma]
        wb = [r for t, r in enumerate(wb) if t not in mb]
        if k_schedule:
            ka, kb = k_schedule[min(window, len(k_schedule) - 1)]
        ea = max(0, ka - m) if a_behind else 0
        eb = max(0, kb - m) if b_behind else 0
        ua += [r[1] for r in wa[:ea]]
        ub += [r[1] for r in wb[:eb]]
        passes.append((m, m + len(wa[:ea])))  # pairs, A records retired
        retired_in_window += passes[-1][1]
        if retired_in_window >= n:
            window, retired_in_window = window + 1, 0
        wa, wb = wa[ea:], wb[eb:]
    ua += [r[1] for r in wa] + [r[1] for r in A[pa:]]
    ub += [r[1] for r in wb] + [r[1] for r in B[pb:]]
    return pairs, ua, ub, passes


def kappa_max_reference(keys_a, keys_b, eps):
    """Pairs of the unbounded-window merge: repeat the sweep over whole sorted streams until dry."""
    wa = sorted(((tuple(k), r) for r, k in enumerate(keys_a)), key=lambda r: (r[0], r[1]))
    wb = sorted(((tuple(k), r) for r, k in enumerate(keys_b)), key=lambda r: (r[0], r[1]))
    total = 0
    while wa and wb:
        found, _, _ = sweep(wa, wb, eps)
        if not found:
            break
        total += len(found)
        ma = {x for x, _ in found}
        mb = {y for _, y in found}
        wa = [r for t, r in enumerate(wa) if t not in ma]
        wb = [r for t, r in enumerate(wb) if t not in mb]
    return total

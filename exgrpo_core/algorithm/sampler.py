"""On-policy question order: seeded passes (epochs) over the training set, resumable.

(code) retired questions are dropped at the next pass while enough questions remain (docs/implementation_details.md).
Unlike the authors' code, a batch draws exactly the (1 - rho) B fresh questions it needs and
wastes none (their loader draws B and discards the first rho B slots, paper §E.6).
"""

from __future__ import annotations

import random


class FreshSampler:
    """Hands out fresh question uids in a seeded order, one pass after another."""

    def __init__(self, uids: list[str], seed: int):
        if not uids:
            raise ValueError("the training set is empty: no questions to sample")
        self.uids = list(uids)
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self.order = self._permutation(self.uids)

    def _permutation(self, uids: list[str]) -> list[str]:
        order = list(uids)
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next(self, n: int, *, exclude: set[str], retired: set[str], skip_retired: bool,
             min_remaining: int) -> list[str]:
        """The next n uids not in `exclude` (the batch's experiential questions)."""
        out: list[str] = []
        guard = 0
        while len(out) < n:
            if self.pos >= len(self.order):
                self._new_epoch(retired if skip_retired else set(), min_remaining)
            uid = self.order[self.pos]
            self.pos += 1
            if uid not in exclude and uid not in out:
                out.append(uid)
            guard += 1
            if guard > 4 * (len(self.uids) + n):
                break  # fewer distinct usable questions than n: return what there is
        return out

    def _new_epoch(self, retired: set[str], min_remaining: int) -> None:
        self.epoch += 1
        pool = [u for u in self.uids if u not in retired]
        if len(pool) < max(min_remaining, 1):
            pool = self.uids  # too few unretired questions left: keep sampling everything
        self.order = self._permutation(pool)
        self.pos = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "order": list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos, self.order = state["epoch"], state["pos"], list(state["order"])

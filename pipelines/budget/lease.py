"""``Lease``: keeps a launch's lease on its attempt alive in the
background and tells the launch when another one took the attempt over."""

from __future__ import annotations

import threading
from typing import Optional

from dpsynth.pipelines.budget.record import AttemptLost, Reservation
from dpsynth.pipelines.budget.store import renew


class Lease:
    """Keeps the owner's lease alive while a launch works on its attempt.

    A daemon thread renews it every ``lease_seconds / 4``. Should the
    attempt be taken over (this launch's renewals failed for a whole lease),
    ``check()`` raises ``AttemptLost``; the store refuses that launch's
    status changes in any case.
    """

    def __init__(self, reservation: Optional[Reservation]) -> None:
        self.reservation = reservation
        self._stop = threading.Event()
        self._lost: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="dpsynth-lease")

    def __enter__(self) -> "Lease":
        if self.reservation is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        every = self.reservation.lease_seconds / 4
        while not self._stop.wait(every):
            try:
                renew(self.reservation)
            except AttemptLost as err:
                self._lost = err
                return
            except Exception:  # a transient store error: try again later
                continue

    def check(self) -> None:
        if self._lost is not None:
            raise AttemptLost(str(self._lost))

    def verify(self) -> None:
        """At a pass boundary: asks the store now (renewing the lease) and
        raises ``AttemptLost`` if another launch took the attempt over, so
        that an owner resumed after its lease ran out (SIGSTOP, a long GC
        pause) stops instead of running the rest of the pipeline. A
        transient store error is left to the background renewals."""
        if self.reservation is None:
            return
        self.check()
        try:
            renew(self.reservation)
        except AttemptLost as err:
            self._lost = err
            raise
        except Exception:  # the store is unreachable for a moment
            return

    @property
    def lost(self) -> Optional[AttemptLost]:
        """The takeover this launch noticed, if any."""
        return None if self._lost is None else AttemptLost(str(self._lost))
